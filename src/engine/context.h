// A rank's context: its backend, its transport, the ring buffers reused across calls, and its
// health. After a failure in the middle of a ring (timeout, abort, a peer gone) the ranks no
// longer agree on where they are, so the context is poisoned: every later call fails with the
// original reason and only destroy (or abort) remains.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "transport/transport.h"

namespace stria {

constexpr double kDefaultTimeoutS = 300.0;

struct StepTime {
  double compute_s = 0, compute_cpu_s = 0, wait_s = 0;
};
// What a rank's last call sent over its transport (stria_context_get_traffic).
struct Traffic {
  uint64_t kv_bytes = 0, dkv_bytes = 0, messages = 0;
  uint64_t all_to_all_bytes = 0;  // a grid's all-to-all within its group (sent to the other members)
};

class Context {
 public:
  Context(int rank, int world_size, DLDevice device, double timeout_s, std::unique_ptr<Backend> backend,
          std::unique_ptr<Transport> transport);
  ~Context();

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // The hybrid grid (DESIGN.md, "Hybrid grid"; stria_context_set_grid): N = U x R, rank
  // r = g·U + u in all-to-all group g (U consecutive ranks) at position u. U = 1: the plain ring.
  int ulysses_size() const { return ulysses_; }
  int ring_size() const { return world_size_ / ulysses_; }
  int ring_rank() const { return rank_ / ulysses_; }   // g
  int group_rank() const { return rank_ % ulysses_; }  // u
  // Between calls, under the call guard (the caller checks world_size % u == 0).
  void SetUlyssesSize(int u) { ulysses_ = u; }
  DLDevice device() const { return device_; }
  double timeout_s() const { return timeout_s_; }
  Backend& backend() { return *backend_; }
  Transport& transport() { return *transport_; }
  uint64_t NextCallSeq() { return ++call_seq_; }
  // The caller's tag of the next call (stria_context_set_call_tag): part of its signature, and
  // taken by it, so that it names one call only.
  void SetCallTag(uint64_t tag) { call_tag_ = tag; }
  uint64_t TakeCallTag() { return std::exchange(call_tag_, 0); }

  // OK, or why this context can no longer run collectives.
  Status Usable() const;
  // Called after a failure inside a collective: withdraws outstanding transfers, and poisons the
  // context unless the failure left the ring consistent.
  Status Fail(Status why);
  void Abort();  // any thread
  // Between the steps of a call: ABORTED if stria_context_abort came during it. The backend may
  // have stopped computing early then, so the call must fail (through Fail) whatever else
  // happened.
  Status CheckNotAborted() const;

  // One call at a time: a context is driven by one thread at a time (DESIGN.md), and a second
  // thread's call while one runs would race on the ring buffers, the call sequence and the
  // transport's message order. BeginCall refuses it with a message naming the running call;
  // EndCall ends a call that BeginCall admitted. CallScope pairs them.
  Status BeginCall(const char* what);
  void EndCall();

  // A ring buffer of at least `bytes`, slot `index`; reused across calls.
  Status RingBuffer(int index, size_t bytes, void** out);

  std::vector<StepTime>& step_times() { return step_times_; }
  Traffic& traffic() { return traffic_; }

 private:
  const int rank_, world_size_;
  const DLDevice device_;
  const double timeout_s_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Transport> transport_;
  int ulysses_ = 1;
  uint64_t call_seq_ = 0;
  uint64_t call_tag_ = 0;
  std::atomic<bool> aborted_{false};
  std::atomic<const char*> running_{nullptr};  // the call in progress (a string literal), if any
  mutable std::mutex mu_;                      // guards poison_
  Status poison_;
  struct Buffer {
    void* ptr = nullptr;
    size_t bytes = 0;
  };
  std::vector<Buffer> buffers_;
  std::vector<StepTime> step_times_;
  Traffic traffic_;
};

// Admits a call on a context for the scope's lifetime; status() says why not.
class CallScope {
 public:
  CallScope(Context& c, const char* what) : c_(c), status_(c.BeginCall(what)) {}
  ~CallScope() {
    if (status_.ok()) c_.EndCall();
  }
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  const Status& status() const { return status_; }

 private:
  Context& c_;
  Status status_;
};

}  // namespace stria
