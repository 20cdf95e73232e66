// Logit softcapping and attention sinks (stria.h, params->softcap, params->sinks and dsinks) against
// the float64 dense reference: through the ring on every layout and on a document plan, rank counts
// 1..8, causal and not, GQA, each dtype, with documents and windows passed in params (the one path
// every mask takes), forward and backward with the sinks' gradient summed over the ranks. Outputs
// are poisoned (NaN) before each run.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <sstream>

#include "ring_results.h"
#include "test_util.h"

using namespace stria_test;

namespace {

struct Case {
  int world;
  stria_layout_t layout;
  bool causal;
  Dt dt;
  int64_t B, L, Hq, Hkv, D;
  float softcap = 0.f;
  bool sinks = false;
  int docs = 0;          // > 0: random documents per batch row, in params->cu_seqlens
  Window window{};       // in params->window_left/right
  bool plan = false;     // the tokens by a document plan (docs > 0) instead of the layout
  int64_t plan_len = 0;  // the plan's local_len (0: what it needs); L is then unused
};

std::string Name(const Case& c) {
  std::ostringstream os;
  os << "N" << c.world << "_" << (c.plan ? "plan" : LayoutName(c.layout)) << (c.causal ? "_causal" : "_full") << "_"
     << DtName(c.dt) << "_B" << c.B << "L" << c.L << "H" << c.Hq << "x" << c.Hkv << "D" << c.D;
  if (c.softcap > 0) os << "_softcap" << static_cast<int>(c.softcap);
  if (c.sinks) os << "_sinks";
  if (c.docs > 0) os << "_docs" << c.docs;
  if (c.window.active()) os << "_window" << WindowName(c.window);
  return os.str();
}

double Tolerance(Dt dt) {
  return dt == Dt::kF32 ? 1e-5 : 2e-2;
}

// Sink logits around the rows' LSE (a few units), so that they matter; a head of -inf (no sink)
// where there are three or more.
std::vector<double> MakeSinks(int64_t Hq, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 5.0);
  std::vector<double> z(static_cast<size_t>(Hq));
  for (double& x : z) x = static_cast<double>(static_cast<float>(u(rng)));
  if (Hq >= 3) z[1] = -INFINITY;
  return z;
}

void RunCase(const Case& c) {
  SCOPED_TRACE(Name(c));
  const int64_t S = c.plan ? c.L * c.world - 5 : c.L * c.world;  // a plan takes any S
  std::mt19937_64 rng(97 + c.world * 13 + c.layout * 7 + c.D + (c.sinks ? 1 : 0));
  Tensor q({c.B, S, c.Hq, c.D}, c.dt), k({c.B, S, c.Hkv, c.D}, c.dt), v({c.B, S, c.Hkv, c.D}, c.dt);
  Tensor dout({c.B, S, c.Hq, c.D}, c.dt);
  // Large scores, so that the cap bends them: the softcap is then far from the identity.
  const double spread = c.softcap > 0 ? 3.0 : 1.0;
  q.FillRandom(rng, spread);
  k.FillRandom(rng, spread);
  v.FillRandom(rng);
  dout.FillRandom(rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  std::vector<int64_t> cu;
  const int64_t num_seqs = c.docs;
  if (c.docs > 0) cu = RandomDocuments(c.B, S, c.docs, rng);
  const std::vector<double> sinks = c.sinks ? MakeSinks(c.Hq, rng) : std::vector<double>{};
  ScoreMods mods;
  mods.softcap = c.softcap;
  mods.sinks = c.sinks ? &sinks : nullptr;
  const auto qd = q.ToDouble(), kd = k.ToDouble(), vd = v.ToDouble(), dod = dout.ToDouble();
  const Reference ref = DenseAttention(qd, kd, vd, &dod, c.B, S, c.Hq, c.Hkv, c.D, c.causal, scale,
                                       c.docs > 0 ? &cu : nullptr, c.window, mods);

  stria_plan_t plan = nullptr;
  int64_t L = c.L;
  if (c.plan) {
    stria_plan_config_t cfg;
    stria_plan_config_init(&cfg);
    cfg.world_size = c.world;
    cfg.causal = c.causal;
    cfg.tile = 64;
    ASSERT_EQ(stria_plan_create(&cfg, cu.data(), num_seqs, c.B, S, &plan), STRIA_SUCCESS) << stria_get_last_error();
    stria_plan_info_t info;
    info.struct_size = sizeof info;
    ASSERT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS);
    L = info.local_len;
  }
  GatheredResults full(c.layout, c.world, c.B, S, c.Hq, c.Hkv, c.D, c.dt);
  if (plan != nullptr) full.UsePlan(plan);

  LocalGroup group(c.world, 60.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  Tensor z({c.Hq}, Dt::kF32);
  for (int64_t h = 0; h < c.Hq; ++h) z.Set(h, c.sinks ? sinks[static_cast<size_t>(h)] : 0.0);

  std::vector<std::string> errors(static_cast<size_t>(c.world));
  std::vector<double> dsinks(static_cast<size_t>(c.Hq), 0.0);
  std::mutex mu;
  RunRanks(c.world, [&](int r) {
    auto shard = [&](const Tensor& t) {
      Tensor local({t.shape[0], L, t.shape[2], t.shape[3]}, t.dt);
      const stria_status_t st = plan != nullptr ? stria_plan_shard(plan, r, 1, &t.dl, &local.dl, nullptr)
                                                : stria_shard(c.layout, c.world, r, 1, &t.dl, &local.dl, nullptr);
      EXPECT_EQ(st, STRIA_SUCCESS) << stria_get_last_error();
      return local;
    };
    Tensor ql = shard(q), kl = shard(k), vl = shard(v), dol = shard(dout);
    Tensor out({c.B, L, c.Hq, c.D}, c.dt), lse({c.B, c.Hq, L}, Dt::kF32);
    Tensor dq({c.B, L, c.Hq, c.D}, c.dt), dk({c.B, L, c.Hkv, c.D}, c.dt), dv({c.B, L, c.Hkv, c.D}, c.dt);
    Tensor dz({c.Hq}, Dt::kF32);
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv, &dz}) t->Poison();
    // Everything in params: the mask's documents and window, the softcap, the sinks.
    stria_attention_params_t params;
    stria_attention_params_init(&params);
    params.layout = c.layout;
    params.causal = c.causal;
    params.plan = plan;
    params.cu_seqlens = cu.empty() ? nullptr : cu.data();
    params.num_seqs = num_seqs;
    params.window_left = c.window.left;
    params.window_right = c.window.right;
    params.softcap = c.softcap;
    params.sinks = c.sinks ? &z.dl : nullptr;
    params.dsinks = c.sinks ? &dz.dl : nullptr;
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    std::string& err = errors[static_cast<size_t>(r)];
    if (stria_attention_forward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr) != STRIA_SUCCESS)
      err += std::string("forward: ") + stria_get_last_error();
    if (stria_attention_backward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, &dol.dl, &dq.dl, &dk.dl,
                                 &dv.dl, nullptr) != STRIA_SUCCESS)
      err += std::string(" backward: ") + stria_get_last_error();
    full.Gather(r, out, lse, dq, dk, dv);
    std::lock_guard<std::mutex> lock(mu);
    for (int64_t h = 0; h < c.Hq; ++h) dsinks[static_cast<size_t>(h)] += dz.Get(h);
  });
  for (int r = 0; r < c.world; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  const double tol = Tolerance(c.dt);
  full.ExpectMatches(ref, tol, c.dt == Dt::kF32 ? 1e-5 : 1e-2);
  if (c.sinks && c.dt == Dt::kF32) {
    EXPECT_LT(RelError(dsinks, ref.dsinks), tol) << "dsinks";
  } else if (c.sinks) {
    // The terms come from the rounded 16-bit outputs (delta = rowsum(dO * O), as every backward
    // computes it) and cancel: their rounding is measured against their magnitudes.
    for (int64_t h = 0; h < c.Hq; ++h) {
      const size_t i = static_cast<size_t>(h);
      EXPECT_LE(std::abs(dsinks[i] - ref.dsinks[i]), tol * ref.dsinks_terms[i]) << "dsinks of head " << h;
    }
  }
  if (plan != nullptr) stria_plan_destroy(plan);
}

class SoftcapSinks : public ::testing::TestWithParam<Case> {};
TEST_P(SoftcapSinks, MatchesDenseReference) {
  RunCase(GetParam());
}

std::vector<Case> Cases() {
  std::vector<Case> cs;
  const stria_layout_t layouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG};
  // Softcap, sinks and both, on every layout and rank count 1..8, causal and not, float32.
  for (int world : {1, 2, 3, 4, 5, 6, 7, 8})
    for (stria_layout_t layout : layouts) {
      if (layout == STRIA_LAYOUT_ZIGZAG && world % 2 == 0 && world > 4) continue;  // kept short: 4 covers zigzag
      const bool causal = world % 2 == 1 || layout == STRIA_LAYOUT_STRIPED;
      const int kind = (world + static_cast<int>(layout)) % 3;
      Case c{world, layout, causal, Dt::kF32, 1, 40, 4, 2, 32};
      c.softcap = kind != 1 ? 5.f : 0.f;
      c.sinks = kind != 0;
      cs.push_back(c);
    }
  // Each dtype with both, GQA and MQA, head dims of each vector width, several batch rows.
  for (Dt dt : {Dt::kF32, Dt::kF16, Dt::kBF16})
    for (bool causal : {true, false}) {
      cs.push_back(Case{3, STRIA_LAYOUT_STRIPED, causal, dt, 2, 70, 6, 2, 64, 20.f, true});
      cs.push_back(Case{4, STRIA_LAYOUT_ZIGZAG, causal, dt, 1, 64, 3, 1, 40, 8.f, true});
    }
  // A softcap that bends most scores (small cap), and one that leaves them almost as they are.
  cs.push_back(Case{2, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 96, 2, 2, 16, 1.f, false});
  cs.push_back(Case{2, STRIA_LAYOUT_CONTIGUOUS, false, Dt::kF32, 1, 96, 2, 1, 16, 1000.f, true});
  // Documents and windows in params, with both mods.
  for (Dt dt : {Dt::kF32, Dt::kBF16}) {
    Case docs{4, STRIA_LAYOUT_STRIPED, true, dt, 2, 48, 4, 2, 32, 10.f, true};
    docs.docs = 5;
    cs.push_back(docs);
    Case window{3, STRIA_LAYOUT_CONTIGUOUS, true, dt, 1, 80, 4, 1, 32, 10.f, true};
    window.window = Window{30, -1};
    cs.push_back(window);
    Case both{5, STRIA_LAYOUT_ZIGZAG, false, dt, 1, 64, 2, 2, 64, 30.f, true};
    both.docs = 4;
    both.window = Window{20, 10};
    cs.push_back(both);
  }
  // On a document plan (padding rows: the sinks must leave them out), causal and not.
  for (bool causal : {true, false}) {
    Case plan{3, STRIA_LAYOUT_STRIPED, causal, Dt::kF32, 2, 50, 4, 2, 32, 10.f, true};
    plan.docs = 6;
    plan.plan = true;
    cs.push_back(plan);
  }
  Case plan_bf16{5, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 64, 4, 4, 64, 15.f, true};
  plan_bf16.docs = 7;
  plan_bf16.plan = true;
  cs.push_back(plan_bf16);
  return cs;
}

INSTANTIATE_TEST_SUITE_P(Ring, SoftcapSinks, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return Name(i.param); });

// A row that sees no key gets out 0 and LSE z with a sink, and NaN never passes: a NaN sink
// poisons its head's rows (and only those).
TEST(Sinks, RowsWithoutKeysAndNaN) {
  const int64_t B = 1, L = 16, Hq = 2, D = 8;
  Tensor q({B, L, Hq, D}, Dt::kF32), k({B, L, Hq, D}, Dt::kF32), v({B, L, Hq, D}, Dt::kF32);
  std::mt19937_64 rng(5);
  for (Tensor* t : {&q, &k, &v}) t->FillRandom(rng);
  Tensor out({B, L, Hq, D}, Dt::kF32), lse({B, Hq, L}, Dt::kF32), z({Hq}, Dt::kF32);
  z.Set(0, 1.5);
  z.Set(1, NAN);
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  stria_context_t ctx = nullptr;
  ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  // Each row sees only itself (a window of 0 x 0), and a plan's padding rows see nothing: 13 tokens
  // in 16 slots on a world of one.
  params.causal = 0;
  params.window_left = 0;
  params.window_right = 0;
  params.sinks = &z.dl;
  stria_plan_config_t pc;
  stria_plan_config_init(&pc);
  pc.local_len = L;
  const int64_t cu[2] = {0, 13};
  stria_plan_t plan = nullptr;
  ASSERT_EQ(stria_plan_create(&pc, cu, 1, 1, 13, &plan), STRIA_SUCCESS) << stria_get_last_error();
  params.plan = plan;
  out.Poison();
  lse.Poison();
  ASSERT_EQ(stria_attention_forward(ctx, &params, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  std::vector<int64_t> pos(static_cast<size_t>(L));
  ASSERT_EQ(stria_plan_positions(plan, 0, pos.data()), STRIA_SUCCESS);
  int padding = 0;
  for (int64_t i = 0; i < L; ++i) {
    // Head 0: finite everywhere; a padding row has out 0 and LSE z.
    const double l0 = lse.Get(i);
    EXPECT_TRUE(std::isfinite(l0)) << "row " << i;
    if (pos[static_cast<size_t>(i)] < 0) {
      ++padding;
      EXPECT_FLOAT_EQ(l0, 1.5f) << "row " << i;
      for (int64_t d = 0; d < D; ++d) EXPECT_EQ(out.Get((i * Hq + 0) * D + d), 0.0) << "row " << i;
    } else {
      // Window 0x0: the row sees only itself, out = v_i * e^s / (e^s + e^z).
      EXPECT_GT(l0, 1.5) << "row " << i;
    }
    // Head 1: its NaN sink poisons every row.
    EXPECT_TRUE(std::isnan(lse.Get(L + i))) << "row " << i;
    EXPECT_TRUE(std::isnan(out.Get((i * Hq + 1) * D))) << "row " << i;
  }
  EXPECT_EQ(padding, 3);
  stria_plan_destroy(plan);
  stria_context_destroy(ctx);
}

}  // namespace
