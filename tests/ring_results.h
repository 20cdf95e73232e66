// What the ring-versus-reference suites (tests/test_ring.cc on the CPU, tests/gpu/test_cuda_ring.cc
// on a GPU) share: q, k and v packed into one [B, L, Hq + 2 Hkv, D] tensor (to attend through head
// views of it), and the ranks' results gathered into poisoned full-sequence tensors and checked
// against the float64 reference.
#pragma once

#include <gtest/gtest.h>
#include <stria/stria.h>

#include <cstdint>
#include <mutex>

#include "test_util.h"

namespace stria_test {

// q [B, L, Hq, D], k and v [B, L, Hkv, D] as heads [0, Hq), [Hq, Hq + Hkv), [Hq + Hkv, Hq + 2 Hkv)
// of one tensor.
inline Tensor PackQKV(const Tensor& q, const Tensor& k, const Tensor& v) {
  const int64_t B = q.shape[0], L = q.shape[1], Hq = q.shape[2], Hkv = k.shape[2], D = q.shape[3];
  const int64_t H = Hq + 2 * Hkv;
  Tensor packed({B, L, H, D}, q.dt);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) {
          const double x = h < Hq         ? q.Get(((b * L + i) * Hq + h) * D + d)
                           : h < Hq + Hkv ? k.Get(((b * L + i) * Hkv + (h - Hq)) * D + d)
                                          : v.Get(((b * L + i) * Hkv + (h - Hq - Hkv)) * D + d);
          packed.Set(((b * L + i) * H + h) * D + d, x);
        }
  return packed;
}

// The full-sequence results of a ring, filled rank by rank (Gather may be called from the ranks'
// threads) and compared with the reference once all ranks are done.
class GatheredResults {
 public:
  GatheredResults(stria_layout_t layout, int world, int64_t B, int64_t S, int64_t Hq, int64_t Hkv, int64_t D, Dt dt)
      : layout_(layout),
        world_(world),
        out_({B, S, Hq, D}, dt),
        lse_({B, Hq, S}, Dt::kF32),
        dq_({B, S, Hq, D}, dt),
        dk_({B, S, Hkv, D}, dt),
        dv_({B, S, Hkv, D}, dt) {
    for (Tensor* t : {&out_, &lse_, &dq_, &dk_, &dv_}) t->Poison();  // rows no rank wrote stay NaN
  }

  // The ranks' tokens by a document plan instead of the layout.
  void UsePlan(stria_plan_t plan) { plan_ = plan; }
  // The ranks' tokens on a grid of all-to-all groups of `ulysses` (stria_grid_unshard).
  void UseGrid(int ulysses) { ulysses_ = ulysses; }

  void Gather(int rank, const Tensor& out, const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
    std::lock_guard<std::mutex> lock(mu_);
    auto unshard = [&](int seq_dim, const Tensor& local, Tensor& full) {
      stria_status_t st;
      if (plan_ != nullptr)
        st = ulysses_ > 1 ? stria_plan_grid_unshard(plan_, ulysses_, rank, seq_dim, &local.dl, &full.dl, nullptr)
                          : stria_plan_unshard(plan_, rank, seq_dim, &local.dl, &full.dl, nullptr);
      else
        st = ulysses_ > 1 ? stria_grid_unshard(layout_, world_, ulysses_, rank, seq_dim, &local.dl, &full.dl, nullptr)
                          : stria_unshard(layout_, world_, rank, seq_dim, &local.dl, &full.dl, nullptr);
      EXPECT_EQ(st, STRIA_SUCCESS) << stria_get_last_error();
    };
    unshard(1, out, out_);
    unshard(2, lse, lse_);
    unshard(1, dq, dq_);
    unshard(1, dk, dk_);
    unshard(1, dv, dv_);
  }

  // Relative errors below `tol` (out, and dq, dk, dv unless `grad_tol` is given) and `lse_tol`;
  // NaN never passes.
  void ExpectMatches(const Reference& ref, double tol, double lse_tol, double grad_tol = 0) const {
    if (grad_tol <= 0) grad_tol = tol;
    EXPECT_LT(RelError(out_.ToDouble(), ref.out), tol) << "out";
    EXPECT_LT(RelError(lse_.ToDouble(), ref.lse), lse_tol) << "lse";
    EXPECT_LT(RelError(dq_.ToDouble(), ref.dq), grad_tol) << "dq";
    EXPECT_LT(RelError(dk_.ToDouble(), ref.dk), grad_tol) << "dk";
    EXPECT_LT(RelError(dv_.ToDouble(), ref.dv), grad_tol) << "dv";
  }

 private:
  stria_layout_t layout_;
  int world_;
  stria_plan_t plan_ = nullptr;
  int ulysses_ = 1;
  Tensor out_, lse_, dq_, dk_, dv_;
  std::mutex mu_;
};

}  // namespace stria_test
