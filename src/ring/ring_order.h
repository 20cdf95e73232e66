// How a ring call keeps the device work on its buffers and the transfers of those buffers apart.
//
// On the host (every backend that computes on the host, and UCX, which moves bytes from the
// host): before handing buffers to the transport the engine waits until the work queued on
// them is done (Backend::FenceBuffers), and it waits for a transfer before queuing the work that
// reads what it brought (Transport::Wait). On an asynchronous device each such wait empties the
// device's queue: at every ring step the device idles while the host wakes up, posts the next
// transfer and launches the next kernels, which at short steps (small blocks, a plan's later
// steps) is a large part of the step.
//
// On the device (a CUDA backend with the NCCL transport, or in a local group, whose copies the
// CUDA module queues on streams): the transfers wait for an event of the
// compute stream (Backend::MarkBuffers, Transport::OrderAfter), and the compute stream waits for
// the transfers it reads (Transport::DeviceWait), so the host queues step s + 1 while the device
// runs step s. The host still waits for every transfer, for its timeout and its faults, one step
// later (Retire). STRIA_RING_ORDER=host keeps the host's order on such a pair too, to compare
// (`device`, or unset: the default).
#pragma once

#include <string>
#include <vector>

#include "backend/backend.h"
#include "transport/transport.h"

namespace stria {

// STRIA_RING_ORDER unset, empty, "device" or "host" (any case); anything else is refused at context
// creation, naming the variable, rather than quietly taken for the default.
Status CheckRingOrderSwitch();

class RingOrder {
 public:
  // A training call's ring: its work goes to the backend's compute stream (ComputeStream, which a
  // plan's call moves to a stream of its own at the local block), fenced by FenceBuffers.
  RingOrder(Backend& backend, Transport& transport, double timeout_s);
  // A serving call's: its work goes to `stream`, the caller's, fenced by SyncStream.
  RingOrder(Backend& backend, Transport& transport, double timeout_s, void* stream);
  bool on_device() const { return on_device_; }

  // Before the engine hands buffers that work queued so far reads or writes to the transport.
  Status BeforePosting();
  // The work queued from now on may read what `req` received or reuse the buffer it sent from.
  // On the host: waits for it now. On the device: the compute stream waits for it, and the host
  // waits at the first Retire of a later step.
  Status Arrived(RequestId req, const std::string& what);
  // Starts ring step `step`; Retire then waits on the host for what Arrived at earlier steps (the
  // device has the step's work queued meanwhile), and Finish for everything.
  void Step(int step) { step_ = step; }
  Status Retire();
  Status Finish();
  // The transfers `earlier` defers come before this order's: each of this order's host waits
  // first waits for all of them (a grid's exchange before the ring that reads what it brought),
  // so that a transfer that never comes is named rather than one queued behind it on the device.
  void After(RingOrder* earlier) { earlier_ = earlier; }

 private:
  struct Deferred {
    RequestId req;
    int step;
    std::string what;
  };
  Status WaitDeferred(int before_step);

  void* Stream() { return own_stream_ ? stream_ : backend_.ComputeStream(); }

  Backend& backend_;
  Transport& transport_;
  double timeout_s_;
  bool on_device_;
  bool own_stream_ = false;
  void* stream_ = nullptr;
  int step_ = 0;
  std::vector<Deferred> deferred_;
  RingOrder* earlier_ = nullptr;
};

}  // namespace stria
