// FP8 inputs of the forward (stria.h, float8_e4m3fn q, k and v with params->q_descale, k_descale,
// v_descale) against the float64 dense reference on the values the codes stand for: through the
// ring on every layout and on a document plan, rank counts 1..8, causal and not, GQA, each output
// dtype, no descale, one per tensor and one per head, with documents, windows, softcap and sinks.
// Outputs are poisoned (NaN) before each run. Then the bad calls: each refused with a clear error
// on every rank, the contexts usable after.
#include <gtest/gtest.h>

#include <cstring>
#include <mutex>
#include <sstream>
#include <string>

#include "common/float8.h"
#include "fp8_inputs.h"
#include "test_util.h"

using namespace stria_test;

namespace {

// The library's decoding of every code against the test's own.
TEST(Float8, DecodesEveryCodeAsTheFormatSays) {
  for (int c = 0; c < 256; ++c) {
    const double want = Fp8Value(static_cast<uint8_t>(c));
    const float got = stria::Float8E4M3ToF32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << "code " << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << "code " << c;  // -0 too
    }
  }
  EXPECT_EQ(Fp8Value(0x38), 1.0);
  EXPECT_EQ(Fp8Value(0x7e), 448.0);
  EXPECT_EQ(Fp8Value(0x01), std::ldexp(1.0, -9));
  EXPECT_EQ(Fp8Nearest(1000.0), 0x7e);  // saturates
}

// The rounding from float32 against the nearest code by search (ties to the even code), and the
// saturation of satfinite: every code's value and the midpoints between neighbours, and random
// values across the whole range.
TEST(Float8, RoundsFromFloat32ToTheNearestCode) {
  std::vector<float> xs;
  for (int c = 0; c < 127; ++c) {
    const double v = Fp8Value(static_cast<uint8_t>(c));
    xs.push_back(static_cast<float>(v));
    if (c < 126) xs.push_back(static_cast<float>((v + Fp8Value(static_cast<uint8_t>(c + 1))) / 2));  // exact ties
  }
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> e(-14.0, 10.0);
  for (int i = 0; i < 20000; ++i) xs.push_back(static_cast<float>(std::exp2(e(rng))));
  for (float x : xs)
    for (float y : {x, -x}) {
      const uint8_t got = stria::F32ToFloat8E4M3(y);
      EXPECT_EQ(got, Fp8Nearest(y)) << "value " << y;
    }
  EXPECT_EQ(stria::F32ToFloat8E4M3(1e30f), 0x7e);
  EXPECT_EQ(stria::F32ToFloat8E4M3(-INFINITY), 0xfe);
  EXPECT_EQ(stria::F32ToFloat8E4M3(NAN) & 0x7f, 0x7f);
}

struct Case {
  int world;
  stria_layout_t layout;
  bool causal;
  Dt out;  // the output's dtype, which the call computes in
  Descale descale;
  int64_t B, L, Hq, Hkv, D;
  int docs = 0;     // > 0: random documents in params->cu_seqlens
  Window window{};  // in params
  bool plan = false;
  float softcap = 0.f;
  bool sinks = false;
};

std::string Name(const Case& c) {
  std::ostringstream os;
  os << "N" << c.world << "_" << (c.plan ? "plan" : LayoutName(c.layout)) << (c.causal ? "_causal" : "_full") << "_out"
     << DtName(c.out) << "_" << DescaleName(c.descale) << "_B" << c.B << "L" << c.L << "H" << c.Hq << "x" << c.Hkv
     << "D" << c.D;
  if (c.docs > 0) os << "_docs" << c.docs;
  if (c.window.active()) os << "_window" << WindowName(c.window);
  if (c.softcap > 0) os << "_softcap";
  if (c.sinks) os << "_sinks";
  return os.str();
}

// The rank's part of a host tensor (by the plan, or by the layout) into `local`.
stria_status_t Shard(stria_plan_t plan, stria_layout_t layout, int world, int rank, const DLTensor& full,
                     DLTensor* local) {
  return plan != nullptr ? stria_plan_shard(plan, rank, 1, &full, local, nullptr)
                         : stria_shard(layout, world, rank, 1, &full, local, nullptr);
}

void RunCase(const Case& c) {
  SCOPED_TRACE(Name(c));
  const int64_t S = c.plan ? c.L * c.world - 3 : c.L * c.world;
  std::mt19937_64 rng(1234 + c.world * 31 + c.layout * 7 + c.D + static_cast<int>(c.descale));
  // Scores of a few units: the softmax is neither flat nor one-hot.
  Fp8Input q({c.B, S, c.Hq, c.D}, c.descale, 1.0, rng), k({c.B, S, c.Hkv, c.D}, c.descale, 1.0, rng),
      v({c.B, S, c.Hkv, c.D}, c.descale, 1.0, rng);
  std::vector<int64_t> cu;
  if (c.docs > 0) cu = RandomDocuments(c.B, S, c.docs, rng);
  std::vector<double> sinks;
  for (int64_t h = 0; c.sinks && h < c.Hq; ++h) sinks.push_back(static_cast<float>(0.5 * static_cast<double>(h)));
  ScoreMods mods;
  mods.softcap = c.softcap;
  mods.sinks = c.sinks ? &sinks : nullptr;
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const Reference ref = DenseAttention(q.Values(), k.Values(), v.Values(), nullptr, c.B, S, c.Hq, c.Hkv, c.D, c.causal,
                                       scale, c.docs > 0 ? &cu : nullptr, c.window, mods);

  stria_plan_t plan = nullptr;
  int64_t L = c.L;
  if (c.plan) {
    stria_plan_config_t cfg;
    stria_plan_config_init(&cfg);
    cfg.world_size = c.world;
    cfg.causal = c.causal;
    cfg.tile = 16;
    ASSERT_EQ(stria_plan_create(&cfg, cu.data(), c.docs, c.B, S, &plan), STRIA_SUCCESS) << stria_get_last_error();
    stria_plan_info_t info;
    info.struct_size = sizeof info;
    ASSERT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS);
    L = info.local_len;
  }
  Tensor out_full({c.B, S, c.Hq, c.D}, c.out), lse_full({c.B, c.Hq, S}, Dt::kF32);
  out_full.Poison();
  lse_full.Poison();
  Tensor z({c.Hq}, Dt::kF32);
  for (int64_t h = 0; h < c.Hq; ++h) z.Set(h, c.sinks ? sinks[static_cast<size_t>(h)] : 0.0);

  LocalGroup group(c.world, 60.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  std::vector<std::string> errors(static_cast<size_t>(c.world));
  std::mutex mu;
  RunRanks(c.world, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    Fp8Shard ql(q, L), kl(k, L), vl(v, L);
    for (auto [full, local] : {std::pair{&q, &ql}, {&k, &kl}, {&v, &vl}})
      if (Shard(plan, c.layout, c.world, r, full->dl, &local->dl) != STRIA_SUCCESS)
        err += std::string("shard: ") + stria_get_last_error();
    Tensor out({c.B, L, c.Hq, c.D}, c.out), lse({c.B, c.Hq, L}, Dt::kF32);
    out.Poison();
    lse.Poison();
    stria_attention_params_t params;
    stria_attention_params_init(&params);
    params.layout = c.layout;
    params.causal = c.causal;
    params.plan = plan;
    params.cu_seqlens = cu.empty() ? nullptr : cu.data();
    params.num_seqs = c.docs;
    params.window_left = c.window.left;
    params.window_right = c.window.right;
    params.softcap = c.softcap;
    params.sinks = c.sinks ? &z.dl : nullptr;
    params.q_descale = ql.descale();
    params.k_descale = kl.descale();
    params.v_descale = vl.descale();
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    if (stria_attention_forward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr) != STRIA_SUCCESS)
      err += std::string("forward: ") + stria_get_last_error();
    std::lock_guard<std::mutex> lock(mu);
    const stria_status_t so = plan != nullptr ? stria_plan_unshard(plan, r, 1, &out.dl, &out_full.dl, nullptr)
                                              : stria_unshard(c.layout, c.world, r, 1, &out.dl, &out_full.dl, nullptr);
    const stria_status_t sl = plan != nullptr ? stria_plan_unshard(plan, r, 2, &lse.dl, &lse_full.dl, nullptr)
                                              : stria_unshard(c.layout, c.world, r, 2, &lse.dl, &lse_full.dl, nullptr);
    if (so != STRIA_SUCCESS || sl != STRIA_SUCCESS) err += std::string("unshard: ") + stria_get_last_error();
  });
  for (int r = 0; r < c.world; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  const bool f32 = c.out == Dt::kF32;
  EXPECT_LT(RelError(out_full.ToDouble(), ref.out), f32 ? 1e-5 : 2e-2) << "out";
  EXPECT_LT(RelError(lse_full.ToDouble(), ref.lse), f32 ? 1e-5 : 1e-2) << "lse";
  if (plan != nullptr) stria_plan_destroy(plan);
}

class Fp8Forward : public ::testing::TestWithParam<Case> {};
TEST_P(Fp8Forward, MatchesDenseReference) {
  RunCase(GetParam());
}

std::vector<Case> Cases() {
  std::vector<Case> cs;
  const stria_layout_t layouts[] = {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG};
  const Dt outs[] = {Dt::kF32, Dt::kBF16, Dt::kF16};
  const Descale scales[] = {Descale::kHead, Descale::kTensor, Descale::kNone};
  // Every rank count, layouts, output dtypes and descales in turn, causal and not, GQA 2:1.
  for (int world = 1; world <= 8; ++world)
    for (bool causal : {true, false}) {
      const int i = world + (causal ? 0 : 1);
      cs.push_back(Case{world, layouts[i % 3], causal, outs[i % 3], scales[(i / 3 + world) % 3], 1, 24, 4, 2, 32});
    }
  // Each output dtype at D 64 and MQA, two batch rows.
  for (Dt out : outs) cs.push_back(Case{3, STRIA_LAYOUT_STRIPED, true, out, Descale::kHead, 2, 40, 3, 1, 64});
  // Documents and a window in params; a document plan on S not divisible by N; softcap and sinks.
  Case docs{4, STRIA_LAYOUT_ZIGZAG, true, Dt::kF32, Descale::kHead, 2, 32, 4, 2, 32};
  docs.docs = 5;
  cs.push_back(docs);
  Case window{3, STRIA_LAYOUT_CONTIGUOUS, false, Dt::kBF16, Descale::kTensor, 1, 40, 2, 2, 32};
  window.window = Window{17, 5};
  cs.push_back(window);
  Case plan{4, STRIA_LAYOUT_STRIPED, true, Dt::kF32, Descale::kHead, 2, 40, 4, 2, 32};
  plan.docs = 6;
  plan.plan = true;
  cs.push_back(plan);
  Case mods{2, STRIA_LAYOUT_STRIPED, true, Dt::kF32, Descale::kHead, 1, 48, 4, 4, 32};
  mods.softcap = 2.f;
  mods.sinks = true;
  cs.push_back(mods);
  return cs;
}

INSTANTIATE_TEST_SUITE_P(All, Fp8Forward, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return Name(info.param); });

// One rank's FP8 call: inputs, descales, outputs, on a world of `world` (rank r's share).
struct Fp8Call {
  Fp8Input q, k, v;
  Tensor out, lse, q_scale, bf16_q;
  stria_attention_params_t params;
  Fp8Call(std::mt19937_64& rng)
      : q({1, 16, 4, 32}, Descale::kHead, 1.0, rng),
        k({1, 16, 2, 32}, Descale::kTensor, 1.0, rng),
        v({1, 16, 2, 32}, Descale::kNone, 1.0, rng),
        out({1, 16, 4, 32}, Dt::kBF16),
        lse({1, 4, 16}, Dt::kF32),
        q_scale({4}, Dt::kF32),
        bf16_q({1, 16, 4, 32}, Dt::kBF16) {
    for (int64_t h = 0; h < 4; ++h) q_scale.Set(h, q.scales[static_cast<size_t>(h)]);
    stria_attention_params_init(&params);
    params.q_descale = &q_scale.dl;
  }
  stria_status_t Forward(stria_context_t ctx, const DLTensor* qt = nullptr) {
    return stria_attention_forward(ctx, &params, qt != nullptr ? qt : &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr);
  }
};

// A CPU context of the library's defaults, destroyed at scope exit.
struct OneContext {
  stria_context_t ctx = nullptr;
  OneContext() {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  }
  ~OneContext() { stria_context_destroy(ctx); }
};

// Each bad call: refused with a status and a message naming the problem; the context usable after.
TEST(Fp8Errors, BadCallsAreRefusedAndLeaveTheContextUsable) {
  OneContext one;
  stria_context_t ctx = one.ctx;
  ASSERT_NE(ctx, nullptr);
  std::mt19937_64 rng(5);
  Fp8Call call(rng);
  ASSERT_EQ(call.Forward(ctx), STRIA_SUCCESS) << stria_get_last_error();
  // The refusal, then (params restored) the call that works.
  auto expect = [&](stria_status_t got, stria_status_t want, const char* says) {
    EXPECT_EQ(got, want) << stria_get_last_error();
    EXPECT_NE(std::strstr(stria_get_last_error(), says), nullptr) << stria_get_last_error();
    stria_attention_params_t kept = call.params;
    stria_attention_params_init(&call.params);
    call.params.q_descale = &call.q_scale.dl;
    EXPECT_EQ(call.Forward(ctx), STRIA_SUCCESS) << "after a refused call: " << stria_get_last_error();
    call.params = kept;
  };
  // q FP8 and k not; k FP8 and q not.
  {
    Tensor k16({1, 16, 2, 32}, Dt::kBF16);
    expect(stria_attention_forward(ctx, &call.params, &call.q.dl, &k16.dl, &call.v.dl, &call.out.dl, &call.lse.dl,
                                   nullptr),
           STRIA_ERROR_INVALID_ARGUMENT, "k has dtype bfloat16 but q is float8_e4m3fn");
    call.params.q_descale = nullptr;
    expect(stria_attention_forward(ctx, &call.params, &call.bf16_q.dl, &call.k.dl, &call.v.dl, &call.out.dl,
                                   &call.lse.dl, nullptr),
           STRIA_ERROR_INVALID_ARGUMENT, "k has dtype float8_e4m3fn but q is bfloat16");
    call.params.q_descale = &call.q_scale.dl;
  }
  // FP8 out.
  {
    Fp8Input out8({1, 16, 4, 32}, Descale::kNone, 1.0, rng);
    expect(
        stria_attention_forward(ctx, &call.params, &call.q.dl, &call.k.dl, &call.v.dl, &out8.dl, &call.lse.dl, nullptr),
        STRIA_ERROR_UNSUPPORTED, "out has dtype float8_e4m3fn");
  }
  // Descales of the wrong shape or dtype, or with inputs that are not FP8.
  {
    Tensor three({3}, Dt::kF32), half({4}, Dt::kF16), two_d({1, 4}, Dt::kF32);
    call.params.q_descale = &three.dl;
    expect(call.Forward(ctx), STRIA_ERROR_INVALID_ARGUMENT, "params->q_descale has shape [3]");
    call.params.q_descale = &half.dl;
    expect(call.Forward(ctx), STRIA_ERROR_INVALID_ARGUMENT, "params->q_descale has dtype float16, expected float32");
    call.params.q_descale = &two_d.dl;
    expect(call.Forward(ctx), STRIA_ERROR_INVALID_ARGUMENT, "params->q_descale has ndim 2, expected 1 ([1] or [Hq])");
    call.params.q_descale = &call.q_scale.dl;
    call.params.v_descale = &three.dl;  // v has 2 heads
    expect(call.Forward(ctx), STRIA_ERROR_INVALID_ARGUMENT, "params->v_descale has shape [3]: a descale is [1]");
    call.params.v_descale = nullptr;
    Tensor q16({1, 16, 4, 32}, Dt::kBF16), k16({1, 16, 2, 32}, Dt::kBF16), v16({1, 16, 2, 32}, Dt::kBF16);
    expect(stria_attention_forward(ctx, &call.params, &q16.dl, &k16.dl, &v16.dl, &call.out.dl, &call.lse.dl, nullptr),
           STRIA_ERROR_INVALID_ARGUMENT, "params->q_descale is set, but descales are for float8_e4m3fn inputs");
  }
  // FP8 in the backward: refused by dtype (and descales there by name).
  {
    Tensor dout({1, 16, 4, 32}, Dt::kBF16), dq({1, 16, 4, 32}, Dt::kBF16), dk({1, 16, 2, 32}, Dt::kBF16),
        dv({1, 16, 2, 32}, Dt::kBF16);
    expect(stria_attention_backward(ctx, &call.params, &call.q.dl, &call.k.dl, &call.v.dl, &call.out.dl, &call.lse.dl,
                                    &dout.dl, &dq.dl, &dk.dl, &dv.dl, nullptr),
           STRIA_ERROR_INVALID_ARGUMENT, "params->q_descale is set");
    call.params.q_descale = nullptr;
    expect(stria_attention_backward(ctx, &call.params, &call.q.dl, &call.k.dl, &call.v.dl, &call.out.dl, &call.lse.dl,
                                    &dout.dl, &dq.dl, &dk.dl, &dv.dl, nullptr),
           STRIA_ERROR_UNSUPPORTED, "q has dtype float8_e4m3fn, which only stria_attention_forward takes");
    call.params.q_descale = &call.q_scale.dl;
  }
}

// A caller built against the 0.4 header (no descale fields) may pass FP8 inputs: scales of 1.
TEST(Fp8Errors, OlderParamsStructTakesFp8InputsUnscaled) {
  OneContext one;
  stria_context_t ctx = one.ctx;
  ASSERT_NE(ctx, nullptr);
  std::mt19937_64 rng(8);
  Fp8Input q({1, 12, 2, 16}, Descale::kNone, 1.0, rng), k({1, 12, 2, 16}, Descale::kNone, 1.0, rng),
      v({1, 12, 2, 16}, Descale::kNone, 1.0, rng);
  Tensor out({1, 12, 2, 16}, Dt::kF32), lse({1, 2, 12}, Dt::kF32);
  out.Poison();
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.struct_size = offsetof(stria_attention_params_t, q_descale);
  params.q_descale = reinterpret_cast<const DLTensor*>(0x1);  // beyond the struct: never read
  ASSERT_EQ(stria_attention_forward(ctx, &params, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  const Reference ref = DenseAttention(q.Values(), k.Values(), v.Values(), nullptr, 1, 12, 2, 2, 16, true, 0.25);
  EXPECT_LT(RelError(out.ToDouble(), ref.out), 1e-5);
}

// One rank's bad descale fails the call on every rank of the group, which stays usable.
TEST(Fp8Errors, OneRanksBadDescaleFailsEveryRank) {
  LocalGroup group(3);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  std::vector<stria_status_t> got(3);
  std::vector<std::string> says(3);
  for (bool bad : {true, false}) {
    RunRanks(3, [&](int r) {
      std::mt19937_64 rng(40);
      Fp8Call call(rng);
      Tensor wrong({3}, Dt::kF32);  // k has 2 heads
      if (bad && r == 1) call.params.k_descale = &wrong.dl;
      got[static_cast<size_t>(r)] = call.Forward(group.ctx[static_cast<size_t>(r)]);
      says[static_cast<size_t>(r)] = stria_get_last_error();
    });
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(got[static_cast<size_t>(r)], bad ? STRIA_ERROR_INVALID_ARGUMENT : STRIA_SUCCESS)
          << "rank " << r << ": " << says[static_cast<size_t>(r)];
      if (bad) {
        EXPECT_NE(says[static_cast<size_t>(r)].find("k_descale"), std::string::npos) << says[static_cast<size_t>(r)];
      }
    }
  }
}

}  // namespace
