// The ring against a float64 dense reference of the whole sequence: every layout, rank counts
// 1..8, causal and not, GQA/MQA, each dtype, several head dims and block lengths, forward and
// backward. Inputs are sharded with stria_shard and outputs gathered with stria_unshard, so the
// layouts' position maps are checked end to end too. Outputs are poisoned (NaN) before each run.
#include <gtest/gtest.h>

#include <algorithm>
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
  float scale = 0.f;
  bool strided = false;  // q/k/v as views into one packed [B, L, Hq + 2·Hkv, D] tensor
  double key_ramp = 0;   // key j of S scaled by 1 + key_ramp·j/S: scores that keep rising
  double grad_tol = 0;   // when > 0, the bar for dq, dk, dv (see the sharp cases)
  int docs = 0;          // > 0: a document mask of this many documents per batch row (random cuts)
  int64_t doc_len = 0;   // > 0: instead, documents of this many tokens (the last one shorter)
  Window window{};       // a sliding window (stria_attention_forward_window)
};

std::string Name(const Case& c) {
  std::ostringstream os;
  os << "N" << c.world << "_" << LayoutName(c.layout) << (c.causal ? "_causal" : "_full") << "_" << DtName(c.dt) << "_B"
     << c.B << "L" << c.L << "H" << c.Hq << "x" << c.Hkv << "D" << c.D << (c.strided ? "_strided" : "")
     << (c.scale > 0 ? "_scale" + std::to_string(static_cast<int>(c.scale * 100)) : "")
     << (c.key_ramp > 0 ? "_ramp" : "") << (c.docs > 0 ? "_docs" + std::to_string(c.docs) : "")
     << (c.doc_len > 0 ? "_doclen" + std::to_string(c.doc_len) : "")
     << (c.window.active() ? "_window" + WindowName(c.window) : "");
  return os.str();
}

// The case's document boundaries, [B][n + 1] as cu_seqlens (empty: no document mask): random
// (RandomDocuments), or documents of doc_len tokens.
std::vector<int64_t> MakeDocuments(const Case& c, int64_t S, std::mt19937_64& rng, int64_t* num_seqs) {
  std::vector<int64_t> cu;
  *num_seqs = 0;
  if (c.doc_len > 0) {
    *num_seqs = (S + c.doc_len - 1) / c.doc_len;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t d = 0; d <= *num_seqs; ++d) cu.push_back(std::min(S, d * c.doc_len));
    return cu;
  }
  if (c.docs <= 0) return cu;
  *num_seqs = c.docs;
  return RandomDocuments(c.B, S, c.docs, rng);
}

double Tolerance(Dt dt) {
  return dt == Dt::kF32 ? 1e-5 : 2e-2;
}

// Shards a full [B, S, H, D] tensor for `rank` (seq_dim 1).
Tensor Shard(const Tensor& full, const Case& c, int rank) {
  Tensor local({full.shape[0], c.L, full.shape[2], full.shape[3]}, full.dt);
  EXPECT_EQ(stria_shard(c.layout, c.world, rank, 1, &full.dl, &local.dl, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  return local;
}

// A [B, L, H, D] view of heads [h0, h0+H) of a packed [B, L, Htot, D] tensor.
void MakeHeadView(Tensor& packed, int64_t h0, int64_t H, DLTensor* view, std::vector<int64_t>* shape) {
  *view = packed.dl;
  *shape = {packed.shape[0], packed.shape[1], H, packed.shape[3]};
  view->shape = shape->data();
  view->strides = packed.strides.data();  // same strides: [L·Htot·D, Htot·D, D, 1]
  view->byte_offset = static_cast<uint64_t>(h0 * packed.shape[3] * packed.esize());
}

void RunCase(const Case& c) {
  SCOPED_TRACE(Name(c));
  const int64_t S = c.L * c.world;
  std::mt19937_64 rng(1234 + c.world * 7 + c.layout * 131 + c.D);
  Tensor q({c.B, S, c.Hq, c.D}, c.dt), k({c.B, S, c.Hkv, c.D}, c.dt), v({c.B, S, c.Hkv, c.D}, c.dt);
  Tensor dout({c.B, S, c.Hq, c.D}, c.dt);
  q.FillRandom(rng);
  k.FillRandom(rng);
  v.FillRandom(rng);
  for (int64_t i = 0; i < k.numel(); ++i) {
    const int64_t j = i / (c.Hkv * c.D) % S;
    k.Set(i, k.Get(i) * (1.0 + c.key_ramp * static_cast<double>(j) / static_cast<double>(S)));
  }
  dout.FillRandom(rng);
  const double scale = c.scale > 0 ? c.scale : 1.0 / std::sqrt(static_cast<double>(c.D));
  const auto qd = q.ToDouble(), kd = k.ToDouble(), vd = v.ToDouble(), dod = dout.ToDouble();
  int64_t num_seqs = 0;
  const std::vector<int64_t> documents = MakeDocuments(c, S, rng, &num_seqs);
  const Reference ref = DenseAttention(qd, kd, vd, &dod, c.B, S, c.Hq, c.Hkv, c.D, c.causal, scale,
                                       num_seqs > 0 ? &documents : nullptr, c.window);

  GatheredResults full(c.layout, c.world, c.B, S, c.Hq, c.Hkv, c.D, c.dt);

  LocalGroup group(c.world, 60.0, 1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t params;
  stria_attention_params_init(&params);
  params.layout = c.layout;
  params.causal = c.causal;
  params.softmax_scale = c.scale;

  std::vector<stria_status_t> fwd(static_cast<size_t>(c.world)), bwd(static_cast<size_t>(c.world));
  std::vector<std::string> errors(static_cast<size_t>(c.world));
  RunRanks(c.world, [&](int r) {
    Tensor ql = Shard(q, c, r), kl = Shard(k, c, r), vl = Shard(v, c, r), dol = Shard(dout, c, r);
    Tensor packed;
    DLTensor qv = ql.dl, kv = kl.dl, vv = vl.dl;
    std::vector<int64_t> qs, ks, vs;
    if (c.strided) {  // copy into one packed QKV tensor and attend through head views of it
      packed = PackQKV(ql, kl, vl);
      MakeHeadView(packed, 0, c.Hq, &qv, &qs);
      MakeHeadView(packed, c.Hq, c.Hkv, &kv, &ks);
      MakeHeadView(packed, c.Hq + c.Hkv, c.Hkv, &vv, &vs);
    }
    Tensor out({c.B, c.L, c.Hq, c.D}, c.dt), lse({c.B, c.Hq, c.L}, Dt::kF32);
    Tensor dq({c.B, c.L, c.Hq, c.D}, c.dt), dk({c.B, c.L, c.Hkv, c.D}, c.dt), dv({c.B, c.L, c.Hkv, c.D}, c.dt);
    for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->Poison();
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    fwd[static_cast<size_t>(r)] =
        AttentionForward(ctx, &params, documents, num_seqs, &qv, &kv, &vv, &out.dl, &lse.dl, nullptr, c.window);
    std::string err = stria_get_last_error();
    bwd[static_cast<size_t>(r)] = AttentionBackward(ctx, &params, documents, num_seqs, &qv, &kv, &vv, &out.dl, &lse.dl,
                                                    &dol.dl, &dq.dl, &dk.dl, &dv.dl, nullptr, c.window);
    err += stria_get_last_error();
    errors[static_cast<size_t>(r)] = err;
    full.Gather(r, out, lse, dq, dk, dv);
  });
  for (int r = 0; r < c.world; ++r) {
    ASSERT_EQ(fwd[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << errors[static_cast<size_t>(r)];
    ASSERT_EQ(bwd[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << errors[static_cast<size_t>(r)];
  }
  full.ExpectMatches(ref, Tolerance(c.dt), 1e-5, c.grad_tol);
}

class RingVsReference : public ::testing::TestWithParam<Case> {
 protected:
  // ctest also runs this suite with STRIA_CPU_ISA forcing each kernel build; on a CPU that cannot
  // run the forced one, context creation says so and there is nothing to test.
  void SetUp() override {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    stria_context_t ctx = nullptr;
    const stria_status_t st = stria_context_create(&cfg, &ctx);
    if (st == STRIA_ERROR_UNSUPPORTED) GTEST_SKIP() << stria_get_last_error();
    ASSERT_EQ(st, STRIA_SUCCESS) << stria_get_last_error();
    stria_context_destroy(ctx);
  }
};
TEST_P(RingVsReference, ForwardAndBackward) {
  RunCase(GetParam());
}

std::vector<Case> AllLayoutsAndRankCounts() {
  std::vector<Case> cases;
  for (int n = 1; n <= 8; ++n)
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) cases.push_back(Case{n, lay, causal, Dt::kF32, 2, 6, 4, 2, 16});
  return cases;
}

std::vector<Case> DtypesAndShapes() {
  std::vector<Case> cases;
  for (Dt dt : {Dt::kF16, Dt::kBF16})
    for (int n : {1, 3, 4})
      for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
        cases.push_back(Case{n, lay, true, dt, 1, 10, 4, 1, 32});
  // Head dims, including ones that are not a multiple of the vector width.
  for (int64_t d : {1, 8, 64, 72, 128, 256, 512})
    cases.push_back(Case{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 8, 2, 1, d});
  // MQA, MHA, GQA 4:1 with several key tiles per block (partial last tiles).
  cases.push_back(Case{2, STRIA_LAYOUT_ZIGZAG, true, Dt::kF32, 1, 130, 4, 1, 32});
  cases.push_back(Case{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 130, 2, 2, 64});
  cases.push_back(Case{3, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kBF16, 2, 70, 8, 2, 64});
  cases.push_back(Case{5, STRIA_LAYOUT_STRIPED, false, Dt::kF32, 1, 66, 4, 2, 16});
  // Tiny blocks: one and two tokens per rank.
  for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED})
    for (int n : {1, 4, 7}) cases.push_back(Case{n, lay, true, Dt::kF32, 1, 1, 2, 1, 8});
  for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
    for (int n : {2, 5}) cases.push_back(Case{n, lay, true, Dt::kF32, 1, 2, 2, 2, 8});
  // An explicit scale, and q/k/v as views into one packed QKV tensor.
  Case scaled{4, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 12, 2, 1, 16};
  scaled.scale = 0.37f;
  cases.push_back(scaled);
  // bf16 at lengths of several query tiles per rank (the AMX forward takes them in items of
  // four), head dims that are not a multiple of its 32-wide tiles, and beyond 128.
  for (int64_t d : {8, 72, 128, 256, 512})
    cases.push_back(Case{2, d == 72 ? STRIA_LAYOUT_ZIGZAG : STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1,
                         d > 128 ? 130 : 300, 4, 2, d});
  cases.push_back(Case{3, STRIA_LAYOUT_CONTIGUOUS, false, Dt::kBF16, 1, 260, 2, 1, 64});
  // Few heads: items of three query tiles, and of one (one thread per rank here).
  cases.push_back(Case{1, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 160, 2, 1, 64});
  cases.push_back(Case{2, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 1, 150, 1, 1, 32});
  // Sharp softmaxes: the running maximum of a row keeps moving (keys that grow along the sequence,
  // large scales), so the kernels rescale their partial rows often, by small and large factors.
  // At scale 4 the scores reach the hundreds and float32's rounding of a score alone moves a
  // gradient by ~2e-5 relative (any fp32 implementation: the float64 reference is exact), so
  // there the gradients get 1e-4; the output keeps 1e-5, and catches a running maximum that lets
  // probabilities overflow.
  for (float scale : {1.0f, 4.0f}) {
    Case rising{3, STRIA_LAYOUT_STRIPED, true, Dt::kF32, 1, 130, 2, 1, 64};
    rising.scale = scale;
    rising.key_ramp = 4.0;
    if (scale > 2) rising.grad_tol = 1e-4;
    cases.push_back(rising);
  }
  Case sharp{2, STRIA_LAYOUT_CONTIGUOUS, false, Dt::kF32, 1, 100, 2, 2, 64};
  sharp.scale = 1.5f;
  cases.push_back(sharp);
  Case sharp_bf16{4, STRIA_LAYOUT_ZIGZAG, true, Dt::kBF16, 1, 80, 4, 2, 64};
  sharp_bf16.scale = 1.0f;
  sharp_bf16.key_ramp = 2.0;
  cases.push_back(sharp_bf16);
  for (Dt dt : {Dt::kF32, Dt::kBF16}) {
    Case packed{3, STRIA_LAYOUT_ZIGZAG, true, dt, 2, 8, 4, 2, 16};
    packed.strided = true;
    cases.push_back(packed);
  }
  return cases;
}

// Document masks: every layout and rank count at short blocks (documents of one to a few tokens
// per rank), then blocks of several tiles, where whole tiles fall outside every document, tiles
// are full inside one, and boundaries cut tiles; every dtype, GQA, causal and not.
std::vector<Case> Documents() {
  std::vector<Case> cases;
  for (int n = 1; n <= 8; ++n)
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{n, lay, causal, Dt::kF32, 2, 6, 4, 2, 16};
        c.docs = 3 + n % 3;
        cases.push_back(c);
      }
  for (Dt dt : {Dt::kF32, Dt::kF16, Dt::kBF16})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{3, lay, causal, dt, 2, 200, 4, 2, 32};
        c.docs = 7;
        cases.push_back(c);
      }
  // Documents of exactly two tiles, and of a tile and a half, across ranks.
  for (int64_t len : {128, 96}) {
    Case c{2, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kF32, 1, 320, 2, 1, 64};
    c.doc_len = len;
    cases.push_back(c);
    c.layout = STRIA_LAYOUT_STRIPED;
    c.dt = Dt::kBF16;
    cases.push_back(c);
  }
  // One document per batch row (the same numbers as no mask), MQA, head dims off the vector width.
  Case one{4, STRIA_LAYOUT_ZIGZAG, true, Dt::kF32, 2, 70, 4, 1, 72};
  one.docs = 1;
  cases.push_back(one);
  Case many{5, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 1, 130, 2, 1, 128};
  many.docs = 40;
  cases.push_back(many);
  Case packed{3, STRIA_LAYOUT_ZIGZAG, false, Dt::kF32, 2, 66, 4, 2, 16};
  packed.strided = true;
  packed.docs = 5;
  cases.push_back(packed);
  return cases;
}

// Sliding windows: every layout and rank count at short blocks, causal (a window to the left) and
// not (both sides); then blocks of several tiles in every dtype, where the window's band cuts
// tiles and leaves others empty; windows of 0 (a query sees itself), one-sided, longer than the
// sequence (the plain numbers), with documents, and the contiguous layout's empty blocks.
std::vector<Case> Windows() {
  std::vector<Case> cases;
  for (int n = 1; n <= 8; ++n)
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{n, lay, causal, Dt::kF32, 2, 6, 4, 2, 16};
        c.window = causal ? Window{2 + n, -1} : Window{n, 2};
        cases.push_back(c);
      }
  for (Dt dt : {Dt::kF32, Dt::kF16, Dt::kBF16})
    for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
      for (bool causal : {true, false}) {
        Case c{3, lay, causal, dt, 1, 200, 4, 2, 32};
        c.window = causal ? Window{150, -1} : Window{100, 37};
        cases.push_back(c);
      }
  for (const Window w : {Window{0, -1}, Window{0, 0}, Window{-1, 5}, Window{int64_t{1} << 40, -1}}) {
    Case c{4, STRIA_LAYOUT_STRIPED, w.right == -1, Dt::kF32, 1, 40, 2, 1, 16};
    c.window = w;
    cases.push_back(c);
  }
  Case docs{4, STRIA_LAYOUT_STRIPED, true, Dt::kBF16, 2, 130, 4, 2, 64};
  docs.docs = 5;
  docs.window = Window{90, -1};
  cases.push_back(docs);
  Case docs_full{3, STRIA_LAYOUT_ZIGZAG, false, Dt::kF32, 2, 66, 4, 1, 16};
  docs_full.docs = 4;
  docs_full.window = Window{20, 30};
  cases.push_back(docs_full);
  Case neighbours{8, STRIA_LAYOUT_CONTIGUOUS, true, Dt::kF32, 1, 64, 2, 1, 32};
  neighbours.window = Window{40, -1};
  cases.push_back(neighbours);
  return cases;
}

// A window or documents that every rank's later blocks lie beyond stop the ring early: with the
// contiguous layout, a causal window within a block needs each rank's own block and its
// predecessor's (two steps), within two blocks three; documents within a rank need one step,
// documents that cross one rank boundary two when causal. Other shapes run every step. The
// numbers are the Windows and Documents suites' to check; this checks the steps, and the results
// of short rings once more.
TEST(RingSteps, ShortMasksRunOnlyTheStepsTheyNeed) {
  struct Expect {
    stria_layout_t layout;
    bool causal;
    Window window;
    std::vector<int64_t> cu;  // one row of document boundaries, or none
    int steps;
  };
  const int N = 6;
  const int64_t L = 16;
  const std::vector<int64_t> per_rank{0, 16, 32, 48, 64, 80, 96}, straddling{0, 8, 24, 40, 56, 72, 88, 96};
  const std::vector<Expect> expected{
      {STRIA_LAYOUT_CONTIGUOUS, true, {10, -1}, {}, 2},
      {STRIA_LAYOUT_CONTIGUOUS, true, {16, -1}, {}, 2},
      {STRIA_LAYOUT_CONTIGUOUS, true, {17, -1}, {}, 3},
      {STRIA_LAYOUT_CONTIGUOUS, true, {0, -1}, {}, 1},
      {STRIA_LAYOUT_CONTIGUOUS, false, {10, 3}, {}, N},  // the next block comes last
      {STRIA_LAYOUT_STRIPED, true, {10, -1}, {}, N},
      {STRIA_LAYOUT_ZIGZAG, true, {3, -1}, {}, N},
      {STRIA_LAYOUT_CONTIGUOUS, true, {-1, -1}, {}, N},
      {STRIA_LAYOUT_CONTIGUOUS, false, {-1, -1}, per_rank, 1},
      {STRIA_LAYOUT_CONTIGUOUS, true, {-1, -1}, straddling, 2},
      {STRIA_LAYOUT_CONTIGUOUS, false, {-1, -1}, straddling, N},
      {STRIA_LAYOUT_CONTIGUOUS, true, {4, -1}, straddling, 2},
      {STRIA_LAYOUT_STRIPED, true, {-1, -1}, per_rank, N},
  };
  for (const Expect& e : expected) {
    SCOPED_TRACE(::testing::Message() << LayoutName(e.layout) << " causal " << e.causal << " window "
                                      << WindowName(e.window) << " boundaries " << e.cu.size());
    const int64_t S = L * N;
    std::mt19937_64 rng(5);
    Tensor q({1, S, 2, 16}, Dt::kF32), k({1, S, 1, 16}, Dt::kF32), v({1, S, 1, 16}, Dt::kF32);
    for (Tensor* t : {&q, &k, &v}) t->FillRandom(rng);
    const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), nullptr, 1, S, 2, 1, 16, e.causal,
                                         0.25, e.cu.empty() ? nullptr : &e.cu, e.window);
    LocalGroup group(N, 30.0, 1);
    ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
    stria_attention_params_t params;
    stria_attention_params_init(&params);
    params.layout = e.layout;
    params.causal = e.causal;
    params.softmax_scale = 0.25f;
    std::vector<int> fwd_steps(N), bwd_steps(N);
    std::vector<double> errors(N);
    RunRanks(N, [&](int r) {
      Case shape{N, e.layout, e.causal, Dt::kF32, 1, L, 2, 1, 16};
      Tensor ql = Shard(q, shape, r), kl = Shard(k, shape, r), vl = Shard(v, shape, r);
      Tensor out({1, L, 2, 16}, Dt::kF32), lse({1, 2, L}, Dt::kF32), dout({1, L, 2, 16}, Dt::kF32);
      Tensor dq({1, L, 2, 16}, Dt::kF32), dk({1, L, 1, 16}, Dt::kF32), dv({1, L, 1, 16}, Dt::kF32);
      for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->Poison();
      std::mt19937_64 g(17 + static_cast<uint64_t>(r));
      dout.FillRandom(g);
      stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
      const int64_t num_seqs = e.cu.empty() ? 0 : static_cast<int64_t>(e.cu.size()) - 1;
      EXPECT_EQ(
          AttentionForward(ctx, &params, e.cu, num_seqs, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr, e.window),
          STRIA_SUCCESS)
          << stria_get_last_error();
      stria_context_get_step_times(ctx, nullptr, 0, &fwd_steps[static_cast<size_t>(r)]);
      EXPECT_EQ(AttentionBackward(ctx, &params, e.cu, num_seqs, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, &dout.dl,
                                  &dq.dl, &dk.dl, &dv.dl, nullptr, e.window),
                STRIA_SUCCESS)
          << stria_get_last_error();
      stria_context_get_step_times(ctx, nullptr, 0, &bwd_steps[static_cast<size_t>(r)]);
      // The forward's rows against the reference's, at this rank's positions.
      std::vector<int64_t> pos(static_cast<size_t>(L));
      stria_layout_positions(e.layout, S, N, r, pos.data());
      double num = 0, den = 0;
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < 2 * 16; ++x) {
          const double want = ref.out[static_cast<size_t>(pos[static_cast<size_t>(i)] * 32 + x)];
          const double got = out.Get(i * 32 + x);
          num += (got - want) * (got - want);
          den += want * want;
        }
      errors[static_cast<size_t>(r)] = std::sqrt(num / den);
      for (Tensor* t : {&dq, &dk, &dv})
        for (int64_t i = 0; i < t->numel(); ++i) EXPECT_FALSE(std::isnan(t->Get(i))) << "rank " << r;
    });
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(fwd_steps[static_cast<size_t>(r)], e.steps) << "rank " << r;
      EXPECT_EQ(bwd_steps[static_cast<size_t>(r)], e.steps) << "rank " << r;
      EXPECT_LT(errors[static_cast<size_t>(r)], 1e-5) << "rank " << r;
    }
  }
}

// The CPU backend promises bitwise-identical results for identical calls on contexts of the same
// configuration (thread count and kernel build): every sum has a fixed order (dQ's key-tile
// chunks are reduced in chunk order, ring steps merge in step order), whatever the threads'
// timing. Training runs rely on it to replay a step. Two calls in one group and one in a new
// group, with 2 threads per rank so that dQ has two chunks to reduce.
TEST(Reproducibility, IdenticalCallsGiveIdenticalBits) {
  for (Dt dt : {Dt::kF32, Dt::kBF16}) {
    SCOPED_TRACE(DtName(dt));
    const Case c{3, STRIA_LAYOUT_STRIPED, true, dt, 1, 130, 4, 2, 64};
    const int64_t S = c.L * c.world;
    std::mt19937_64 rng(99);
    Tensor q({c.B, S, c.Hq, c.D}, dt), k({c.B, S, c.Hkv, c.D}, dt), v({c.B, S, c.Hkv, c.D}, dt);
    Tensor dout({c.B, S, c.Hq, c.D}, dt);
    for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
    stria_attention_params_t params;
    stria_attention_params_init(&params);
    params.layout = c.layout;
    params.causal = c.causal;
    // results[run][rank]: the bytes of out, lse, dq, dk and dv, one after another.
    std::vector<std::vector<std::vector<uint8_t>>> results;
    for (int group_index = 0; group_index < 2; ++group_index) {
      LocalGroup group(c.world, 60.0, 2);
      ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
      for (int call = 0; call < 2 - group_index; ++call) {
        std::vector<std::vector<uint8_t>> bytes(static_cast<size_t>(c.world));
        RunRanks(c.world, [&](int r) {
          Tensor ql = Shard(q, c, r), kl = Shard(k, c, r), vl = Shard(v, c, r), dol = Shard(dout, c, r);
          Tensor out({c.B, c.L, c.Hq, c.D}, dt), lse({c.B, c.Hq, c.L}, Dt::kF32);
          Tensor dq({c.B, c.L, c.Hq, c.D}, dt), dk({c.B, c.L, c.Hkv, c.D}, dt), dv({c.B, c.L, c.Hkv, c.D}, dt);
          for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) t->Poison();
          stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
          // The CPU backend is deterministic either way: asking for it changes no bit.
          if (group_index == 1) {
            EXPECT_EQ(stria_context_set_deterministic(ctx, 1), STRIA_SUCCESS);
          }
          EXPECT_EQ(stria_attention_forward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, nullptr),
                    STRIA_SUCCESS)
              << stria_get_last_error();
          EXPECT_EQ(stria_attention_backward(ctx, &params, &ql.dl, &kl.dl, &vl.dl, &out.dl, &lse.dl, &dol.dl, &dq.dl,
                                             &dk.dl, &dv.dl, nullptr),
                    STRIA_SUCCESS)
              << stria_get_last_error();
          for (Tensor* t : {&out, &lse, &dq, &dk, &dv}) {
            for (int64_t i = 0; i < t->numel(); ++i) EXPECT_FALSE(std::isnan(t->Get(i))) << "rank " << r;
            std::vector<uint8_t>& b = bytes[static_cast<size_t>(r)];
            b.insert(b.end(), t->storage.begin(), t->storage.end());
          }
        });
        results.push_back(std::move(bytes));
      }
    }
    ASSERT_EQ(results.size(), 3u);
    for (size_t run = 1; run < results.size(); ++run)
      for (int r = 0; r < c.world; ++r)
        EXPECT_TRUE(results[run][static_cast<size_t>(r)] == results[0][static_cast<size_t>(r)])
            << "run " << run << " of " << (run == 1 ? "the same group" : "a new group") << ", rank " << r
            << ": the bits differ from the first run's";
  }
}

std::string ParamName(const ::testing::TestParamInfo<Case>& info) {
  return Name(info.param);
}

INSTANTIATE_TEST_SUITE_P(Layouts, RingVsReference, ::testing::ValuesIn(AllLayoutsAndRankCounts()), ParamName);
INSTANTIATE_TEST_SUITE_P(Shapes, RingVsReference, ::testing::ValuesIn(DtypesAndShapes()), ParamName);
INSTANTIATE_TEST_SUITE_P(Documents, RingVsReference, ::testing::ValuesIn(Documents()), ParamName);
INSTANTIATE_TEST_SUITE_P(Windows, RingVsReference, ::testing::ValuesIn(Windows()), ParamName);

}  // namespace
