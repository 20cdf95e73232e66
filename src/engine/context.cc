#include "engine/context.h"

namespace stria {

Context::Context(int rank, int world_size, DLDevice device, double timeout_s, std::unique_ptr<Backend> backend,
                 std::unique_ptr<Transport> transport)
    : rank_(rank),
      world_size_(world_size),
      device_(device),
      timeout_s_(timeout_s),
      backend_(std::move(backend)),
      transport_(std::move(transport)) {
  backend_->SetCancelFlag(&aborted_);
}

Context::~Context() {
  // The transport first: it waits until no transfer touches our buffers, then they can go.
  transport_.reset();
  for (Buffer& b : buffers_) backend_->Free(b.ptr);
}

Status Context::BeginCall(const char* what) {
  const char* none = nullptr;
  if (running_.compare_exchange_strong(none, what, std::memory_order_acquire)) return Status::Ok();
  return Error(STRIA_ERROR_INVALID_ARGUMENT,
               "rank %d's context is in %s on another thread: a context is driven by one thread at a time "
               "(%s was refused; it changed nothing)",
               rank_, none != nullptr ? none : "a call", what);
}

void Context::EndCall() {
  running_.store(nullptr, std::memory_order_release);
}

Status Context::Usable() const {
  if (aborted_.load())
    return Error(STRIA_ERROR_ABORTED, "rank %d was aborted (stria_context_abort); it can only be destroyed", rank_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!poison_.ok())
    return Status(poison_.code(), "this context failed earlier and can only be destroyed: " + poison_.message());
  return Status::Ok();
}

Status Context::Fail(Status why) {
  // Leave the group as well: a peer that calls later must fail at once ("rank r left"), not
  // match our stale signature and wait out its timeout for blocks we will never send.
  transport_->LeaveAfterError();
  transport_->CancelAll();
  if (aborted_.load() && why.code() != STRIA_ERROR_ABORTED)
    why = Error(STRIA_ERROR_ABORTED, "rank %d was aborted (stria_context_abort) during the call: %s", rank_,
                why.message().c_str());
  std::lock_guard<std::mutex> lock(mu_);
  if (poison_.ok()) poison_ = why;
  return why;
}

Status Context::CheckNotAborted() const {
  if (aborted_.load())
    return Error(STRIA_ERROR_ABORTED, "rank %d was aborted (stria_context_abort) during the call", rank_);
  return Status::Ok();
}

void Context::Abort() {
  aborted_.store(true);
  transport_->Abort();
}

Status Context::RingBuffer(int index, size_t bytes, void** out) {
  if (buffers_.size() <= static_cast<size_t>(index)) buffers_.resize(static_cast<size_t>(index) + 1);
  Buffer& b = buffers_[static_cast<size_t>(index)];
  if (b.bytes < bytes) {
    backend_->Free(b.ptr);
    b = Buffer();
    STRIA_RETURN_IF_ERROR(backend_->Allocate(bytes, &b.ptr));
    b.bytes = bytes;
  }
  *out = b.ptr;
  return Status::Ok();
}

}  // namespace stria
