// Pieces shared by the forward and backward schedules.
#pragma once

#include <algorithm>
#include <chrono>

#include "engine/context.h"
#include "ring/arguments.h"

namespace stria {

class RingOrder;  // ring_order.h

// kPartial: a prefill's partial results going home, a decode's records gathered on the device
// (their step is never 0: a transport's own all-gather may tag its messages as kind 3 at step 0,
// the UCX one does); kGrid: a grid's all-to-all within its group, its phase in the step field (the
// kind takes two bits of the tag).
enum class MessageKind : int64_t { kGrid = 0, kKV = 1, kDKV = 2, kPartial = 3 };

// Tags are unique per (call, lane, step, kind), so a late message of one call can never be taken
// for a message of the next. A lane is one of the rings a call runs one after another (a grid's
// head chunks, ValidatedCall::lane): up to 64 of them, of steps below 65536.
inline int64_t RingTag(uint64_t seq, int64_t step, MessageKind kind, int lane = 0) {
  const uint64_t field = (static_cast<uint64_t>(lane) << 16) | static_cast<uint64_t>(step);
  return static_cast<int64_t>((seq << 24) | (field << 2) | static_cast<uint64_t>(kind));
}

inline double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Measures a step: the wall and CPU time of the compute, then the time blocked on transfers.
class StepTimer {
 public:
  explicit StepTimer(Backend& backend) : backend_(backend) {}
  void ComputeBegin() {
    t0_ = Seconds();
    c0_ = backend_.cpu_seconds();
  }
  void ComputeEnd() {
    t_.compute_s = Seconds() - t0_;
    t_.compute_cpu_s = (backend_.cpu_seconds() - c0_) / backend_.num_threads();
    t1_ = Seconds();
  }
  StepTime Finish() {
    t_.wait_s = Seconds() - t1_;
    return t_;
  }

 private:
  Backend& backend_;
  StepTime t_;
  double t0_ = 0, c0_ = 0, t1_ = 0;
};

// The ring a call runs on: the whole world on a plain context, or on a grid (N = U x R) the R
// ranks that share this rank's place u in their all-to-all groups. Ring ranks are numbered
// 0..n-1; ring rank i is transport rank i·stride + offset.
struct RingGroup {
  int n = 1, r = 0;
  int stride = 1, offset = 0;
  int Peer(int i) const { return i * stride + offset; }
  int Next() const { return Peer((r + 1) % n); }
  int Prev() const { return Peer((r - 1 + n) % n); }
  static RingGroup Of(const Context& ctx) {
    return RingGroup{ctx.ring_size(), ctx.ring_rank(), ctx.ulysses_size(), ctx.group_rank()};
  }
};

// A forward's ring buffers, got before the agreement (ForwardWorkspace), and the ring's steps
// after it and after the backend's ForwardBegin (ForwardSteps, which ends with ForwardEnd and the
// sinks). RingForward runs both on the whole world; a grid's call (grid.cc) between its
// all-to-alls, on its ring of R.
struct ForwardBuffers {
  size_t kv_bytes = 0;
  void* kv[2] = {nullptr, nullptr};
  void* stage[2] = {nullptr, nullptr};  // trimmed K/V messages: [0] outgoing, [1] incoming
  // A plan's home part (HomeBeginOf): the local block in a buffer of its own, which the ring never
  // receives into; nullptr without one, and the local block is kv[0] as ever.
  int64_t home_begin = -1;
  void* local = nullptr;
  // The K/V block the rank holds at `step`, and the one it receives into then.
  void* Held(int step) const { return local == nullptr ? kv[step % 2] : step == 0 ? local : kv[(step - 1) % 2]; }
  void* Into(int step) const { return local == nullptr ? kv[(step + 1) % 2] : kv[step % 2]; }
};
Status ForwardWorkspace(Context& ctx, const RingGroup& g, const ValidatedCall& c, ForwardBuffers* b);
// `earlier`: the transfers the ring's work follows on the device, whose host waits come first
// (RingOrder::After): a grid's exchange.
Status ForwardSteps(Context& ctx, const RingGroup& g, const ValidatedCall& c, uint64_t seq, const ForwardBuffers& b,
                    RingOrder* earlier = nullptr);

// Likewise for the backward (BackwardSteps ends with BackwardEnd and the sinks' gradient): the
// K/V blocks travel as in the forward, with the dK/dV partials beside them.
struct BackwardBuffers : ForwardBuffers {
  size_t dkv_bytes = 0;
  void* dkv[2] = {nullptr, nullptr};  // this rank's partials, alternating while one is in flight
  void* dkv_in = nullptr;             // the partial arriving from the previous rank
  void* dkv_stage = nullptr;          // a trimmed partial going out
  void* own = nullptr;                // the contribution to this rank's own block
};
Status BackwardWorkspace(Context& ctx, const RingGroup& g, const ValidatedCall& c, BackwardBuffers* b);
Status BackwardSteps(Context& ctx, const RingGroup& g, const ValidatedCall& c, uint64_t seq, const BackwardBuffers& b,
                     RingOrder* earlier = nullptr);

// Ring buffer slots (Context::RingBuffer): K/V blocks 0 and 1, dK/dV partials 2 to 4, the
// staging of trimmed messages (K/V out and in 5 and 6, dK/dV out 7), and a plan's own dK/dV 8.
// Serving calls use 9 to 12; a grid's all-to-all 13 to 17 (grid.cc); a forward's widened FP8
// inputs 18 to 20 (fp8_inputs.cc); a plan's local K/V block while its home part may still read it
// 21 (ForwardBuffers::local).
constexpr int kKVStagingSlot = 5, kDKVStagingSlot = 7, kOwnDKVSlot = 8, kLocalKVSlot = 21;

// Where a plan's call may compute the rank's kept documents apart from the ring
// (ForwardStep::home_begin): the plan's HomeBegin, on a backend that runs such a part
// concurrently with the ring, when there is a ring to overlap (more than one step) and something
// past it; -1 otherwise.
inline int64_t HomeBeginOf(const ValidatedCall& c, const Backend& be, int n, int r) {
  if (c.plan == nullptr || n < 2 || !be.DetachesHome() || RingSteps(c, n) < 2) return -1;
  const int64_t h = c.plan->HomeBegin(r, kRowsKeyTile);
  return h < c.shape.L ? h : -1;
}

// Joins a call's detached work (Backend::JoinDetached) when its steps end on a failure; the
// success path joins explicitly, to report the join's own failure.
class JoinDetachedOnExit {
 public:
  explicit JoinDetachedOnExit(Backend& be) : be_(be) {}
  ~JoinDetachedOnExit() { (void)be_.JoinDetached(); }
  JoinDetachedOnExit(const JoinDetachedOnExit&) = delete;
  JoinDetachedOnExit& operator=(const JoinDetachedOnExit&) = delete;

 private:
  Backend& be_;
};

// The largest trimmed K/V message rank r sends or receives in the call: its staging size.
inline size_t KVStagingBytes(const ValidatedCall& c, const Backend& be, bool backward, size_t kv_bytes, int n, int r) {
  size_t most = 1;
  const int steps = RingSteps(c, n);
  for (int step = 0; step + 1 < steps; ++step)
    for (int holder : {(r - step + n) % n, (r - step - 1 + n) % n}) {
      const RingMessage m = KVMessage(c, be, backward, kv_bytes, holder, step);
      if (!m.whole) most = std::max(most, m.bytes);
    }
  return most;
}

// The staging buffers of a plan's trimmed K/V messages: [0] outgoing, [1] incoming.
inline Status StagingBuffers(Context& ctx, size_t bytes, void* stage[2]) {
  Status st = ctx.RingBuffer(kKVStagingSlot, bytes, &stage[0]);
  if (st.ok()) st = ctx.RingBuffer(kKVStagingSlot + 1, bytes, &stage[1]);
  return st;
}

inline void CountSent(size_t bytes, bool kv, Traffic* t) {
  (kv ? t->kv_bytes : t->dkv_bytes) += bytes;
  ++t->messages;
}

// Counts `extra` (timed apart, such as the packing before step 0) as part of step *t's compute.
inline void AddCompute(const StepTime& extra, StepTime* t) {
  t->compute_s += extra.compute_s;
  t->compute_cpu_s += extra.compute_cpu_s;
}

}  // namespace stria
