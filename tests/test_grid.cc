// Attention on a grid (stria_context_set_grid: all-to-all groups of U ranks, a ring of R groups)
// against the float64 dense reference of the whole sequence: grids 1xN, Nx1 and between them, every
// layout, causal and not, GQA (K/V heads split over the group, and shared by its members when there
// are fewer than U) and MQA, every dtype, documents, windows, softcap and sinks, forward and
// backward. Inputs are sharded with stria_grid_shard and outputs gathered with stria_grid_unshard
// into poisoned tensors. Then the grid's own API: positions, shard, bad arguments, disagreeing
// ranks, the bytes the all-to-all moves.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <sstream>

#include "ring_results.h"
#include "test_util.h"

using namespace stria_test;

namespace {

const stria_layout_t kLayouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG};

struct Case {
  int U, R;
  stria_layout_t layout;
  bool causal;
  Dt dt;
  int64_t B, L, Hq, Hkv, D;
  int docs = 0;  // > 0: a document mask of this many documents per batch row
  Window window{};
  double softcap = 0;
  bool sinks = false;
  bool strided = false;  // q, k, v as head views of one packed tensor
  int world() const { return U * R; }
};

std::string Name(const Case& c) {
  std::ostringstream os;
  os << "U" << c.U << "xR" << c.R << "_" << LayoutName(c.layout) << (c.causal ? "_causal" : "_full") << "_"
     << DtName(c.dt) << "_B" << c.B << "L" << c.L << "H" << c.Hq << "x" << c.Hkv << "D" << c.D
     << (c.docs > 0 ? "_docs" + std::to_string(c.docs) : "")
     << (c.window.active() ? "_window" + WindowName(c.window) : "") << (c.softcap > 0 ? "_softcap" : "")
     << (c.sinks ? "_sinks" : "") << (c.strided ? "_strided" : "");
  return os.str();
}

// For gtest's messages: the case's name rather than its bytes.
void PrintTo(const Case& c, std::ostream* os) {
  *os << Name(c);
}

double Tolerance(Dt dt) {
  return dt == Dt::kF32 ? 1e-5 : 2e-2;
}

Tensor GridShard(const Tensor& full, const Case& c, int rank) {
  Tensor local({full.shape[0], c.L, full.shape[2], full.shape[3]}, full.dt);
  EXPECT_EQ(stria_grid_shard(c.layout, c.world(), c.U, rank, 1, &full.dl, &local.dl, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  return local;
}

// A [B, L, H, D] view of heads [h0, h0 + H) of a packed [B, L, Htot, D] tensor.
void HeadView(Tensor& packed, int64_t h0, int64_t H, DLTensor* view, std::vector<int64_t>* shape) {
  *view = packed.dl;
  *shape = {packed.shape[0], packed.shape[1], H, packed.shape[3]};
  view->shape = shape->data();
  view->byte_offset = static_cast<uint64_t>(h0 * packed.shape[3] * packed.esize());
}

void RunCase(const Case& c) {
  SCOPED_TRACE(Name(c));
  const int n = c.world();
  const int64_t S = c.L * n;
  std::mt19937_64 rng(99 + c.U * 13 + c.R * 7 + c.layout * 131 + c.Hkv);
  Tensor q({c.B, S, c.Hq, c.D}, c.dt), k({c.B, S, c.Hkv, c.D}, c.dt), v({c.B, S, c.Hkv, c.D}, c.dt);
  Tensor dout({c.B, S, c.Hq, c.D}, c.dt);
  for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
  std::vector<double> sinks;
  Tensor sinks_t({c.Hq}, Dt::kF32);
  if (c.sinks) {
    for (int64_t h = 0; h < c.Hq; ++h) {
      sinks.push_back(0.5 * static_cast<double>(h) - 1.0);
      sinks_t.Set(h, sinks.back());
    }
  }
  std::vector<int64_t> documents;
  if (c.docs > 0) documents = RandomDocuments(c.B, S, c.docs, rng);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto qd = q.ToDouble(), kd = k.ToDouble(), vd = v.ToDouble(), dod = dout.ToDouble();
  ScoreMods mods;
  mods.softcap = c.softcap;
  mods.sinks = c.sinks ? &sinks : nullptr;
  const Reference ref = DenseAttention(qd, kd, vd, &dod, c.B, S, c.Hq, c.Hkv, c.D, c.causal, scale,
                                       c.docs > 0 ? &documents : nullptr, c.window, mods);

  GatheredResults full(c.layout, n, c.B, S, c.Hq, c.Hkv, c.D, c.dt);
  full.UseGrid(c.U);
  LocalGroup group(n, 60.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  for (stria_context_t ctx : group.ctx) ASSERT_EQ(stria_context_set_grid(ctx, c.U), STRIA_SUCCESS);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = c.layout;
  params.causal = c.causal;
  params.softcap = static_cast<float>(c.softcap);
  if (c.docs > 0) {
    params.cu_seqlens = documents.data();
    params.num_seqs = c.docs;
  }
  params.window_left = c.window.left;
  params.window_right = c.window.right;
  if (c.sinks) params.sinks = &sinks_t.dl;

  std::vector<stria_status_t> status(static_cast<size_t>(2 * n));
  std::vector<std::string> errors(static_cast<size_t>(n));
  std::vector<Tensor> dsinks(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    Tensor ql = GridShard(q, c, r), kl = GridShard(k, c, r), vl = GridShard(v, c, r), dol = GridShard(dout, c, r);
    DLTensor qv = ql.dl, kv = kl.dl, vv = vl.dl;
    Tensor packed;
    std::vector<int64_t> qs, ks, vs;
    if (c.strided) {
      packed = PackQKV(ql, kl, vl);
      HeadView(packed, 0, c.Hq, &qv, &qs);
      HeadView(packed, c.Hq, c.Hkv, &kv, &ks);
      HeadView(packed, c.Hq + c.Hkv, c.Hkv, &vv, &vs);
    }
    Tensor out({c.B, c.L, c.Hq, c.D}, c.dt), lse({c.B, c.Hq, c.L}, Dt::kF32);
    Tensor dq({c.B, c.L, c.Hq, c.D}, c.dt), dk({c.B, c.L, c.Hkv, c.D}, c.dt), dv({c.B, c.L, c.Hkv, c.D}, c.dt);
    Tensor& dz = dsinks[static_cast<size_t>(r)];
    dz = Tensor({c.Hq}, Dt::kF32);
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv, &dz}) t->Poison();
    stria_attention_params_t p = params;
    if (c.sinks) p.dsinks = &dz.dl;
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    status[static_cast<size_t>(2 * r)] = stria_attention_forward(ctx, &p, &qv, &kv, &vv, &out.dl, &lse.dl, nullptr);
    std::string err = stria_get_last_error();
    status[static_cast<size_t>(2 * r + 1)] =
        stria_attention_backward(ctx, &p, &qv, &kv, &vv, &out.dl, &lse.dl, &dol.dl, &dq.dl, &dk.dl, &dv.dl, nullptr);
    errors[static_cast<size_t>(r)] = err + stria_get_last_error();
    full.Gather(r, out, lse, dq, dk, dv);
  });
  for (int r = 0; r < 2 * n; ++r)
    ASSERT_EQ(status[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r / 2 << ": " << errors[r / 2];
  full.ExpectMatches(ref, Tolerance(c.dt), c.dt == Dt::kF32 ? 1e-5 : 2e-2);
  if (c.sinks) {  // the ranks' parts add up to the sinks' gradient
    std::vector<double> total(static_cast<size_t>(c.Hq), 0.0);
    for (const Tensor& dz : dsinks)
      for (int64_t h = 0; h < c.Hq; ++h) total[static_cast<size_t>(h)] += dz.Get(h);
    for (int64_t h = 0; h < c.Hq; ++h)
      EXPECT_NEAR(total[static_cast<size_t>(h)], ref.dsinks[static_cast<size_t>(h)],
                  (c.dt == Dt::kF32 ? 1e-5 : 2e-2) * std::max(1.0, ref.dsinks_terms[static_cast<size_t>(h)]))
          << "dsinks head " << h;
  }
}

class GridVsReference : public ::testing::TestWithParam<Case> {};
TEST_P(GridVsReference, ForwardAndBackward) {
  RunCase(GetParam());
}

// The grids U x R: a ring (1 x N), pure all-to-all (N x 1) and the hybrids between, every layout,
// causal and not; heads that split over the group, and fewer K/V heads than members.
std::vector<Case> Grids() {
  std::vector<Case> cases;
  const int grids[][2] = {{1, 3}, {2, 1}, {3, 1}, {4, 1}, {2, 2}, {2, 3}, {3, 2}, {2, 4}, {4, 2}};
  for (const auto& g : grids)
    for (stria_layout_t lay : kLayouts)
      for (bool causal : {true, false}) {
        const int U = g[0];
        const int64_t Hq = U == 3 ? 6 : 4;
        // K/V heads split over the group (U divides Hkv), then shared (Hkv < U), then MQA.
        for (int64_t Hkv : {U == 3 ? int64_t{3} : int64_t{4}, int64_t{U == 4 ? 2 : 1}})
          cases.push_back(Case{U, g[1], lay, causal, Dt::kF32, 2, 6, Hq, Hkv, 16});
      }
  return cases;
}

// Every dtype; documents and windows; softcap and sinks; strided inputs; longer blocks.
std::vector<Case> Features() {
  std::vector<Case> cases;
  for (Dt dt : {Dt::kF16, Dt::kBF16})
    for (stria_layout_t lay : kLayouts) {
      cases.push_back(Case{2, 2, lay, true, dt, 1, 10, 4, 2, 32});
      cases.push_back(Case{4, 2, lay, true, dt, 1, 10, 8, 2, 32});
    }
  for (stria_layout_t lay : kLayouts)
    for (bool causal : {true, false}) {
      Case docs{2, 3, lay, causal, Dt::kF32, 2, 8, 4, 2, 16};
      docs.docs = 4;
      cases.push_back(docs);
      Case window{3, 2, lay, causal, Dt::kF32, 1, 8, 6, 1, 16};
      window.window = Window{5, causal ? -1 : 3};
      cases.push_back(window);
    }
  Case both{2, 2, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 12, 4, 4, 32};
  both.docs = 3;
  both.window = Window{9, -1};
  cases.push_back(both);
  for (int U : {2, 4}) {
    Case mods{U, 2, STRIA_LAYOUT_ZIGZAG, true, Dt::kF32, 1, 8, 8, 2, 16};
    mods.softcap = 2.0;
    mods.sinks = true;
    cases.push_back(mods);
    mods.dt = Dt::kBF16;
    cases.push_back(mods);
  }
  for (Dt dt : {Dt::kF32, Dt::kBF16}) {
    Case strided{2, 2, STRIA_LAYOUT_ZIGZAG, true, dt, 2, 8, 4, 2, 16};
    strided.strided = true;
    cases.push_back(strided);
  }
  cases.push_back(Case{2, 2, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 130, 4, 2, 64});
  cases.push_back(Case{4, 2, STRIA_LAYOUT_ZIGZAG, false, Dt::kBF16, 1, 70, 4, 1, 64});
  // Head chunks (grid.cc: a ring per chunk, the exchanges in flight beside them): members with two
  // and three K/V heads, GQA 2:1 (two chunks and one by default; three where the suite runs again
  // under STRIA_GRID_CHUNKS=4), with documents, sinks and softcap.
  for (int64_t Hkv : {4, 6}) {
    Case chunks{2, 3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 2, 8, 2 * Hkv, Hkv, 16};
    chunks.docs = 3;
    chunks.sinks = true;
    chunks.softcap = 2.0;
    cases.push_back(chunks);
    Case plain{2, 2, STRIA_LAYOUT_ZIGZAG, false, Dt::kBF16, 1, 12, 2 * Hkv, Hkv, 32};
    cases.push_back(plain);
  }
  return cases;
}

std::string ParamName(const ::testing::TestParamInfo<Case>& info) {
  return Name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Grids, GridVsReference, ::testing::ValuesIn(Grids()), ParamName);
INSTANTIATE_TEST_SUITE_P(Features, GridVsReference, ::testing::ValuesIn(Features()), ParamName);

// Every token of the sequence on exactly one rank; each group holds exactly the tokens the layout
// gives its place on a ring of R, in order, split into U contiguous pieces; shard agrees.
TEST(GridLayout, PositionsArePiecesOfTheRingsShares) {
  for (stria_layout_t lay : kLayouts)
    for (int U : {1, 2, 3, 4})
      for (int R : {1, 2, 3}) {
        const int n = U * R;
        const int64_t L = 4, S = L * n;
        SCOPED_TRACE(std::string(LayoutName(lay)) + " U" + std::to_string(U) + " R" + std::to_string(R));
        std::set<int64_t> seen;
        Tensor full({S}, Dt::kF32);
        for (int64_t i = 0; i < S; ++i) full.Set(i, static_cast<double>(i));
        for (int g = 0; g < R; ++g) {
          std::vector<int64_t> ring(static_cast<size_t>(L * U));
          ASSERT_EQ(stria_layout_positions(lay, S, R, g, ring.data()), STRIA_SUCCESS) << stria_get_last_error();
          for (int u = 0; u < U; ++u) {
            std::vector<int64_t> mine(static_cast<size_t>(L));
            ASSERT_EQ(stria_grid_positions(lay, S, n, U, g * U + u, mine.data()), STRIA_SUCCESS)
                << stria_get_last_error();
            Tensor local({L}, Dt::kF32);
            ASSERT_EQ(stria_grid_shard(lay, n, U, g * U + u, 0, &full.dl, &local.dl, nullptr), STRIA_SUCCESS)
                << stria_get_last_error();
            for (int64_t i = 0; i < L; ++i) {
              EXPECT_EQ(mine[static_cast<size_t>(i)], ring[static_cast<size_t>(u * L + i)]);
              EXPECT_EQ(local.Get(i), static_cast<double>(mine[static_cast<size_t>(i)]));
              seen.insert(mine[static_cast<size_t>(i)]);
            }
          }
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), S);
      }
}

// Unshard is shard's inverse along any dimension, and a grid of one group per rank is the layout.
TEST(GridLayout, UnshardInvertsShardAndU1IsThePlainLayout) {
  const int n = 6, U = 3;
  const int64_t S = 12;
  Tensor full({2, 3, S}, Dt::kBF16), back({2, 3, S}, Dt::kBF16);
  std::mt19937_64 rng(5);
  full.FillRandom(rng);
  back.Poison();
  for (int r = 0; r < n; ++r) {
    Tensor local({2, 3, S / n}, Dt::kBF16);
    ASSERT_EQ(stria_grid_shard(STRIA_LAYOUT_ZIGZAG, n, U, r, -1, &full.dl, &local.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
    ASSERT_EQ(stria_grid_unshard(STRIA_LAYOUT_ZIGZAG, n, U, r, -1, &local.dl, &back.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
  }
  EXPECT_EQ(RelError(back.ToDouble(), full.ToDouble()), 0.0);
  std::vector<int64_t> a(4), b(4);
  ASSERT_EQ(stria_grid_positions(STRIA_LAYOUT_STRIPED, 16, 4, 1, 2, a.data()), STRIA_SUCCESS);
  ASSERT_EQ(stria_layout_positions(STRIA_LAYOUT_STRIPED, 16, 4, 2, b.data()), STRIA_SUCCESS);
  EXPECT_EQ(a, b);
}

TEST(GridLayout, BadArgumentsAreRefusedWithAMessage) {
  std::vector<int64_t> pos(8);
  EXPECT_EQ(stria_grid_positions(STRIA_LAYOUT_STRIPED, 16, 4, 3, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("divide world_size"), std::string::npos) << stria_get_last_error();
  EXPECT_EQ(stria_grid_positions(STRIA_LAYOUT_STRIPED, 16, 4, 0, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_positions(STRIA_LAYOUT_STRIPED, 16, 4, 2, 4, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_positions(STRIA_LAYOUT_STRIPED, 18, 4, 2, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  // Zigzag on a ring of 2 groups needs seq_len divisible by 4.
  EXPECT_EQ(stria_grid_positions(STRIA_LAYOUT_ZIGZAG, 6, 6, 3, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_positions(static_cast<stria_layout_t>(7), 16, 4, 2, 0, pos.data()),
            STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_positions(STRIA_LAYOUT_STRIPED, 16, 4, 2, 0, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  Tensor full({16, 2}, Dt::kF32), local({4, 2}, Dt::kF32), wrong({5, 2}, Dt::kF32);
  EXPECT_EQ(stria_grid_shard(STRIA_LAYOUT_STRIPED, 4, 2, 0, 0, &full.dl, &wrong.dl, nullptr),
            STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("seq_len / world_size"), std::string::npos);
  EXPECT_EQ(stria_grid_shard(STRIA_LAYOUT_STRIPED, 4, 2, 0, 2, &full.dl, &local.dl, nullptr),
            STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_shard(STRIA_LAYOUT_STRIPED, 4, 2, 0, 0, nullptr, &local.dl, nullptr),
            STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_unshard(STRIA_LAYOUT_STRIPED, 4, 2, 0, 0, &local.dl, nullptr, nullptr),
            STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_shard(STRIA_LAYOUT_STRIPED, 4, 2, 0, 0, &full.dl, &local.dl, nullptr), STRIA_SUCCESS);
}

// One forward of every rank of a group, tensors [1, L, Hq, D] and [1, L, Hkv, D]; the statuses.
std::vector<stria_status_t> ForwardAll(LocalGroup& group, int64_t L, int64_t Hq, int64_t Hkv,
                                       std::vector<std::string>* errors = nullptr,
                                       const stria_attention_params_t* params = nullptr) {
  const int n = static_cast<int>(group.ctx.size());
  std::vector<stria_status_t> st(static_cast<size_t>(n));
  if (errors != nullptr) errors->assign(static_cast<size_t>(n), "");
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  if (params != nullptr) p = *params;
  RunRanks(n, [&](int r) {
    AttentionTensors t(1, L, Hq, Hkv, 8, Dt::kF32, 7 + static_cast<uint64_t>(r));
    st[static_cast<size_t>(r)] = stria_attention_forward(group.ctx[static_cast<size_t>(r)], &p, &t.q.dl, &t.k.dl,
                                                         &t.v.dl, &t.out.dl, &t.lse.dl, nullptr);
    if (errors != nullptr) (*errors)[static_cast<size_t>(r)] = stria_get_last_error();
  });
  return st;
}

TEST(GridContext, SetGridValidatesAndGetGridAnswers) {
  LocalGroup group(4);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  stria_context_t ctx = group.ctx[0];
  int u = 0;
  ASSERT_EQ(stria_context_get_grid(ctx, &u), STRIA_SUCCESS);
  EXPECT_EQ(u, 1);  // a new context is a plain ring
  for (int bad : {0, -2, 3, 8}) {
    EXPECT_EQ(stria_context_set_grid(ctx, bad), STRIA_ERROR_INVALID_ARGUMENT) << bad;
    EXPECT_NE(std::string(stria_get_last_error()).find("divide the world size 4"), std::string::npos);
  }
  EXPECT_EQ(stria_context_get_grid(ctx, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_context_set_grid(nullptr, 2), STRIA_ERROR_INVALID_ARGUMENT);
  ASSERT_EQ(stria_context_set_grid(ctx, 4), STRIA_SUCCESS);
  ASSERT_EQ(stria_context_get_grid(ctx, &u), STRIA_SUCCESS);
  EXPECT_EQ(u, 4);
  // The bad values left it as it was, and every rank can still run calls once they agree.
  for (stria_context_t c : group.ctx) ASSERT_EQ(stria_context_set_grid(c, 2), STRIA_SUCCESS);
  for (stria_status_t s : ForwardAll(group, 4, 4, 2)) EXPECT_EQ(s, STRIA_SUCCESS);
}

// Heads that do not split over the group: every rank fails with the rule, before anything moves,
// and the group stays usable.
TEST(GridContext, HeadsThatDoNotSplitNameTheRule) {
  LocalGroup group(4);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  for (stria_context_t c : group.ctx) ASSERT_EQ(stria_context_set_grid(c, 4), STRIA_SUCCESS);
  std::vector<std::string> errors;
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {12, 6}}) {
    SCOPED_TRACE("Hq " + std::to_string(hq) + " Hkv " + std::to_string(hkv));
    for (stria_status_t s : ForwardAll(group, 4, hq, hkv, &errors)) EXPECT_EQ(s, STRIA_ERROR_INVALID_ARGUMENT);
    for (const std::string& e : errors)
      EXPECT_NE(e.find("U must divide Hq, and divide Hkv or be a multiple of it"), std::string::npos) << e;
  }
  for (stria_status_t s : ForwardAll(group, 4, 8, 2)) EXPECT_EQ(s, STRIA_SUCCESS);  // 4 K/V heads: shared by 2
}

// Ranks that set different grids: the agreement names the difference; no block moves.
TEST(GridContext, RanksWithDifferentGridsDisagree) {
  LocalGroup group(4);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  ASSERT_EQ(stria_context_set_grid(group.ctx[0], 2), STRIA_SUCCESS);
  ASSERT_EQ(stria_context_set_grid(group.ctx[1], 2), STRIA_SUCCESS);
  std::vector<std::string> errors;
  for (stria_status_t s : ForwardAll(group, 4, 4, 2, &errors)) EXPECT_EQ(s, STRIA_ERROR_INVALID_ARGUMENT);
  for (const std::string& e : errors) EXPECT_NE(e.find("all-to-all groups of 2"), std::string::npos) << e;
  for (int r : {2, 3}) ASSERT_EQ(stria_context_set_grid(group.ctx[static_cast<size_t>(r)], 2), STRIA_SUCCESS);
  for (stria_status_t s : ForwardAll(group, 4, 4, 2)) EXPECT_EQ(s, STRIA_SUCCESS);
}

// Document plans on a grid: a plan made for the ring of R groups, each group's slots cut into U
// pieces (stria_plan_grid_shard), against the reference with the plan's documents; padding slots
// (S not a multiple of anything) attend to nothing.
struct PlanCase {
  int U, R;
  bool causal;
  Dt dt;
  int64_t Hq, Hkv;
};
void PrintTo(const PlanCase& c, std::ostream* os) {
  *os << "U" << c.U << "xR" << c.R << (c.causal ? " causal " : " full ") << DtName(c.dt) << " H" << c.Hq << "x"
      << c.Hkv;
}
class GridOnAPlan : public ::testing::TestWithParam<PlanCase> {};

TEST_P(GridOnAPlan, MatchesReference) {
  const PlanCase& c = GetParam();
  const int n = c.U * c.R;
  const int64_t B = 2, S = 53, D = 16;
  std::mt19937_64 rng(31 + n);
  const std::vector<int64_t> documents = RandomDocuments(B, S, 5, rng);
  stria_plan_config_t pc;
  stria_plan_config_init(&pc);
  pc.world_size = c.R;
  pc.causal = c.causal;
  pc.tile = 4;
  stria_plan_t plan = nullptr;
  ASSERT_EQ(stria_plan_create(&pc, documents.data(), 5, B, S, &plan), STRIA_SUCCESS) << stria_get_last_error();
  stria_plan_info_t info;
  info.struct_size = sizeof info;
  ASSERT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS);
  if (info.local_len % c.U != 0) {  // a local_len the group splits evenly
    stria_plan_destroy(plan);
    pc.local_len = (info.local_len + c.U - 1) / c.U * c.U;
    ASSERT_EQ(stria_plan_create(&pc, documents.data(), 5, B, S, &plan), STRIA_SUCCESS) << stria_get_last_error();
    ASSERT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS);
  }
  const int64_t L = info.local_len / c.U;
  Tensor q({B, S, c.Hq, D}, c.dt), k({B, S, c.Hkv, D}, c.dt), v({B, S, c.Hkv, D}, c.dt), dout({B, S, c.Hq, D}, c.dt);
  for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
  const auto dd = dout.ToDouble();
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dd, B, S, c.Hq, c.Hkv, D, c.causal,
                                       1.0 / std::sqrt(static_cast<double>(D)), &documents);
  GatheredResults full(STRIA_LAYOUT_STRIPED, n, B, S, c.Hq, c.Hkv, D, c.dt);
  full.UsePlan(plan);
  full.UseGrid(c.U);
  LocalGroup group(n, 60.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  for (stria_context_t ctx : group.ctx) ASSERT_EQ(stria_context_set_grid(ctx, c.U), STRIA_SUCCESS);
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.causal = c.causal;
  params.plan = plan;
  std::vector<std::string> errors(static_cast<size_t>(n));
  RunRanks(n, [&](int r) {
    auto shard = [&](const Tensor& t) {
      Tensor local({B, L, t.shape[2], D}, c.dt);
      EXPECT_EQ(stria_plan_grid_shard(plan, c.U, r, 1, &t.dl, &local.dl, nullptr), STRIA_SUCCESS)
          << stria_get_last_error();
      return local;
    };
    Tensor ql = shard(q), kl = shard(k), vl = shard(v), dol = shard(dout);
    Tensor out({B, L, c.Hq, D}, c.dt), lse({B, c.Hq, L}, Dt::kF32);
    Tensor dq({B, L, c.Hq, D}, c.dt), dk({B, L, c.Hkv, D}, c.dt), dv({B, L, c.Hkv, D}, c.dt);
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->Poison();
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    stria_status_t st = stria_attention_forward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr);
    if (st == STRIA_SUCCESS)
      st = stria_attention_backward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, &dol.dl, &dq.dl, &dk.dl,
                                    &dv.dl, nullptr);
    if (st != STRIA_SUCCESS) errors[static_cast<size_t>(r)] = stria_get_last_error();
    full.Gather(r, out, lse, dq, dk, dv);
  });
  for (int r = 0; r < n; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  full.ExpectMatches(ref, Tolerance(c.dt), c.dt == Dt::kF32 ? 1e-5 : 2e-2);
  stria_plan_destroy(plan);
}

INSTANTIATE_TEST_SUITE_P(Plans, GridOnAPlan,
                         ::testing::Values(PlanCase{2, 2, true, Dt::kF32, 4, 2}, PlanCase{2, 2, false, Dt::kF32, 4, 4},
                                           PlanCase{3, 2, true, Dt::kF32, 6, 1}, PlanCase{2, 3, true, Dt::kBF16, 4, 2},
                                           PlanCase{4, 1, true, Dt::kF32, 8, 2}));

// A plan on a grid is made for the ring of groups: one made for all N ranks, or whose slots the
// group cannot split evenly, is refused with the reason; its grid placement checks its arguments.
TEST(GridContext, PlansForTheWrongRingAreRefused) {
  LocalGroup group(4);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  for (stria_context_t c : group.ctx) ASSERT_EQ(stria_context_set_grid(c, 2), STRIA_SUCCESS);
  const int64_t cu[] = {0, 3, 15};
  stria_plan_config_t pc;
  stria_plan_config_init(&pc);
  pc.world_size = 4;  // all N ranks: wrong on a grid of 2 groups
  pc.tile = 4;
  stria_plan_t plan = nullptr;
  ASSERT_EQ(stria_plan_create(&pc, cu, 2, 1, 15, &plan), STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.plan = plan;
  std::vector<std::string> errors;
  for (stria_status_t s : ForwardAll(group, 4, 2, 2, &errors, &p)) EXPECT_EQ(s, STRIA_ERROR_INVALID_ARGUMENT);
  for (const std::string& e : errors) EXPECT_NE(e.find("made for the ring of groups"), std::string::npos) << e;
  stria_plan_destroy(plan);
  pc.world_size = 2;
  pc.local_len = 9;  // odd: two members cannot split it
  ASSERT_EQ(stria_plan_create(&pc, cu, 2, 1, 15, &plan), STRIA_SUCCESS) << stria_get_last_error();
  p.plan = plan;
  for (stria_status_t s : ForwardAll(group, 4, 2, 2, &errors, &p)) EXPECT_EQ(s, STRIA_ERROR_INVALID_ARGUMENT);
  for (const std::string& e : errors) EXPECT_NE(e.find("local_len / 2"), std::string::npos) << e;
  std::vector<int64_t> pos(9);
  EXPECT_EQ(stria_plan_grid_positions(plan, 2, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("not divisible by ulysses_size 2"), std::string::npos);
  EXPECT_EQ(stria_plan_grid_positions(plan, 3, 0, pos.data()), STRIA_SUCCESS);                 // 9 slots in 3 pieces
  EXPECT_EQ(stria_plan_grid_positions(plan, 3, 6, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);  // 2 x 3 ranks
  EXPECT_EQ(stria_plan_grid_positions(plan, 0, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_grid_positions(plan, 3, 0, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_plan_grid_positions(nullptr, 3, 0, pos.data()), STRIA_ERROR_INVALID_ARGUMENT);
  // The pieces of ring rank 1 are its plan slots, in order.
  std::vector<int64_t> ring(9), pieces;
  ASSERT_EQ(stria_plan_positions(plan, 1, ring.data()), STRIA_SUCCESS);
  for (int u = 0; u < 3; ++u) {
    std::vector<int64_t> piece(3);
    ASSERT_EQ(stria_plan_grid_positions(plan, 3, 3 + u, piece.data()), STRIA_SUCCESS);
    pieces.insert(pieces.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(pieces, ring);
  stria_plan_destroy(plan);
}

// What the all-to-all moves: each member sends every other member its share of q, k and v for
// their heads, and gets back out and lse; the backward's the six inputs and three gradients.
TEST(GridContext, TrafficCountsTheAllToAllBytes) {
  const int U = 4, R = 2, n = U * R;
  const int64_t B = 2, L = 6, Hq = 8, Hkv = 2, D = 8;  // K/V heads shared by two members each
  LocalGroup group(n);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  for (stria_context_t c : group.ctx) ASSERT_EQ(stria_context_set_grid(c, U), STRIA_SUCCESS);
  std::vector<stria_traffic_t> fwd(static_cast<size_t>(n)), bwd(static_cast<size_t>(n));
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  RunRanks(n, [&](int r) {
    AttentionTensors t(B, L, Hq, Hkv, D, Dt::kBF16, 3);
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    EXPECT_EQ(stria_attention_forward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr),
              STRIA_SUCCESS);
    fwd[static_cast<size_t>(r)].struct_size = sizeof(stria_traffic_t);
    EXPECT_EQ(stria_context_get_traffic(ctx, &fwd[static_cast<size_t>(r)]), STRIA_SUCCESS);
    EXPECT_EQ(stria_attention_backward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, &t.dout.dl, &t.dq.dl,
                                       &t.dk.dl, &t.dv.dl, nullptr),
              STRIA_SUCCESS);
    bwd[static_cast<size_t>(r)].struct_size = sizeof(stria_traffic_t);
    EXPECT_EQ(stria_context_get_traffic(ctx, &bwd[static_cast<size_t>(r)]), STRIA_SUCCESS);
  });
  const uint64_t others = U - 1, q = B * L * (Hq / U) * D * 2, kv = B * L * 1 * D * 2, lse = B * (Hq / U) * L * 4;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(fwd[static_cast<size_t>(r)].all_to_all_bytes, others * (q + 2 * kv + q + lse)) << r;
    EXPECT_EQ(bwd[static_cast<size_t>(r)].all_to_all_bytes, others * (3 * q + 2 * kv + lse + q + 2 * kv)) << r;
    // The ring on the group's heads: one step's K/V block of the group's tokens, K/V head 1.
    EXPECT_GT(fwd[static_cast<size_t>(r)].kv_bytes, 0u);
  }
  // A caller built before the field existed passes the smaller struct and gets the rest.
  struct {
    size_t struct_size;
    uint64_t kv_bytes, dkv_bytes, messages;
  } old{};
  old.struct_size = sizeof old;
  EXPECT_EQ(stria_context_get_traffic(group.ctx[0], reinterpret_cast<stria_traffic_t*>(&old)), STRIA_SUCCESS)
      << stria_get_last_error();
  EXPECT_EQ(old.kv_bytes, bwd[0].kv_bytes);
}

// Deterministic: the same call twice gives the same bits (the all-to-all's sums run in member
// order, the ring's as on a plain ring).
TEST(GridContext, RepeatedCallsGiveTheSameBits) {
  const int n = 4;
  LocalGroup group(n);
  ASSERT_EQ(group.status, STRIA_SUCCESS);
  for (stria_context_t c : group.ctx) {
    ASSERT_EQ(stria_context_set_grid(c, 2), STRIA_SUCCESS);
    ASSERT_EQ(stria_context_set_deterministic(c, 1), STRIA_SUCCESS);
  }
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  std::vector<std::vector<double>> first(static_cast<size_t>(n));
  for (int round = 0; round < 2; ++round)
    RunRanks(n, [&](int r) {
      AttentionTensors t(1, 8, 4, 1, 16, Dt::kBF16, 11 + static_cast<uint64_t>(r));
      stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
      ASSERT_EQ(stria_attention_forward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, nullptr),
                STRIA_SUCCESS);
      ASSERT_EQ(stria_attention_backward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, &t.dout.dl, &t.dq.dl,
                                         &t.dk.dl, &t.dv.dl, nullptr),
                STRIA_SUCCESS);
      std::vector<double> all = t.dk.ToDouble();
      for (const Tensor* x : {&t.out, &t.dq, &t.dv}) {
        const auto d = x->ToDouble();
        all.insert(all.end(), d.begin(), d.end());
      }
      if (round == 0)
        first[static_cast<size_t>(r)] = all;
      else
        EXPECT_EQ(all, first[static_cast<size_t>(r)]) << "rank " << r;
    });
}

}  // namespace

namespace {

// The balance of a grid: the ring of groups, each member a U-th of the heads. A grid of N x 1 (one
// group) has nothing to balance; U = 1 is the layout's own analysis; the zigzag ring of groups
// balances causal work as the zigzag ring does.
TEST(GridBalance, IsTheRingOfGroupsOverU) {
  for (stria_layout_t lay : kLayouts)
    for (int causal : {1, 0}) {
      stria_balance_t ring{}, grid{}, plain{}, one_group{};
      for (stria_balance_t* b : {&ring, &grid, &plain, &one_group}) b->struct_size = sizeof *b;
      ASSERT_EQ(stria_analyze_balance(lay, causal, 96, 2, 4, &ring), STRIA_SUCCESS);
      ASSERT_EQ(stria_grid_analyze_balance(lay, causal, 96, 8, 4, 4, &grid), STRIA_SUCCESS) << stria_get_last_error();
      EXPECT_DOUBLE_EQ(grid.total_work, ring.total_work);
      EXPECT_DOUBLE_EQ(grid.ring_latency, ring.ring_latency / 4);
      EXPECT_DOUBLE_EQ(grid.speedup, ring.speedup * 4);
      EXPECT_DOUBLE_EQ(grid.imbalance, ring.imbalance);  // the group adds no imbalance of its own
      EXPECT_DOUBLE_EQ(grid.kv_rows_sent, 96.0);         // one step of the ring of 2 groups
      ASSERT_EQ(stria_grid_analyze_balance(lay, causal, 96, 4, 1, 4, &grid), STRIA_SUCCESS);
      ASSERT_EQ(stria_analyze_balance(lay, causal, 96, 4, 4, &plain), STRIA_SUCCESS);
      EXPECT_DOUBLE_EQ(grid.ring_latency, plain.ring_latency);
      EXPECT_DOUBLE_EQ(grid.ideal_latency, plain.ideal_latency);
      ASSERT_EQ(stria_grid_analyze_balance(lay, causal, 96, 4, 4, 4, &one_group), STRIA_SUCCESS);
      EXPECT_DOUBLE_EQ(one_group.imbalance, 1.0);
      EXPECT_DOUBLE_EQ(one_group.kv_rows_sent, 0.0);
    }
  stria_balance_t b{};
  b.struct_size = sizeof b;
  EXPECT_EQ(stria_grid_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 96, 8, 3, 4, &b), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 96, 8, 2, 4, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(stria_grid_analyze_balance(STRIA_LAYOUT_ZIGZAG, 1, 6, 6, 3, 4, &b), STRIA_ERROR_INVALID_ARGUMENT);
}

}  // namespace
