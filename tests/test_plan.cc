// Document plans: the ring on a plan against the float64 dense reference (random boundaries,
// documents of one token, documents longer than a rank's share, a single document, S not divisible
// by N, S below N tiles; N = 1..8, causal and not, windows, GQA, each dtype, forward and backward),
// the plan's round trips (positions, shard and unshard), its balance against the fixed layouts,
// and its bad inputs. Outputs are poisoned before each run; padding slots must come back as rows
// that saw nothing (out 0, LSE -inf, dK and dV 0).
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <sstream>

#include "ring_results.h"
#include "test_util.h"

using namespace stria_test;

namespace {

enum class Docs { kRandom, kSingle, kOnes, kFewLong, kGiven };

struct PlanCase {
  int world;
  bool causal;
  Dt dt;
  int64_t B, S, Hq, Hkv, D;
  Docs docs = Docs::kRandom;
  int num_docs = 5;              // kRandom: documents per batch row
  int64_t tile = 4;              // the plan's tile: small, so that short sequences have documents to split
  Window window{};               // a sliding window (the _window calls)
  bool pass_cu = true;           // the _documents (or _window) calls with the boundaries; else the plain ones
  int64_t local_len = 0;         // > 0: the plan's fixed local_len
  bool expect_trim = false;      // blocks long enough that the plan's messages must be shorter than whole ones
  std::vector<int64_t> given{};  // kGiven: the boundaries, [B][num_docs + 1]
};

std::string Name(const PlanCase& c) {
  static const char* docs[] = {"random", "single", "ones", "fewlong", "given"};
  std::ostringstream os;
  os << "N" << c.world << (c.causal ? "_causal" : "_full") << "_" << DtName(c.dt) << "_B" << c.B << "S" << c.S << "H"
     << c.Hq << "x" << c.Hkv << "D" << c.D << "_" << docs[static_cast<int>(c.docs)]
     << (c.docs == Docs::kRandom || c.docs == Docs::kGiven ? std::to_string(c.num_docs) : "") << "_tile" << c.tile
     << (c.window.active() ? "_window" + WindowName(c.window) : "") << (c.pass_cu ? "" : "_plain")
     << (c.local_len > 0 ? "_len" + std::to_string(c.local_len) : "");
  return os.str();
}

// [B][num_seqs + 1] boundaries of the case's kind.
std::vector<int64_t> Boundaries(const PlanCase& c, std::mt19937_64& rng, int64_t* num_seqs) {
  std::vector<int64_t> cu;
  switch (c.docs) {
    case Docs::kRandom:
      *num_seqs = c.num_docs;
      return RandomDocuments(c.B, c.S, c.num_docs, rng);
    case Docs::kGiven:
      *num_seqs = c.num_docs;
      return c.given;
    case Docs::kSingle:
      *num_seqs = 1;
      for (int64_t b = 0; b < c.B; ++b) cu.insert(cu.end(), {0, c.S});
      return cu;
    case Docs::kOnes:
      *num_seqs = c.S;
      for (int64_t b = 0; b < c.B; ++b)
        for (int64_t d = 0; d <= c.S; ++d) cu.push_back(d);
      return cu;
    case Docs::kFewLong: {
      // Two documents of about a third each, then short ones of 1..5 tokens.
      std::uniform_int_distribution<int64_t> shortlen(1, 5);
      std::vector<std::vector<int64_t>> rows;
      size_t most = 0;
      for (int64_t b = 0; b < c.B; ++b) {
        std::vector<int64_t> row{0, c.S / 3, 2 * c.S / 3};
        while (row.back() < c.S) row.push_back(std::min(c.S, row.back() + shortlen(rng)));
        most = std::max(most, row.size());
        rows.push_back(row);
      }
      for (auto& row : rows) {
        row.resize(most, c.S);
        cu.insert(cu.end(), row.begin(), row.end());
      }
      *num_seqs = static_cast<int64_t>(most) - 1;
      return cu;
    }
  }
  return cu;
}

void PrintTo(const PlanCase& c, std::ostream* os) {
  *os << Name(c);
}

double Tolerance(Dt dt) {
  return dt == Dt::kF32 ? 1e-5 : 2e-2;
}

// A plan that is destroyed at scope exit.
struct PlanHandle {
  stria_plan_t plan = nullptr;
  stria_status_t status = STRIA_SUCCESS;
  PlanHandle(const stria_plan_config_t& cfg, const std::vector<int64_t>& cu, int64_t B, int64_t num_seqs, int64_t S) {
    status = stria_plan_create(&cfg, cu.data(), num_seqs, B, S, &plan);
  }
  ~PlanHandle() {
    if (plan) stria_plan_destroy(plan);
  }
  int64_t local_len() const {
    stria_plan_info_t info;
    info.struct_size = sizeof info;
    EXPECT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS) << stria_get_last_error();
    return info.local_len;
  }
};

stria_plan_config_t Config(int world, bool causal, int64_t tile, Window w = {}) {
  stria_plan_config_t cfg;
  stria_plan_config_init(&cfg);
  cfg.world_size = world;
  cfg.causal = causal;
  cfg.tile = tile;
  cfg.window_left = w.left;
  cfg.window_right = w.right;
  return cfg;
}

Tensor ShardBy(stria_plan_t plan, const Tensor& full, int rank, int64_t L) {
  Tensor local({full.shape[0], L, full.shape[2], full.shape[3]}, full.dt);
  local.Poison();
  EXPECT_EQ(stria_plan_shard(plan, rank, 1, &full.dl, &local.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
  return local;
}

void RunPlanCase(const PlanCase& c) {
  SCOPED_TRACE(Name(c));
  std::mt19937_64 rng(977 + c.world * 13 + c.S + static_cast<int>(c.docs) * 101);
  int64_t num_seqs = 0;
  const std::vector<int64_t> cu = Boundaries(c, rng, &num_seqs);
  stria_plan_config_t cfg = Config(c.world, c.causal, c.tile, c.window);
  cfg.local_len = c.local_len;
  PlanHandle plan(cfg, cu, c.B, num_seqs, c.S);
  ASSERT_EQ(plan.status, STRIA_SUCCESS) << stria_get_last_error();
  const int64_t L = plan.local_len();
  if (c.local_len > 0) {
    ASSERT_EQ(L, c.local_len);
  }
  ASSERT_GE(L, (c.S + c.world - 1) / c.world);

  Tensor q({c.B, c.S, c.Hq, c.D}, c.dt), k({c.B, c.S, c.Hkv, c.D}, c.dt), v({c.B, c.S, c.Hkv, c.D}, c.dt);
  Tensor dout({c.B, c.S, c.Hq, c.D}, c.dt);
  for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto dq64 = dout.ToDouble();
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dq64, c.B, c.S, c.Hq, c.Hkv, c.D,
                                       c.causal, scale, &cu, c.window);

  GatheredResults full(STRIA_LAYOUT_STRIPED, c.world, c.B, c.S, c.Hq, c.Hkv, c.D, c.dt);
  full.UsePlan(plan.plan);
  LocalGroup group(c.world, 60.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.causal = c.causal;
  params.plan = plan.plan;
  const std::vector<int64_t> given = c.pass_cu ? cu : std::vector<int64_t>{};

  std::vector<std::string> errors(static_cast<size_t>(c.world));
  std::vector<int64_t> positions(static_cast<size_t>(c.B * L));
  RunRanks(c.world, [&](int r) {
    Tensor ql = ShardBy(plan.plan, q, r, L), kl = ShardBy(plan.plan, k, r, L), vl = ShardBy(plan.plan, v, r, L);
    Tensor dol = ShardBy(plan.plan, dout, r, L);
    Tensor out({c.B, L, c.Hq, c.D}, c.dt), lse({c.B, c.Hq, L}, Dt::kF32);
    Tensor dq({c.B, L, c.Hq, c.D}, c.dt), dk({c.B, L, c.Hkv, c.D}, c.dt), dv({c.B, L, c.Hkv, c.D}, c.dt);
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    std::string& err = errors[static_cast<size_t>(r)];
    // First a call on a layout, with NaN everywhere, of the same local shape: it leaves NaN in every
    // ring buffer (the plan's trimmed messages fill only the rows the ranks see: the rest must never
    // reach a result) and sends whole blocks, against which the plan's traffic is measured.
    stria_traffic_t whole_fwd{sizeof(stria_traffic_t), 0, 0, 0, 0}, whole_bwd = whole_fwd;
    stria_traffic_t plan_fwd = whole_fwd, plan_bwd = whole_fwd;
    {
      Tensor nq({c.B, L, c.Hq, c.D}, c.dt), nk({c.B, L, c.Hkv, c.D}, c.dt), nv({c.B, L, c.Hkv, c.D}, c.dt);
      Tensor nout({c.B, L, c.Hq, c.D}, c.dt), nlse({c.B, c.Hq, L}, Dt::kF32), ndq({c.B, L, c.Hq, c.D}, c.dt);
      Tensor ndk({c.B, L, c.Hkv, c.D}, c.dt), ndv({c.B, L, c.Hkv, c.D}, c.dt);
      for (Tensor* t : {&nq, &nk, &nv, &nout, &nlse}) t->Poison();
      stria_attention_params_t layout_params;
      stria_attention_params_init(&layout_params);
      layout_params.causal = c.causal;
      if (stria_attention_forward(ctx, &layout_params, &nq.dl, &nk.dl, &nv.dl, &nout.dl, &nlse.dl, nullptr) !=
              STRIA_SUCCESS ||
          stria_context_get_traffic(ctx, &whole_fwd) != STRIA_SUCCESS ||
          stria_attention_backward(ctx, &layout_params, &nq.dl, &nk.dl, &nv.dl, &nout.dl, &nlse.dl, &nout.dl, &ndq.dl,
                                   &ndk.dl, &ndv.dl, nullptr) != STRIA_SUCCESS ||
          stria_context_get_traffic(ctx, &whole_bwd) != STRIA_SUCCESS)
        err += std::string("the NaN call on a layout: ") + stria_get_last_error();
    }
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->Poison();
    if (AttentionForward(ctx, &params, given, num_seqs, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr, c.window) !=
            STRIA_SUCCESS ||
        stria_context_get_traffic(ctx, &plan_fwd) != STRIA_SUCCESS)
      err += std::string("forward: ") + stria_get_last_error();
    if (AttentionBackward(ctx, &params, given, num_seqs, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, &dol.dl, &dq.dl,
                          &dk.dl, &dv.dl, nullptr, c.window) != STRIA_SUCCESS ||
        stria_context_get_traffic(ctx, &plan_bwd) != STRIA_SUCCESS)
      err += std::string(" backward: ") + stria_get_last_error();
    // The plan's blocks carry at most a layout's whole ones, nothing where every document is kept
    // whole, and less where a block holds rows no later rank sees.
    EXPECT_LE(plan_fwd.kv_bytes, whole_fwd.kv_bytes) << "rank " << r;
    EXPECT_LE(plan_bwd.kv_bytes, whole_bwd.kv_bytes) << "rank " << r;
    EXPECT_LE(plan_bwd.dkv_bytes, whole_bwd.dkv_bytes) << "rank " << r;
    EXPECT_EQ(plan_fwd.dkv_bytes, 0u);
    if (c.docs == Docs::kOnes) {
      EXPECT_EQ(plan_fwd.kv_bytes + plan_bwd.kv_bytes + plan_bwd.dkv_bytes, 0u) << "rank " << r;
    }
    if (c.expect_trim) {
      EXPECT_LT(plan_fwd.kv_bytes, whole_fwd.kv_bytes) << "rank " << r;
      EXPECT_LT(plan_bwd.kv_bytes, whole_bwd.kv_bytes) << "rank " << r;
      EXPECT_LT(plan_bwd.dkv_bytes, whole_bwd.dkv_bytes) << "rank " << r;
    }
    full.Gather(r, out, lse, dq, dk, dv);
    // Padding slots: rows that saw nothing and keys that nothing saw.
    std::vector<int64_t> pos(static_cast<size_t>(c.B * L));
    EXPECT_EQ(stria_plan_positions(plan.plan, r, pos.data()), STRIA_SUCCESS);
    int bad = 0;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < L; ++i) {
        if (pos[static_cast<size_t>(b * L + i)] >= 0) continue;
        for (int64_t h = 0; h < c.Hq; ++h) {
          if (!(lse.Get((b * c.Hq + h) * L + i) == -INFINITY)) ++bad;
          for (int64_t d = 0; d < c.D; ++d) {
            if (out.Get(((b * L + i) * c.Hq + h) * c.D + d) != 0.0) ++bad;
            if (dq.Get(((b * L + i) * c.Hq + h) * c.D + d) != 0.0) ++bad;
          }
        }
        for (int64_t h = 0; h < c.Hkv; ++h)
          for (int64_t d = 0; d < c.D; ++d)
            if (dk.Get(((b * L + i) * c.Hkv + h) * c.D + d) != 0.0 ||
                dv.Get(((b * L + i) * c.Hkv + h) * c.D + d) != 0.0)
              ++bad;
      }
    EXPECT_EQ(bad, 0) << "rank " << r << ": padding slots that are not empty rows";
  });
  for (int r = 0; r < c.world; ++r)
    ASSERT_TRUE(errors[static_cast<size_t>(r)].empty()) << errors[static_cast<size_t>(r)];
  full.ExpectMatches(ref, Tolerance(c.dt), 1e-5);
}

class PlanVsReference : public ::testing::TestWithParam<PlanCase> {};
TEST_P(PlanVsReference, ForwardAndBackward) {
  RunPlanCase(GetParam());
}

std::vector<PlanCase> RankCounts() {
  std::vector<PlanCase> cases;
  // Every rank count, causal and not, with S not divisible by N (S = 29) and random documents.
  for (int n = 1; n <= 8; ++n)
    for (bool causal : {true, false}) cases.push_back(PlanCase{n, causal, Dt::kF32, 2, 29, 2, 1, 8});
  // Documents of one token, a single document, a few long ones among short ones.
  for (int n : {1, 3, 4}) {
    cases.push_back(PlanCase{n, true, Dt::kF32, 1, 17, 2, 2, 8, Docs::kOnes});
    cases.push_back(PlanCase{n, true, Dt::kF32, 2, 40, 2, 1, 8, Docs::kSingle});
    cases.push_back(PlanCase{n, false, Dt::kF32, 1, 40, 2, 1, 8, Docs::kSingle});
    cases.push_back(PlanCase{n, true, Dt::kF32, 2, 61, 4, 2, 16, Docs::kFewLong});
  }
  // S below N tiles (the default tile, 128: nothing is split; documents are kept or cut in pieces).
  for (int n : {2, 5, 7}) {
    PlanCase c{n, true, Dt::kF32, 2, 23, 2, 1, 8};
    c.tile = 128;
    cases.push_back(c);
  }
  // The plain calls (the plan's own boundaries), more documents, more blocks per rank.
  for (int n : {2, 6}) {
    PlanCase c{n, true, Dt::kF32, 2, 150, 4, 1, 16, Docs::kRandom, 9};
    c.pass_cu = false;
    cases.push_back(c);
  }
  // A fixed local_len, well above what the plan needs: the rest is padding.
  for (int n : {2, 5}) {
    PlanCase c{n, true, Dt::kF32, 2, 40, 2, 1, 8, Docs::kFewLong};
    c.local_len = 32;
    cases.push_back(c);
  }
  // Blocks several kernel tiles long (the CPU kernels' 64): whole tiles of split documents, and
  // messages trimmed to the rows later ranks see (a block's kept documents never travel).
  for (int n : {2, 3, 8})
    for (bool causal : {true, false}) {
      PlanCase c{n, causal, Dt::kF32, n == 3 ? 2 : 1, 1000, 2, 1, 16, Docs::kFewLong};
      c.tile = 64;
      c.expect_trim = true;
      cases.push_back(c);
    }
  for (int n : {4, 7}) {
    PlanCase c{n, true, Dt::kF32, 1, 1200, 4, 2, 8, Docs::kRandom, 40};
    c.tile = 64;
    c.expect_trim = true;
    cases.push_back(c);
  }
  return cases;
}

std::vector<PlanCase> DtypesAndWindows() {
  std::vector<PlanCase> cases;
  for (Dt dt : {Dt::kF16, Dt::kBF16})
    for (int n : {2, 5}) cases.push_back(PlanCase{n, true, dt, 2, 90, 4, 2, 32, Docs::kFewLong});
  // Long enough to trim: float16 travels as rows (by 128-row tiles), bfloat16 as the bf16 tiles.
  for (Dt dt : {Dt::kF16, Dt::kBF16}) {
    PlanCase c{4, true, dt, 1, 2000, 2, 1, 16, Docs::kRandom, 30};
    c.tile = 64;
    c.expect_trim = true;
    cases.push_back(c);
  }
  cases.push_back(PlanCase{3, false, Dt::kBF16, 1, 130, 4, 1, 64});
  // GQA 4:1 and MQA.
  cases.push_back(PlanCase{4, true, Dt::kF32, 1, 70, 8, 2, 16});
  cases.push_back(PlanCase{3, true, Dt::kF32, 2, 55, 4, 1, 8, Docs::kFewLong});
  // Windows, causal and not, with the plan balanced for them and a plan for no window (the
  // mask is the call's either way).
  for (int n : {2, 3, 7})
    for (bool causal : {true, false}) {
      PlanCase c{n, causal, Dt::kF32, 2, 64, 2, 1, 8, Docs::kFewLong};
      c.window = causal ? Window{5, -1} : Window{4, 3};
      cases.push_back(c);
    }
  for (bool causal : {true, false}) {
    PlanCase c{5, causal, Dt::kF32, 1, 1500, 2, 1, 8, Docs::kFewLong};
    c.tile = 64;
    c.window = causal ? Window{150, -1} : Window{100, 70};
    c.expect_trim = true;
    cases.push_back(c);
  }
  // A batch row of a block that no later rank sees does not travel, while a query of the rank it
  // reaches has keys of its document there, none visible (past the causal cut): the query's empty
  // interval must not lead the kernels into that row's tile, where the NaN of the first call is
  // (the bf16 kernels' products take whole tiles). Empty documents among them.
  for (Window w : {Window{}, Window{23, -1}}) {
    PlanCase c{6, true, Dt::kBF16, 2, 61, 4, 2, 8, Docs::kGiven, 8};
    c.given = {0, 0, 19, 21, 33, 44, 52, 60, 61, 0, 1, 4, 25, 43, 44, 45, 61, 61};
    c.window = w;
    cases.push_back(c);
  }
  PlanCase single{4, true, Dt::kF32, 1, 96, 2, 1, 8, Docs::kSingle};
  single.window = Window{9, -1};
  cases.push_back(single);
  return cases;
}

std::string ParamName(const ::testing::TestParamInfo<PlanCase>& info) {
  return Name(info.param);
}
INSTANTIATE_TEST_SUITE_P(RankCounts, PlanVsReference, ::testing::ValuesIn(RankCounts()), ParamName);
INSTANTIATE_TEST_SUITE_P(DtypesAndWindows, PlanVsReference, ::testing::ValuesIn(DtypesAndWindows()), ParamName);

// Positions cover 0..S-1 once per batch row; shard then unshard is the identity; padding is zero.
TEST(PlanRoundTrip, PositionsShardAndUnshard) {
  std::mt19937_64 rng(5);
  for (int n = 1; n <= 8; ++n)
    for (int64_t S : {1, 7, 64, 333})
      for (int64_t tile : {1, 4, 128})
        for (int docs : {1, 3, 40}) {
          if (docs > S) continue;  // at most one document a token
          SCOPED_TRACE("N " + std::to_string(n) + " S " + std::to_string(S) + " tile " + std::to_string(tile) +
                       " docs " + std::to_string(docs));
          const int64_t B = 2;
          const std::vector<int64_t> cu = RandomDocuments(B, S, docs, rng);
          PlanHandle plan(Config(n, true, tile), cu, B, docs, S);
          ASSERT_EQ(plan.status, STRIA_SUCCESS) << stria_get_last_error();
          const int64_t L = plan.local_len();
          std::vector<int> seen(static_cast<size_t>(B * S), 0);
          Tensor full({B, S, 3}, Dt::kF32), back({B, S, 3}, Dt::kF32);
          full.FillRandom(rng);
          back.Poison();
          for (int r = 0; r < n; ++r) {
            std::vector<int64_t> pos(static_cast<size_t>(B * L));
            ASSERT_EQ(stria_plan_positions(plan.plan, r, pos.data()), STRIA_SUCCESS) << stria_get_last_error();
            for (int64_t b = 0; b < B; ++b)
              for (int64_t i = 0; i < L; ++i) {
                const int64_t p = pos[static_cast<size_t>(b * L + i)];
                ASSERT_GE(p, -1);
                ASSERT_LT(p, S);
                if (p >= 0) ++seen[static_cast<size_t>(b * S + p)];
              }
            Tensor local({B, L, 3}, Dt::kF32);
            local.Poison();
            ASSERT_EQ(stria_plan_shard(plan.plan, r, 1, &full.dl, &local.dl, nullptr), STRIA_SUCCESS);
            for (int64_t b = 0; b < B; ++b)
              for (int64_t i = 0; i < L; ++i)
                for (int64_t x = 0; x < 3; ++x) {
                  const int64_t p = pos[static_cast<size_t>(b * L + i)];
                  const double want = p < 0 ? 0.0 : full.Get((b * S + p) * 3 + x);
                  ASSERT_EQ(local.Get((b * L + i) * 3 + x), want);
                }
            ASSERT_EQ(stria_plan_unshard(plan.plan, r, -2, &local.dl, &back.dl, nullptr), STRIA_SUCCESS);
          }
          for (int x : seen) ASSERT_EQ(x, 1);
          EXPECT_EQ(RelError(back.ToDouble(), full.ToDouble()), 0.0);
        }
}

// The balance the plan is for, from stria_plan_analyze_balance: lognormal document lengths (median
// 1k tokens, capped at 15k) at the GPU kernels' 128-token tiles. These are properties of the
// solver's arithmetic (no timing): at least 0.85 of ideal, never below a fixed layout, and a
// single document no slower than the striped layout by more than 2%.
std::vector<int64_t> Lognormal(int64_t S, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::lognormal_distribution<double> len(std::log(1000.0), 1.0);
  std::vector<int64_t> cu{0};
  while (cu.back() < S)
    cu.push_back(std::min(S, cu.back() + std::min<int64_t>(15000, std::max<int64_t>(1, std::llround(len(g))))));
  return cu;
}

double OfIdeal(const stria_plan_config_t& cfg, const std::vector<int64_t>& cu, int64_t S, int64_t tile) {
  PlanHandle plan(cfg, cu, 1, static_cast<int64_t>(cu.size()) - 1, S);
  EXPECT_EQ(plan.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_balance_t b;
  b.struct_size = sizeof b;
  EXPECT_EQ(stria_plan_analyze_balance(plan.plan, tile, &b, nullptr), STRIA_SUCCESS) << stria_get_last_error();
  return b.ideal_latency / b.ring_latency;
}

TEST(PlanBalance, LognormalDocumentsAtGpuTiles) {
  struct Shape {
    int64_t S;
    int N;
  };
  for (Shape sh : {Shape{32768, 8}, Shape{131072, 8}, Shape{262144, 16}})
    for (uint64_t seed : {1, 2, 3}) {
      SCOPED_TRACE("S " + std::to_string(sh.S) + " N " + std::to_string(sh.N) + " seed " + std::to_string(seed));
      const std::vector<int64_t> cu = Lognormal(sh.S, seed);
      stria_plan_config_t cfg = Config(sh.N, true, 128);
      const double plan = OfIdeal(cfg, cu, sh.S, 128);
      EXPECT_GE(plan, 0.85);
      cfg.strategy = STRIA_PLAN_LAYOUT;
      for (stria_layout_t layout : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
        cfg.layout = layout;
        EXPECT_GT(plan, OfIdeal(cfg, cu, sh.S, 128)) << LayoutName(layout);
      }
    }
}

TEST(PlanBalance, OneDocumentKeepsUpWithStriped) {
  for (int64_t S : {16384, 131072})
    for (int N : {2, 3, 8, 16})
      for (bool causal : {true, false}) {
        SCOPED_TRACE("S " + std::to_string(S) + " N " + std::to_string(N) + (causal ? " causal" : ""));
        const std::vector<int64_t> cu{0, S};
        stria_plan_config_t cfg = Config(N, causal, 128);
        const double plan = OfIdeal(cfg, cu, S, 128);
        cfg.strategy = STRIA_PLAN_LAYOUT;
        cfg.layout = STRIA_LAYOUT_STRIPED;
        if (S % N != 0) continue;
        EXPECT_GE(plan, OfIdeal(cfg, cu, S, 128) / 1.02);
      }
}

// The older stria_balance_t (without ideal_latency) still works, and gets the fields it has.
TEST(PlanBalance, OlderBalanceStruct) {
  const std::vector<int64_t> cu{0, 100, 300, 512};
  PlanHandle plan(Config(4, true, 16), cu, 1, 3, 512);
  ASSERT_EQ(plan.status, STRIA_SUCCESS);
  stria_balance_t b;
  std::memset(&b, 0x5a, sizeof b);
  b.struct_size = offsetof(stria_balance_t, ideal_latency);
  ASSERT_EQ(stria_plan_analyze_balance(plan.plan, 16, &b, nullptr), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_GT(b.ring_latency, 0);
  double untouched;
  std::memset(&untouched, 0x5a, sizeof untouched);
  EXPECT_EQ(std::memcmp(&b.ideal_latency, &untouched, sizeof untouched), 0);
  ASSERT_EQ(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 512, 4, 16, &b), STRIA_SUCCESS);
  EXPECT_EQ(std::memcmp(&b.ideal_latency, &untouched, sizeof untouched), 0);
}

// stria_attention_params_t grew `plan` in 0.3, the mask and score fields in 0.4 and the FP8 descales
// in 0.7: a program built against an older header binds to that version's
// stria_attention_params_init (libstria.map), which must fill the older struct only, and the calls
// must take that struct (with the fields it lacks at their defaults). One built now gets the whole
// struct.
TEST(PlanParams, OlderCallersGetTheOlderStruct) {
  using Init = stria_status_t (*)(stria_attention_params_t*);
  auto init_0_2 = reinterpret_cast<Init>(dlvsym(RTLD_DEFAULT, "stria_attention_params_init", "STRIA_0.2"));
  auto init_0_3 = reinterpret_cast<Init>(dlvsym(RTLD_DEFAULT, "stria_attention_params_init", "STRIA_0.3"));
  auto init_0_4 = reinterpret_cast<Init>(dlvsym(RTLD_DEFAULT, "stria_attention_params_init", "STRIA_0.4"));
  auto new_init = reinterpret_cast<Init>(dlvsym(RTLD_DEFAULT, "stria_attention_params_init", "STRIA_0.7"));
  ASSERT_NE(init_0_2, nullptr) << dlerror();
  ASSERT_NE(init_0_3, nullptr) << dlerror();
  ASSERT_NE(init_0_4, nullptr) << dlerror();
  ASSERT_NE(new_init, nullptr) << dlerror();
  EXPECT_EQ(reinterpret_cast<void*>(new_init), reinterpret_cast<void*>(&stria_attention_params_init));
  const size_t v1 = offsetof(stria_attention_params_t, plan), v2 = offsetof(stria_attention_params_t, cu_seqlens),
               v3 = offsetof(stria_attention_params_t, q_descale);
  alignas(stria_attention_params_t) unsigned char buf[sizeof(stria_attention_params_t) + 16];
  auto* p = reinterpret_cast<stria_attention_params_t*>(buf);
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  stria_context_t ctx = nullptr;
  ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS);
  AttentionTensors t(1, 8, 2, 2, 8, Dt::kF32, 3);
  // The older structs run a call (the layout's; the bytes after them are never read).
  for (auto [init, size] : {std::pair<Init, size_t>{init_0_2, v1}, std::pair<Init, size_t>{init_0_3, v2},
                            std::pair<Init, size_t>{init_0_4, v3}}) {
    std::memset(buf, 0xab, sizeof buf);
    ASSERT_EQ(init(p), STRIA_SUCCESS);
    EXPECT_EQ(p->struct_size, size);
    for (size_t i = size; i < sizeof buf; ++i) ASSERT_EQ(buf[i], 0xab) << "byte " << i << " written";
    EXPECT_EQ(stria_attention_forward(ctx, p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
  }
  std::memset(buf, 0xab, sizeof buf);
  ASSERT_EQ(new_init(p), STRIA_SUCCESS);
  EXPECT_EQ(p->struct_size, sizeof(stria_attention_params_t));
  EXPECT_EQ(p->plan, nullptr);
  EXPECT_EQ(p->cu_seqlens, nullptr);
  EXPECT_EQ(p->window_left, -1);
  EXPECT_EQ(p->window_right, -1);
  EXPECT_EQ(p->softcap, 0.f);
  EXPECT_EQ(p->sinks, nullptr);
  EXPECT_EQ(p->q_descale, nullptr);
  EXPECT_EQ(p->k_descale, nullptr);
  EXPECT_EQ(p->v_descale, nullptr);
  EXPECT_EQ(stria_attention_forward(ctx, p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr), STRIA_SUCCESS);
  // A struct of neither size, or fields beyond the library's set: refused, the context usable.
  for (size_t bad : {v1 - 4, v1 + 4, v2 + 8, v3 + 8}) {
    p->struct_size = bad;
    EXPECT_EQ(stria_attention_forward(ctx, p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr),
              STRIA_ERROR_INVALID_ARGUMENT)
        << "struct_size " << bad;
  }
  p->struct_size = sizeof(stria_attention_params_t) + 8;
  EXPECT_EQ(stria_attention_forward(ctx, p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr),
            STRIA_ERROR_UNSUPPORTED);
  p->struct_size = sizeof(stria_attention_params_t);
  EXPECT_EQ(stria_attention_forward(ctx, p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr), STRIA_SUCCESS);
  stria_context_destroy(ctx);
}

// Bad boundaries and configs: a clear error, nothing created.
TEST(PlanErrors, CreateRefusesBadInput) {
  stria_plan_config_t cfg = Config(4, true, 16);
  stria_plan_t plan = reinterpret_cast<stria_plan_t>(0x1);
  auto create = [&](const std::vector<int64_t>& cu, int64_t B, int64_t n, int64_t S) {
    plan = reinterpret_cast<stria_plan_t>(0x1);
    const stria_status_t st = stria_plan_create(&cfg, cu.empty() ? nullptr : cu.data(), n, B, S, &plan);
    EXPECT_EQ(plan, nullptr);
    return st;
  };
  EXPECT_EQ(create({0, 5, 3, 10}, 1, 3, 10), STRIA_ERROR_INVALID_ARGUMENT);  // unsorted
  EXPECT_NE(std::string(stria_get_last_error()).find("decreases"), std::string::npos) << stria_get_last_error();
  EXPECT_EQ(create({1, 5, 10}, 1, 2, 10), STRIA_ERROR_INVALID_ARGUMENT);  // not from 0
  EXPECT_EQ(create({0, 5, 12}, 1, 2, 10), STRIA_ERROR_INVALID_ARGUMENT);  // beyond S
  EXPECT_EQ(create({0, 5, 9}, 1, 2, 10), STRIA_ERROR_INVALID_ARGUMENT);   // not ending at S
  EXPECT_NE(std::string(stria_get_last_error()).find("ends at 9"), std::string::npos) << stria_get_last_error();
  EXPECT_EQ(create({0, 10}, 1, 0, 10), STRIA_ERROR_INVALID_ARGUMENT);  // no documents
  EXPECT_EQ(create({}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);       // NULL boundaries
  EXPECT_EQ(create({0, 10}, 0, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);  // no batch row
  EXPECT_EQ(create({0, 0}, 1, 1, 0), STRIA_ERROR_INVALID_ARGUMENT);    // no tokens
  cfg.world_size = 0;
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  cfg = Config(4, true, -1);
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  cfg = Config(4, true, 16, Window{-3, -1});
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  cfg = Config(4, true, 16);
  cfg.strategy = static_cast<stria_plan_strategy_t>(7);
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  cfg.strategy = STRIA_PLAN_LAYOUT;
  cfg.layout = STRIA_LAYOUT_ZIGZAG;
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);  // 10 is not a multiple of 2N
  cfg = Config(4, true, 16);
  cfg.local_len = 2;  // these documents need 3 slots on some rank at least
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("too small"), std::string::npos) << stria_get_last_error();
  cfg.local_len = -1;
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  cfg = Config(4, true, 16);
  cfg.struct_size = 8;
  EXPECT_EQ(create({0, 10}, 1, 1, 10), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_create(nullptr, nullptr, 1, 1, 10, &plan), STRIA_ERROR_INVALID_ARGUMENT);
  cfg = Config(4, true, 16);
  const int64_t cu[] = {0, 10};
  EXPECT_EQ(stria_plan_create(&cfg, cu, 1, 1, 10, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
}

TEST(PlanErrors, HandlesAndQueries) {
  const std::vector<int64_t> cu{0, 4, 10};
  PlanHandle plan(Config(3, true, 2), cu, 1, 2, 10);
  ASSERT_EQ(plan.status, STRIA_SUCCESS);
  int64_t pos[64];
  stria_plan_info_t info;
  info.struct_size = sizeof info;
  EXPECT_EQ(stria_plan_get_info(nullptr, &info), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_get_info(plan.plan, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  info.struct_size = 4;
  EXPECT_EQ(stria_plan_get_info(plan.plan, &info), STRIA_ERROR_INVALID_ARGUMENT);
  info.struct_size = sizeof info;
  ASSERT_EQ(stria_plan_get_info(plan.plan, &info), STRIA_SUCCESS);
  EXPECT_EQ(info.world_size, 3);
  EXPECT_EQ(info.batch, 1);
  EXPECT_EQ(info.num_seqs, 2);
  EXPECT_EQ(info.seq_len, 10);
  EXPECT_GE(info.local_len, 4);
  EXPECT_EQ(stria_plan_positions(plan.plan, 3, pos), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_positions(plan.plan, -1, pos), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_positions(plan.plan, 0, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  stria_balance_t b;
  b.struct_size = sizeof b;
  EXPECT_EQ(stria_plan_analyze_balance(plan.plan, 0, &b, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_analyze_balance(plan.plan, 1, nullptr, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  // Shard: wrong lengths, a batch that is not dimension 0.
  Tensor full({1, 10, 2}, Dt::kF32), local({1, 5, 2}, Dt::kF32), wrong({1, 9, 2}, Dt::kF32);
  EXPECT_EQ(stria_plan_shard(plan.plan, 0, 1, &wrong.dl, &local.dl, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_shard(plan.plan, 0, 1, &full.dl, &wrong.dl, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_shard(plan.plan, 0, 5, &full.dl, &local.dl, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_shard(plan.plan, 0, 1, nullptr, &local.dl, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  // A destroyed plan is refused, not followed.
  stria_plan_t gone = nullptr;
  stria_plan_config_t cfg = Config(2, true, 2);
  ASSERT_EQ(stria_plan_create(&cfg, cu.data(), 2, 1, 10, &gone), STRIA_SUCCESS);
  ASSERT_EQ(stria_plan_destroy(gone), STRIA_SUCCESS);
  EXPECT_EQ(stria_plan_destroy(gone), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_get_info(gone, &info), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("not a live plan"), std::string::npos);
  EXPECT_EQ(stria_plan_destroy(nullptr), STRIA_ERROR_INVALID_ARGUMENT);
}

// A call whose plan does not fit it fails on every rank with a clear error, and the contexts stay
// usable: the same group then runs a correct call.
TEST(PlanErrors, MismatchedCallsFailEverywhereAndLeaveContextsUsable) {
  const int n = 3;
  const int64_t S = 30, B = 1, H = 2, D = 8;
  const std::vector<int64_t> cu{0, 7, 19, 30}, other{0, 8, 19, 30};
  PlanHandle plan(Config(n, true, 4), cu, B, 3, S), plan_other(Config(n, true, 4), other, B, 3, S);
  PlanHandle plan_world(Config(n + 1, true, 4), cu, B, 3, S);
  ASSERT_EQ(plan.status, STRIA_SUCCESS);
  const int64_t L = plan.local_len();
  LocalGroup group(n, 20.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  enum Mistake { kOtherBoundaries, kOtherPlanOnRankOne, kWrongLength, kWrongWorld, kDestroyed, kNone };
  stria_plan_t destroyed = nullptr;
  {
    stria_plan_config_t cfg = Config(n, true, 4);
    ASSERT_EQ(stria_plan_create(&cfg, cu.data(), 3, B, S, &destroyed), STRIA_SUCCESS);
    ASSERT_EQ(stria_plan_destroy(destroyed), STRIA_SUCCESS);
  }
  for (Mistake m : {kOtherBoundaries, kOtherPlanOnRankOne, kWrongLength, kWrongWorld, kDestroyed, kNone}) {
    SCOPED_TRACE("mistake " + std::to_string(static_cast<int>(m)));
    std::vector<stria_status_t> st(static_cast<size_t>(n));
    std::vector<std::string> msg(static_cast<size_t>(n));
    RunRanks(n, [&](int r) {
      const int64_t len = m == kWrongLength ? L + 1 : L;
      AttentionTensors t(B, len, H, H, D, Dt::kF32, 11 + static_cast<uint64_t>(r));
      stria_attention_params_t p;
      stria_attention_params_init(&p);
      p.plan = m == kOtherPlanOnRankOne && r == 1 ? plan_other.plan
               : m == kWrongWorld                 ? plan_world.plan
               : m == kDestroyed                  ? destroyed
                                                  : plan.plan;
      const std::vector<int64_t>& given = m == kOtherBoundaries ? other : cu;
      stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
      // Ranks with plans from different boundaries, each consistent on its own, meet in the
      // call's signature: through the plain call (the plans' own boundaries).
      st[static_cast<size_t>(r)] =
          m == kOtherPlanOnRankOne
              ? stria_attention_forward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr)
              : stria_attention_forward_documents(ctx, &p, given.data(), 3, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl,
                                                  &t.lse.dl, nullptr);
      msg[static_cast<size_t>(r)] = stria_get_last_error();
    });
    for (int r = 0; r < n; ++r) {
      if (m == kNone) {
        EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << msg[static_cast<size_t>(r)];
      } else {
        EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_ERROR_INVALID_ARGUMENT) << "rank " << r;
        EXPECT_FALSE(msg[static_cast<size_t>(r)].empty());
      }
    }
    if (m == kOtherBoundaries) {
      EXPECT_NE(msg[0].find("not the boundaries"), std::string::npos) << msg[0];
    }
  }
}

}  // namespace
