// The transport interface the ring is written against: nonblocking point-to-point messages
// between ring neighbours plus a small all-gather for the per-call signature. Implementations:
// the in-process local group (local_transport.cc) and runtime-loaded modules (UCX, NCCL).
//
// Every wait takes a timeout and may fail with STRIA_ERROR_TIMEOUT (naming the peer it waited
// for), STRIA_ERROR_ABORTED (this rank was aborted) or STRIA_ERROR_TRANSPORT (a peer left or the
// wire broke). Buffers handed to Isend/Irecv must stay valid until the request completes or
// CancelAll returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"

namespace stria {

using RequestId = int64_t;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;

  // Every rank contributes `bytes` bytes; `all` receives world_size() records, rank-ordered.
  // `what` names the operation in timeout messages.
  virtual Status AllGather(const void* mine, void* all, size_t bytes, double timeout_s, const char* what) = 0;
  // Every rank's `bytes` at all + rank * bytes of a buffer that messages may read and write (a ring
  // buffer: a device's memory on a device backend) to the same place of every other rank's, in
  // place. `tag` is the call's own, as a ring step's (each pair of ranks exchanges one message
  // each way under it). The default posts the N - 1 receives and sends, pair t from rank r - t and
  // to rank r + t, in the same order on every rank, and waits for them all; a transport with a
  // collective on such memory (NCCL's ncclAllGather) runs that instead.
  virtual Status AllGatherInPlace(void* all, size_t bytes, int64_t tag, double timeout_s, const char* what);
  virtual Status Isend(int peer, int64_t tag, const void* buf, size_t bytes, RequestId* req) = 0;
  virtual Status Irecv(int peer, int64_t tag, void* buf, size_t bytes, RequestId* req) = 0;
  virtual Status Wait(RequestId req, double timeout_s, const char* what) = 0;
  // Withdraws every request of this rank still outstanding and returns once no transfer touches
  // this rank's buffers any more (used after an error, before the buffers are reused or freed).
  virtual void CancelAll() = 0;
  // Device ordering, for a transport whose transfers run on device streams (NCCL). Without it
  // the engine keeps a ring buffer's device work and its transfers apart on the host: it waits
  // for its compute before posting a transfer (Backend::FenceBuffers) and for the transfer
  // before queuing the compute that reads it (Wait). With it the device keeps them apart, and the
  // host queues a step while the device runs the one before:
  // - OrderAfter(event): the transfers launched from now on start, on the device, only after the
  //   work that `event` (a cudaEvent_t just recorded on the device's compute stream) marks;
  // - DeviceWait(req, stream, timeout_s, what): the work queued on `stream` (a cudaStream_t of
  //   this rank's device) from now on starts only once the transfer of `req` is over, launching it
  //   if it is held back (a transport that needs the peer's half to launch waits for it, up to
  //   timeout_s, naming `what`). The request stays this rank's: the engine still Waits for it on
  //   the host (for its timeout and its faults), only later.
  virtual bool OrdersOnDevice() const { return false; }
  virtual Status OrderAfter(void* event) {
    (void)event;
    return Status(STRIA_ERROR_INTERNAL, "this transport does not order transfers on a device");
  }
  virtual Status DeviceWait(RequestId req, void* stream, double timeout_s, const char* what) {
    (void)req, (void)stream, (void)timeout_s, (void)what;
    return Status(STRIA_ERROR_INTERNAL, "this transport does not order transfers on a device");
  }
  // AllGatherInPlace's exchange posted (after OrderAfter's event, like a transfer) without waiting
  // for it: its requests, for DeviceWait and Wait. The default posts AllGatherInPlace's pairs; a
  // transport with a collective on such memory (NCCL) returns that one's completion.
  virtual Status AllGatherInPlaceOnDevice(void* all, size_t bytes, int64_t tag, std::vector<RequestId>* reqs);
  // Thread-safe: makes current and future waits of this rank fail with STRIA_ERROR_ABORTED and
  // tells the peers that this rank has left.
  virtual void Abort() = 0;
  // Abort, when this rank leaves because its own call failed (a timeout, say) rather than by the
  // caller's abort or destroy. Peers waiting in the same agreement then keep to their own deadline
  // (they are most likely waiting for the same missing rank, and their own timeout names it)
  // instead of failing at once because this rank left.
  virtual void LeaveAfterError() { Abort(); }
};

inline Status Transport::AllGatherInPlaceOnDevice(void* all, size_t bytes, int64_t tag, std::vector<RequestId>* reqs) {
  const int n = world_size(), r = rank();
  char* base = static_cast<char*>(all);
  reqs->clear();
  for (int t = 1; t < n; ++t) {
    const int from = (r - t + n) % n, to = (r + t) % n;
    RequestId id = 0;
    STRIA_RETURN_IF_ERROR(Irecv(from, tag, base + static_cast<size_t>(from) * bytes, bytes, &id));
    reqs->push_back(id);
    STRIA_RETURN_IF_ERROR(Isend(to, tag, base + static_cast<size_t>(r) * bytes, bytes, &id));
    reqs->push_back(id);
  }
  return Status::Ok();
}

inline Status Transport::AllGatherInPlace(void* all, size_t bytes, int64_t tag, double timeout_s, const char* what) {
  std::vector<RequestId> requests;
  Status st = Transport::AllGatherInPlaceOnDevice(all, bytes, tag, &requests);
  for (RequestId id : requests) {
    if (!st.ok()) break;
    st = Wait(id, timeout_s, what);
  }
  return st;
}

// Moves the bytes of a matched message between two ring buffers of a local group. The CUDA module
// supplies one for device memory (a copy on its own stream); host memory needs none (memcpy).
// Called from the group's copy threads, concurrently for different receiving ranks.
class BufferCopier {
 public:
  virtual ~BufferCopier() = default;
  // Copies and returns once the bytes are there (the group's order on the host).
  virtual Status Copy(int dst_rank, void* dst, const void* src, size_t bytes) = 0;

  // Device ordering (Transport::OrdersOnDevice for a local group on GPUs): the copy is queued on
  // the device behind two markers and completes there, its completion an event. Markers and
  // completions are the copier's events (void*), each released once by Release.
  virtual bool OrdersOnDevice() const { return false; }
  // A marker that completes with the work `event` (a cudaEvent_t of rank `rank`'s device, just
  // recorded) marks now, whatever is recorded on `event` later.
  virtual Status Mark(int rank, void* event, void** marker) {
    (void)rank, (void)event;
    *marker = nullptr;
    return Status(STRIA_ERROR_INTERNAL, "this copier does not order copies on a device");
  }
  // Queues the copy into rank dst_rank's buffer after both markers (null: none) and returns its
  // completion in *done.
  virtual Status CopyAfter(int dst_rank, void* dst, const void* src, size_t bytes, void* after_send,
                           void* after_receive, void** done) {
    (void)dst_rank, (void)dst, (void)src, (void)bytes, (void)after_send, (void)after_receive;
    *done = nullptr;
    return Status(STRIA_ERROR_INTERNAL, "this copier does not order copies on a device");
  }
  // `stream` (a cudaStream_t) goes on only after `done`.
  virtual Status StreamWait(void* stream, void* done) {
    (void)stream, (void)done;
    return Status(STRIA_ERROR_INTERNAL, "this copier does not order copies on a device");
  }
  // Whether `done` has completed (a failed copy is an error); Finish blocks until it has.
  virtual Status Poll(void* done, bool* complete) {
    (void)done;
    *complete = true;
    return Status::Ok();
  }
  virtual void Finish(void* done) { (void)done; }
  virtual void Release(void* event) { (void)event; }
};

// N transports joined in this process. Transfers are done by a copy thread per receiving rank,
// so they overlap with the compute of both sender and receiver.
std::vector<std::unique_ptr<Transport>> CreateLocalGroup(int world_size,
                                                         std::shared_ptr<BufferCopier> copier = nullptr);

}  // namespace stria
