// Pieces shared by the forward and backward schedules.
#pragma once

#include <chrono>

#include "engine/context.h"

namespace stria {

enum class MessageKind : int64_t { kKV = 1, kDKV = 2 };

// Tags are unique per (call, step, kind), so a late message of one call can never be taken for
// a message of the next.
inline int64_t RingTag(uint64_t seq, int64_t step, MessageKind kind) {
  return static_cast<int64_t>((seq << 24) | (static_cast<uint64_t>(step) << 2) | static_cast<uint64_t>(kind));
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

// Counts `extra` (timed apart, such as the packing before step 0) as part of step *t's compute.
inline void AddCompute(const StepTime& extra, StepTime* t) {
  t->compute_s += extra.compute_s;
  t->compute_cpu_s += extra.compute_cpu_s;
}

}  // namespace stria
