// NaN in the inputs comes out as NaN, never as finite numbers (a training run must see its
// blow-up), forward and backward, for every layout and dtype.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "errors/errors_common.h"

using namespace errors_test;

namespace {

// NaN in the inputs must come out as NaN (or an error), never as finite numbers: a training run
// must see its blow-up. The NaN sits in one element of token t of q, k or v.
enum class Where { kQ, kK, kV };

void CheckNaNPropagates(Where where, int world, stria_layout_t layout, bool causal, Dt dt = Dt::kF32) {
  SCOPED_TRACE(::testing::Message() << "NaN in "
                                    << (where == Where::kQ   ? "q"
                                        : where == Where::kK ? "k"
                                                             : "v")
                                    << ", world " << world << ", layout " << layout << (causal ? ", causal" : "")
                                    << ", " << DtName(dt));
  const int64_t S = kL * world, t = 5;
  std::mt19937_64 rng(3);
  Tensor q({kB, S, kHq, kD}, dt), k({kB, S, kHkv, kD}, dt), v({kB, S, kHkv, kD}, dt);
  q.FillRandom(rng);
  k.FillRandom(rng);
  v.FillRandom(rng);
  Tensor& bad = where == Where::kQ ? q : where == Where::kK ? k : v;
  bad.Set(((0 * S + t) * bad.shape[2] + 0) * kD + 3, NAN);  // token t, head 0, element 3
  Tensor out_full({kB, S, kHq, kD}, dt), lse_full({kB, kHq, S}, Dt::kF32);
  std::vector<stria_status_t> st(static_cast<size_t>(world));
  std::vector<std::string> err(static_cast<size_t>(world));
  std::mutex mu;
  LocalGroup g(world, kGroupTimeoutS, 1);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = layout;
  params.causal = causal;
  RunRanks(world, [&](int r) {
    Tensor ql({kB, kL, kHq, kD}, dt), kl({kB, kL, kHkv, kD}, dt), vl({kB, kL, kHkv, kD}, dt);
    stria_shard(layout, world, r, 1, &q.dl, &ql.dl, nullptr);
    stria_shard(layout, world, r, 1, &k.dl, &kl.dl, nullptr);
    stria_shard(layout, world, r, 1, &v.dl, &vl.dl, nullptr);
    Tensor out({kB, kL, kHq, kD}, dt), lse({kB, kHq, kL}, Dt::kF32);
    st[static_cast<size_t>(r)] = stria_attention_forward(g.ctx[static_cast<size_t>(r)], &params, &ql.dl, &kl.dl, &vl.dl,
                                                         &out.dl, &lse.dl, nullptr);
    err[static_cast<size_t>(r)] = stria_get_last_error();
    std::lock_guard<std::mutex> lock(mu);
    stria_unshard(layout, world, r, 1, &out.dl, &out_full.dl, nullptr);
    stria_unshard(layout, world, r, 2, &lse.dl, &lse_full.dl, nullptr);
  });
  bool any_error = false;
  for (int r = 0; r < world; ++r) {
    if (st[static_cast<size_t>(r)] != STRIA_SUCCESS) {
      any_error = true;
      EXPECT_FALSE(err[static_cast<size_t>(r)].empty());
    }
  }
  if (any_error) return;  // reporting the NaN as an error is as good as propagating it
  // The (query, head) rows whose result depends on the NaN element; one summary, not one line per row.
  int finite_rows = 0, affected_rows = 0;
  std::string first;
  for (int64_t i = 0; i < S; ++i)
    for (int64_t h = 0; h < kHq; ++h) {
      bool affected = false;
      if (where == Where::kQ) {
        affected = i == t && h == 0;
      } else {
        affected = !causal || i >= t;  // kHkv = 1: every query head reads kv head 0
      }
      if (!affected) continue;
      ++affected_rows;
      bool has_nan = std::isnan(lse_full.Get((0 * kHq + h) * S + i));
      for (int64_t d = 0; d < kD; ++d) has_nan = has_nan || std::isnan(out_full.Get(((0 * S + i) * kHq + h) * kD + d));
      if (has_nan) continue;
      if (finite_rows++ == 0)
        first = ::testing::PrintToString(out_full.Get(((0 * S + i) * kHq + h) * kD)) + ", lse " +
                ::testing::PrintToString(lse_full.Get((0 * kHq + h) * S + i)) + " at query " + std::to_string(i) +
                " head " + std::to_string(h);
    }
  EXPECT_EQ(finite_rows, 0) << finite_rows << " of " << affected_rows
                            << " output rows that read the NaN came out finite, e.g. out[..., 0] = " << first;
}

TEST(NaNInputs, InQPropagates) {
  CheckNaNPropagates(Where::kQ, 1, STRIA_LAYOUT_STRIPED, true);
  CheckNaNPropagates(Where::kQ, 2, STRIA_LAYOUT_ZIGZAG, false);
}
TEST(NaNInputs, InKPropagates) {
  CheckNaNPropagates(Where::kK, 1, STRIA_LAYOUT_STRIPED, true);
  CheckNaNPropagates(Where::kK, 2, STRIA_LAYOUT_CONTIGUOUS, true);
}
TEST(NaNInputs, InVPropagates) {
  CheckNaNPropagates(Where::kV, 1, STRIA_LAYOUT_STRIPED, true);
  CheckNaNPropagates(Where::kV, 2, STRIA_LAYOUT_STRIPED, false);
}
// The 16-bit paths: their own packing and conversions (and on AMX machines the tile kernels).
TEST(NaNInputs, InHalfPrecisionPropagates) {
  for (Dt dt : {Dt::kBF16, Dt::kF16}) {
    CheckNaNPropagates(Where::kQ, 1, STRIA_LAYOUT_STRIPED, true, dt);
    CheckNaNPropagates(Where::kK, 2, STRIA_LAYOUT_ZIGZAG, true, dt);
    CheckNaNPropagates(Where::kV, 2, STRIA_LAYOUT_CONTIGUOUS, false, dt);
  }
}

// The backward: a NaN in dO of query t reaches dQ of that query and dV of every key it sees.
TEST(NaNInputs, InDoutPropagatesThroughBackward) {
  const int64_t t = 5;
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  RankTensors a;
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  ASSERT_EQ(stria_attention_forward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, nullptr),
            STRIA_SUCCESS)
      << stria_get_last_error();
  a.dout.Set(((0 * kL + t) * kHq + 0) * kD + 3, NAN);
  const stria_status_t st = stria_attention_backward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl,
                                                     &a.dout.dl, &a.dq.dl, &a.dk.dl, &a.dv.dl, nullptr);
  if (st == STRIA_SUCCESS) {
    bool dq_nan = false;
    for (int64_t d = 0; d < kD; ++d) dq_nan = dq_nan || std::isnan(a.dq.Get(((0 * kL + t) * kHq + 0) * kD + d));
    EXPECT_TRUE(dq_nan) << "dq of query " << t << " is finite";
    for (int64_t j = 0; j <= t; ++j) {  // causal: query t sees keys 0..t
      bool dv_nan = false;
      for (int64_t d = 0; d < kD; ++d) dv_nan = dv_nan || std::isnan(a.dv.Get((0 * kL + j) * kHkv * kD + d));
      EXPECT_TRUE(dv_nan) << "dv of key " << j << " is finite";
    }
  } else {
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

// A NaN in key t reaches dK and dV of that key through the backward (whatever the forward did).
TEST(NaNInputs, InKPropagatesThroughBackward) {
  const int64_t t = 5;
  stria_context_t ctx = CreateSingle();
  ASSERT_NE(ctx, nullptr);
  RankTensors a;
  a.k.Set(((0 * kL + t) * kHkv + 0) * kD + 3, NAN);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  stria_status_t st = stria_attention_forward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, nullptr);
  if (st == STRIA_SUCCESS)
    st = stria_attention_backward(ctx, &params, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, &a.dout.dl, &a.dq.dl,
                                  &a.dk.dl, &a.dv.dl, nullptr);
  if (st == STRIA_SUCCESS) {
    bool dk_nan = false;
    for (int64_t d = 0; d < kD; ++d) dk_nan = dk_nan || std::isnan(a.dk.Get(((0 * kL + t) * kHkv + 0) * kD + d));
    EXPECT_TRUE(dk_nan) << "dk of the NaN key is finite: dk[..., 0] = " << a.dk.Get(((0 * kL + t) * kHkv) * kD);
  } else {
    EXPECT_STRNE(stria_get_last_error(), "");
  }
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

}  // namespace
