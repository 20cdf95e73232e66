#include "ring/ring_order.h"

#include <strings.h>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace stria {
namespace {

bool HostOrderAsked() {
  const char* env = std::getenv("STRIA_RING_ORDER");
  return env != nullptr && strcasecmp(env, "host") == 0;
}

}  // namespace

Status CheckRingOrderSwitch() {
  const char* env = std::getenv("STRIA_RING_ORDER");
  if (env == nullptr || *env == '\0' || strcasecmp(env, "device") == 0 || strcasecmp(env, "host") == 0)
    return Status::Ok();
  return Error(STRIA_ERROR_INVALID_ARGUMENT,
               "STRIA_RING_ORDER=\"%.64s\" is not one of device, host: use one, or leave it unset", env);
}

RingOrder::RingOrder(Backend& backend, Transport& transport, double timeout_s)
    : backend_(backend),
      transport_(transport),
      timeout_s_(timeout_s),
      on_device_(backend.OrdersOnDevice() && transport.OrdersOnDevice() && !HostOrderAsked()) {}

RingOrder::RingOrder(Backend& backend, Transport& transport, double timeout_s, void* stream)
    : RingOrder(backend, transport, timeout_s) {
  own_stream_ = true;
  stream_ = stream;
}

Status RingOrder::BeforePosting() {
  if (!on_device_) return own_stream_ ? backend_.SyncStream(stream_) : backend_.FenceBuffers();
  void* event = nullptr;
  STRIA_RETURN_IF_ERROR(backend_.MarkBuffers(Stream(), &event));
  return transport_.OrderAfter(event);
}

Status RingOrder::Arrived(RequestId req, const std::string& what) {
  if (!on_device_) return transport_.Wait(req, timeout_s_, what.c_str());
  STRIA_RETURN_IF_ERROR(transport_.DeviceWait(req, Stream(), timeout_s_, what.c_str()));
  deferred_.push_back(Deferred{req, step_, what});
  return Status::Ok();
}

Status RingOrder::Retire() {
  return WaitDeferred(step_);
}

Status RingOrder::Finish() {
  return WaitDeferred(std::numeric_limits<int>::max());
}

// In the order they arrived: a request's wait names the earliest transfer that did not come.
Status RingOrder::WaitDeferred(int before_step) {
  if (earlier_ != nullptr) STRIA_RETURN_IF_ERROR(earlier_->Finish());
  size_t done = 0;
  Status st;
  for (; done < deferred_.size() && deferred_[done].step < before_step; ++done) {
    st = transport_.Wait(deferred_[done].req, timeout_s_, deferred_[done].what.c_str());
    if (!st.ok()) break;
  }
  deferred_.erase(deferred_.begin(), deferred_.begin() + static_cast<std::ptrdiff_t>(done));
  return st;
}

}  // namespace stria
