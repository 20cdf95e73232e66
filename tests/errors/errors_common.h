// Helpers of the C ABI's bad-input tests (tests/errors/*.cc, one binary: test_errors): a rank's
// small good tensors, a call whose arguments a case edits one field at a time, raw storage for
// dtypes the Tensor helper does not model, and the correct forward that proves a context is still
// usable after what a test did to it.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "test_util.h"

namespace errors_test {

using namespace stria_test;

// Every good call here is this small, so a case costs milliseconds.
constexpr int64_t kB = 1, kL = 8, kHq = 2, kHkv = 1, kD = 16;
// Generous for a 2-rank exchange of a few KiB, small enough that a hang fails the test quickly.
constexpr double kGroupTimeoutS = 2.0;

// One rank's tensors of a forward/backward call, filled with finite values.
struct RankTensors : AttentionTensors {
  explicit RankTensors(int64_t L = kL, Dt dt = Dt::kF32, int64_t D = kD, int64_t Hq = kHq, int64_t Hkv = kHkv)
      : AttentionTensors(kB, L, Hq, Hkv, D, dt, 7) {}
};

// The arguments of one call, defaulting to a rank's good tensors. The DLTensors are copies, so a
// case edits one field (shape, dtype, device, ...) without touching the rank's tensors.
struct Call {
  stria_attention_params_t params;
  const stria_attention_params_t* p = &params;
  DLTensor q, k, v, out, lse, dout, dq, dk, dv;
  const DLTensor *qp = &q, *kp = &k, *vp = &v, *doutp = &dout;
  DLTensor *outp = &out, *lsep = &lse, *dqp = &dq, *dkp = &dk, *dvp = &dv;
  void* stream = nullptr;
  bool documents = false;  // through the _documents entry points, with these boundaries
  const int64_t* cu_seqlens = nullptr;
  int64_t num_seqs = 0;
  bool windowed = false;  // through the _window entry points, with this window (and the documents)
  int64_t window_left = -1, window_right = -1;

  explicit Call(RankTensors& t)
      : q(t.q.dl),
        k(t.k.dl),
        v(t.v.dl),
        out(t.out.dl),
        lse(t.lse.dl),
        dout(t.dout.dl),
        dq(t.dq.dl),
        dk(t.dk.dl),
        dv(t.dv.dl) {
    stria_attention_params_init(&params);
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;

  stria_status_t Forward(stria_context_t c) {
    if (windowed)
      return stria_attention_forward_window(c, p, window_left, window_right, cu_seqlens, num_seqs, qp, kp, vp, outp,
                                            lsep, stream);
    if (documents) return stria_attention_forward_documents(c, p, cu_seqlens, num_seqs, qp, kp, vp, outp, lsep, stream);
    return stria_attention_forward(c, p, qp, kp, vp, outp, lsep, stream);
  }
  stria_status_t Backward(stria_context_t c) {
    if (windowed)
      return stria_attention_backward_window(c, p, window_left, window_right, cu_seqlens, num_seqs, qp, kp, vp, outp,
                                             lsep, doutp, dqp, dkp, dvp, stream);
    if (documents)
      return stria_attention_backward_documents(c, p, cu_seqlens, num_seqs, qp, kp, vp, outp, lsep, doutp, dqp, dkp,
                                                dvp, stream);
    return stria_attention_backward(c, p, qp, kp, vp, outp, lsep, doutp, dqp, dkp, dvp, stream);
  }
  void Documents(const int64_t* cu, int64_t n) {
    documents = true;
    cu_seqlens = cu;
    num_seqs = n;
  }
  void Window(int64_t left, int64_t right) {
    windowed = true;
    window_left = left;
    window_right = right;
  }
};

// Raw host storage for a DLTensor whose dtype the Tensor helper does not model (int32, float64,
// vectors). Validation must reject these before reading, but the storage is real anyway.
struct Raw {
  std::vector<int64_t> shape;
  std::vector<uint64_t> words;
  DLTensor dl{};
  Raw(std::vector<int64_t> s, DLDataType dt) : shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    words.assign(static_cast<size_t>((n * dt.bits * dt.lanes / 8 + 7) / 8 + 1), 0);
    dl.data = words.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.dtype = dt;
    dl.shape = shape.data();
    dl.strides = nullptr;
  }
};

inline DLDataType Dl(uint8_t code, uint8_t bits, uint16_t lanes = 1) {
  DLDataType t;
  t.code = code;
  t.bits = bits;
  t.lanes = lanes;
  return t;
}

// A correct forward on every context of `ctxs` (one ring), checked against the float64 dense
// reference: proof that what came before left the contexts fully usable.
inline void ExpectCorrectForward(const std::vector<stria_context_t>& ctxs, uint64_t seed = 99) {
  const int n = static_cast<int>(ctxs.size());
  const int64_t S = kL * n;
  std::mt19937_64 rng(seed);
  Tensor q({kB, S, kHq, kD}, Dt::kF32), k({kB, S, kHkv, kD}, Dt::kF32), v({kB, S, kHkv, kD}, Dt::kF32);
  q.FillRandom(rng);
  k.FillRandom(rng);
  v.FillRandom(rng);
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), nullptr, kB, S, kHq, kHkv, kD, true,
                                       1.0 / std::sqrt(static_cast<double>(kD)));
  Tensor out_full({kB, S, kHq, kD}, Dt::kF32), lse_full({kB, kHq, S}, Dt::kF32);
  out_full.Poison();
  lse_full.Poison();
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  std::vector<stria_status_t> st(static_cast<size_t>(n));
  std::vector<std::string> err(static_cast<size_t>(n));
  std::mutex mu;
  RunRanks(n, [&](int r) {
    const stria_layout_t lay = params.layout;
    Tensor ql({kB, kL, kHq, kD}, Dt::kF32), kl({kB, kL, kHkv, kD}, Dt::kF32), vl({kB, kL, kHkv, kD}, Dt::kF32);
    stria_shard(lay, n, r, 1, &q.dl, &ql.dl, nullptr);
    stria_shard(lay, n, r, 1, &k.dl, &kl.dl, nullptr);
    stria_shard(lay, n, r, 1, &v.dl, &vl.dl, nullptr);
    Tensor out({kB, kL, kHq, kD}, Dt::kF32), lse({kB, kHq, kL}, Dt::kF32);
    out.Poison();
    lse.Poison();
    st[static_cast<size_t>(r)] = stria_attention_forward(ctxs[static_cast<size_t>(r)], &params, &ql.dl, &kl.dl, &vl.dl,
                                                         &out.dl, &lse.dl, nullptr);
    err[static_cast<size_t>(r)] = stria_get_last_error();
    std::lock_guard<std::mutex> lock(mu);
    stria_unshard(lay, n, r, 1, &out.dl, &out_full.dl, nullptr);
    stria_unshard(lay, n, r, 2, &lse.dl, &lse_full.dl, nullptr);
  });
  for (int r = 0; r < n; ++r)
    ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << err[static_cast<size_t>(r)];
  EXPECT_LT(RelError(out_full.ToDouble(), ref.out), 1e-5);
  EXPECT_LT(RelError(lse_full.ToDouble(), ref.lse), 1e-5);
}

inline stria_context_t CreateSingle() {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.num_threads = 1;
  cfg.timeout_s = kGroupTimeoutS;
  stria_context_t ctx = nullptr;
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  return ctx;
}

}  // namespace errors_test
