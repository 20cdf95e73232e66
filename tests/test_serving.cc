// Serving over a KV cache sharded across the ranks, against a float64 reference over the whole cache
// on one device. Decode (stria_attention_decode): every layout, contiguous and paged caches, cache
// lengths from 0 to many blocks that differ per sequence and do not divide by N, GQA and MQA,
// windows, softcap and sinks, with and without new tokens, every dtype, N 1..8; every rank must give
// the same bits. Prefill (stria_attention_prefill): new tokens sharded by the layout attend to the
// cache and to each other, pass-KV and pass-Q alike. Either way the new tokens must land in the
// slots of the rank that holds their positions.
#include <gtest/gtest.h>

#include <cstdarg>
#include <cstdio>
#include <functional>
#include <numeric>
#include <ostream>
#include <string>

#include "serving_cases.h"
#include "test_util.h"

namespace stria_test {
namespace {

// Runs one decode call on a local group: every rank's out and LSE.
void RunDecode(const Case& c, DecodeInputs& in, std::vector<Tensor>& outs, std::vector<Tensor>& lses) {
  const int64_t B = c.B, T = c.T, Hq = c.Hq, D = c.D;
  LocalGroup g(c.n);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  for (int r = 0; r < c.n; ++r) {
    outs.emplace_back(std::vector<int64_t>{B, T, Hq, D}, c.dt);
    lses.emplace_back(std::vector<int64_t>{B, Hq, T}, Dt::kF32);
    outs.back().Poison();
    lses.back().Poison();
  }
  std::vector<stria_status_t> st(static_cast<size_t>(c.n));
  std::vector<std::string> err(static_cast<size_t>(c.n));
  RunRanks(c.n, [&](int r) {
    stria_attention_params_t p = DecodeParams(c, &in.sinks_t.dl);
    RankCache& rc = in.caches[static_cast<size_t>(r)];
    stria_kv_cache_t cache;
    stria_kv_cache_init(&cache);
    cache.k = &rc.k.dl;
    cache.v = &rc.v.dl;
    cache.block_table = c.paged ? &rc.table_dl : nullptr;
    cache.lens = c.lens.data();
    st[static_cast<size_t>(r)] = stria_attention_decode(
        g.ctx[static_cast<size_t>(r)], &p, &cache, &in.q.dl, c.append ? &in.k_new.dl : nullptr,
        c.append ? &in.v_new.dl : nullptr, &outs[static_cast<size_t>(r)].dl, &lses[static_cast<size_t>(r)].dl, nullptr);
    if (st[static_cast<size_t>(r)] != STRIA_SUCCESS) err[static_cast<size_t>(r)] = stria_get_last_error();
  });
  for (int r = 0; r < c.n; ++r)
    ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << err[static_cast<size_t>(r)];
}

// Runs one decode call on a local group and checks it against the float64 reference; `prepare`
// may change the inputs first (what the reference never reads).
void RunCase(const Case& c, uint64_t seed, const std::function<void(DecodeInputs&)>& prepare = {}) {
  SCOPED_TRACE(c.Name());
  DecodeInputs in(c, seed);
  if (prepare) prepare(in);
  std::vector<Tensor> outs, lses;
  RunDecode(c, in, outs, lses);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectDecodeResults(c, in, outs, lses, in.caches);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  std::mt19937_64 rng(7);
  for (int n : {1, 2, 3, 4, 5, 8})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG})
      for (bool paged : {false, true}) {
        Case c;
        c.n = n;
        c.layout = layout;
        c.paged = paged;
        c.B = 3;
        c.capacity = 96;
        c.lens = Lengths(c.B, n * c.capacity - c.T, rng);
        cases.push_back(c);
      }
  for (Dt dt : {Dt::kBF16, Dt::kF16})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
      Case c;
      c.n = 3;
      c.dt = dt;
      c.layout = layout;
      c.paged = layout == STRIA_LAYOUT_ZIGZAG;
      c.lens = Lengths(c.B, c.n * c.capacity - c.T, rng);
      cases.push_back(c);
    }
  AppendSpeculativeCases(3, 96, rng, &cases);
  {  // windows, softcap, sinks; long caches over many blocks with GQA 4:1
    Case c;
    c.n = 5;
    c.B = 2;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = 64;
    c.capacity = 512;
    c.paged = true;
    c.block_size = 32;
    c.lens = {2500, 1337};
    AppendDecodeScoreCases(c, &cases);
  }
  AppendDecodeHeadDimCases(200, 512, &cases);
  {  // the kernel's product of scores (rows enough to transpose K's block for) on 33 rows: whole
     // micro-tiles and a row alone, over key blocks cut by the rank's share
    Case c;
    c.n = 2;
    c.B = 2;
    c.Hq = 33;
    c.Hkv = 1;
    c.D = 48;
    c.capacity = 300;
    c.lens = {599, 131};
    cases.push_back(c);
    c.dt = Dt::kBF16;
    c.window_left = 70;
    cases.push_back(c);
  }
  return cases;
}

class Decode : public ::testing::TestWithParam<Case> {};

TEST_P(Decode, MatchesOneDevice) {
  RunCase(GetParam(), 1234);
}

INSTANTIATE_TEST_SUITE_P(Cases, Decode, ::testing::ValuesIn(Cases()), [](const ::testing::TestParamInfo<Case>& i) {
  return i.param.Name() + "_" + std::to_string(i.index);
});
INSTANTIATE_TEST_SUITE_P(Random, Decode, ::testing::ValuesIn(RandomCases(false, RandomCaseCount(16))),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_seed" + std::to_string(i.index);
                         });

// A key the window hides never reaches the rows (WindowCase). Decode (one token, its rows sharing
// their keys) on two ranks, float32 and bf16, striped and contiguous.
TEST(DecodeWindow, AKeyOutsideTheWindowNeverReachesTheRows) {
  for (Dt dt : {Dt::kF32, Dt::kBF16})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS}) {
      const Case c = WindowCase(dt, 64, layout);
      RunCase(c, 99, [&](DecodeInputs& in) { PoisonKeysBeforeTheWindow(c, &in); });
      if (HasFatalFailure()) return;
    }
}

// NaN never passes (NaNKeyCase): float32 and bf16 on the CPU kernels.
TEST(DecodeNaN, ASeenKeyReachesExactlyTheRowsThatSeeIt) {
  for (Dt dt : {Dt::kF32, Dt::kBF16}) {
    const Case c = NaNKeyCase(dt, 64);
    SCOPED_TRACE(c.Name());
    DecodeInputs in(c, 77);
    PoisonOneNewKey(c, &in);
    std::vector<Tensor> outs, lses;
    RunDecode(c, in, outs, lses);
    if (HasFatalFailure()) return;
    ExpectNaNExactlyWhereSeen(c, outs, lses);
  }
}

// Every cache length a generation loop passes through, one token appended per step: across rank
// boundaries (contiguous) and page ends (blocks of 4).
TEST(DecodeLoop, GrowsAcrossRanksAndPages) {
  for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS}) {
    Case c;
    c.n = 3;
    c.layout = layout;
    c.paged = true;
    c.block_size = 4;
    c.capacity = 12;
    c.B = 2;
    for (int64_t step = 0; step < 20; ++step) {
      c.lens = {step, step + 13};
      RunCase(c, 99 + static_cast<uint64_t>(step));
      if (HasFatalFailure()) return;
    }
  }
}

// Prefill on a local group of CPU ranks (PrefillInputs, ExpectPrefillResults: serving_cases.h).
// Returns each rank's output, so that the modes can be compared with each other.
std::vector<std::vector<double>> RunPrefill(const Case& c, uint64_t seed,
                                            const std::function<void(PrefillInputs&)>& prepare = {}) {
  PrefillInputs in(c, seed);
  if (prepare) prepare(in);
  LocalGroup g(c.n);
  EXPECT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  std::vector<Tensor> outs, lses;
  for (int r = 0; r < c.n; ++r) {
    outs.emplace_back(std::vector<int64_t>{c.B, c.T, c.Hq, c.D}, c.dt);
    lses.emplace_back(std::vector<int64_t>{c.B, c.Hq, c.T}, Dt::kF32);
    outs.back().Poison();
    lses.back().Poison();
  }
  std::vector<stria_status_t> st(static_cast<size_t>(c.n));
  std::vector<std::string> err(static_cast<size_t>(c.n));
  RunRanks(c.n, [&](int r) {
    stria_attention_params_t p = DecodeParams(c, &in.sinks_t.dl);
    RankCache& rc = in.caches[static_cast<size_t>(r)];
    stria_kv_cache_t cache;
    stria_kv_cache_init(&cache);
    cache.k = &rc.k.dl;
    cache.v = &rc.v.dl;
    cache.block_table = c.paged ? &rc.table_dl : nullptr;
    cache.lens = c.lens.data();
    const size_t i = static_cast<size_t>(r);
    st[i] = stria_attention_prefill(g.ctx[i], &p, &cache, c.mode, &in.qs[i].dl, &in.ks[i].dl, &in.vs[i].dl, &outs[i].dl,
                                    &lses[i].dl, nullptr);
    if (st[i] != STRIA_SUCCESS) err[i] = stria_get_last_error();
  });
  for (int r = 0; r < c.n; ++r) {
    EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << err[static_cast<size_t>(r)];
    if (st[static_cast<size_t>(r)] != STRIA_SUCCESS) return {};
  }
  return ExpectPrefillResults(c, in, outs, lses, in.caches);
}

std::vector<Case> PrefillCases() {
  std::vector<Case> cases;
  std::mt19937_64 rng(11);
  for (int n : {1, 2, 3, 4, 5})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG})
      for (bool paged : {false, true}) {
        Case c;
        c.n = n;
        c.layout = layout;
        c.paged = paged;
        c.B = 3;
        c.T = 4;  // new tokens per rank
        c.capacity = 48;
        c.lens = Lengths(c.B, n * c.capacity - n * c.T, rng);
        cases.push_back(c);
      }
  AppendPrefillScoreCases(&cases);
  {  // rows not a whole number of the kernel's micro-tiles (11 new tokens a rank times 3 query heads
     // a K/V head: 33) against several 64-key blocks, causal inside the blocks
    Case c;
    c.n = 2;
    c.B = 2;
    c.T = 11;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = 72;
    c.capacity = 300;
    c.lens = {578, 133};
    cases.push_back(c);
    c.dt = Dt::kBF16;
    c.layout = STRIA_LAYOUT_CONTIGUOUS;
    cases.push_back(c);
  }
  {  // rows too many for every head's to stay in the core's caches (180 new tokens times 3 query
     // heads a K/V head: 540 at D 128), so the kernel takes a head at a time in chunks of whole
     // tokens (255 rows), the last one shorter
    Case c;
    c.n = 1;
    c.B = 1;
    c.T = 180;
    c.Hq = 6;
    c.Hkv = 2;
    c.D = 128;
    c.capacity = 500;
    c.lens = {300};
    cases.push_back(c);
  }
  return cases;
}

class Prefill : public ::testing::TestWithParam<Case> {};

// Pass-KV and pass-Q each against the reference, and against each other.
TEST_P(Prefill, BothModesMatchOneDevice) {
  Case c = GetParam();
  c.mode = STRIA_PREFILL_PASS_KV;
  const auto kv = RunPrefill(c, 77);
  if (HasFailure()) return;
  c.mode = STRIA_PREFILL_PASS_Q;
  const auto q = RunPrefill(c, 77);
  if (HasFailure()) return;
  for (size_t r = 0; r < kv.size(); ++r)
    EXPECT_LT(RelError(q[r], kv[r]), c.dt == Dt::kF32 ? 1e-6 : 1e-2) << "rank " << r << ": pass-Q against pass-KV";
  c.mode = STRIA_PREFILL_AUTO;
  RunPrefill(c, 77);
}

INSTANTIATE_TEST_SUITE_P(Cases, Prefill, ::testing::ValuesIn(PrefillCases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_" + std::to_string(i.index);
                         });
INSTANTIATE_TEST_SUITE_P(Random, Prefill, ::testing::ValuesIn(RandomCases(true, RandomCaseCount(16))),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_seed" + std::to_string(i.index);
                         });

// A sliding window's calls read from the window's start: the block-table entries of pages wholly
// before it may hold anything (ForgetPagesBefore), as a serving engine that reclaims those pages
// leaves them. Decode (one token and three) and prefill in both modes, every layout, on three ranks.
TEST(DecodeWindow, PagesBeforeTheWindowAreNeverLookedUp) {
  for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG}) {
    Case c = PagedWindowCase(layout);
    for (int64_t T : {1, 3}) {
      c.T = T;
      RunCase(c, 5, [&](DecodeInputs& in) { ForgetPagesBefore(c, WindowStarts(c), &in.caches); });
      if (HasFatalFailure()) return;
    }
    c.T = 4;
    c.lens = {200, 61};
    for (stria_prefill_t mode : {STRIA_PREFILL_PASS_KV, STRIA_PREFILL_PASS_Q}) {
      c.mode = mode;
      SCOPED_TRACE(c.Name() + (mode == STRIA_PREFILL_PASS_KV ? " pass-KV" : " pass-Q"));
      RunPrefill(c, 5, [&](PrefillInputs& in) { ForgetPagesBefore(c, WindowStarts(c), &in.caches); });
      if (HasFailure()) return;
    }
  }
}

// A conversation: a first prefill, decode steps, a second turn's prefill, more decode steps, on
// one cache; each call against the reference of the whole cache so far.
TEST(Serving, PrefillThenDecodeThenPrefillAgain) {
  const int n = 3;
  const int64_t B = 2, Hq = 4, Hkv = 2, D = 16, cap = 64, S = n * cap;
  std::mt19937_64 rng(21);
  Tensor kf({B, S, Hkv, D}, Dt::kF32), vf({B, S, Hkv, D}, Dt::kF32);
  kf.FillRandom(rng);
  vf.FillRandom(rng);
  std::vector<Tensor> kc, vc;
  for (int r = 0; r < n; ++r) {
    kc.emplace_back(std::vector<int64_t>{B, cap, Hkv, D}, Dt::kF32);
    vc.emplace_back(std::vector<int64_t>{B, cap, Hkv, D}, Dt::kF32);
    kc.back().Poison();
    vc.back().Poison();
  }
  LocalGroup g(n);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  std::vector<int64_t> lens = {0, 0};
  // Rows [lens, lens + T) of the whole-sequence tensor x for every sequence, as a [B, T, H, D] tensor.
  auto rows = [&](const Tensor& x, int64_t T, int64_t heads) {
    Tensor t({B, T, heads, D}, Dt::kF32);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < T * heads * D; ++i)
        t.Set(b * T * heads * D + i, x.Get((b * x.shape[1] + lens[static_cast<size_t>(b)]) * heads * D + i));
    return t;
  };
  for (int64_t P : {12, 0, 0, 6, 0}) {
    const bool prefill = P > 0;
    const int64_t T = prefill ? P : 1;
    Tensor qf({B, T, Hq, D}, Dt::kF32);
    qf.FillRandom(rng);
    const Reference ref = DecodeReference(qf, kf, vf, lens, T, true, -1);
    std::vector<Tensor> outs;
    std::vector<std::vector<int64_t>> pos(n, std::vector<int64_t>(static_cast<size_t>(T / (prefill ? n : 1))));
    for (int r = 0; r < n; ++r) outs.emplace_back(std::vector<int64_t>{B, prefill ? T / n : 1, Hq, D}, Dt::kF32);
    const Tensor k_all = rows(kf, T, Hkv), v_all = rows(vf, T, Hkv);
    std::vector<stria_status_t> st(n);
    RunRanks(n, [&](int r) {
      stria_attention_params_t p;
      stria_attention_params_init(&p);
      stria_kv_cache_t cache;
      stria_kv_cache_init(&cache);
      cache.k = &kc[static_cast<size_t>(r)].dl;
      cache.v = &vc[static_cast<size_t>(r)].dl;
      cache.lens = lens.data();
      if (!prefill) {
        st[static_cast<size_t>(r)] =
            stria_attention_decode(g.ctx[static_cast<size_t>(r)], &p, &cache, &qf.dl, &k_all.dl, &v_all.dl,
                                   &outs[static_cast<size_t>(r)].dl, nullptr, nullptr);
        return;
      }
      const int64_t L = T / n;
      std::vector<int64_t>& mine = pos[static_cast<size_t>(r)];
      stria_layout_positions(p.layout, T, n, r, mine.data());
      Tensor q({B, L, Hq, D}, Dt::kF32), k({B, L, Hkv, D}, Dt::kF32), v({B, L, Hkv, D}, Dt::kF32);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t cp = mine[static_cast<size_t>(i)];
          for (int64_t x = 0; x < Hq * D; ++x) q.Set((b * L + i) * Hq * D + x, qf.Get((b * T + cp) * Hq * D + x));
          for (int64_t x = 0; x < Hkv * D; ++x) {
            k.Set((b * L + i) * Hkv * D + x, k_all.Get((b * T + cp) * Hkv * D + x));
            v.Set((b * L + i) * Hkv * D + x, v_all.Get((b * T + cp) * Hkv * D + x));
          }
        }
      st[static_cast<size_t>(r)] =
          stria_attention_prefill(g.ctx[static_cast<size_t>(r)], &p, &cache, STRIA_PREFILL_AUTO, &q.dl, &k.dl, &v.dl,
                                  &outs[static_cast<size_t>(r)].dl, nullptr, nullptr);
    });
    for (int r = 0; r < n; ++r) ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << stria_get_last_error();
    for (int r = 0; r < n; ++r) {
      std::vector<double> want;
      const int64_t L = prefill ? T / n : 1;
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t cp = prefill ? pos[static_cast<size_t>(r)][static_cast<size_t>(i)] : 0;
          for (int64_t x = 0; x < Hq * D; ++x) want.push_back(ref.out[static_cast<size_t>((b * T + cp) * Hq * D + x)]);
        }
      EXPECT_LT(RelError(outs[static_cast<size_t>(r)].ToDouble(), want), 1e-5) << "P " << P << " rank " << r;
    }
    for (int64_t& l : lens) l += T;
  }
}

// Prefill's own bad input, on a group of 2 where one rank or both are wrong: every rank fails with
// the message, and the next good call works.
TEST(PrefillErrors, FailOnEveryRankAndLeaveTheGroupUsable) {
  constexpr int n = 2;
  const int64_t B = 1, L = 3, Hq = 2, Hkv = 1, D = 8, cap = 16;
  std::mt19937_64 rng(3);
  Tensor q({B, L, Hq, D}, Dt::kF32), k({B, L, Hkv, D}, Dt::kF32), v({B, L, Hkv, D}, Dt::kF32);
  Tensor k_bad({B, L, 2, D}, Dt::kF32);
  for (Tensor* t : {&q, &k, &v}) t->FillRandom(rng);
  std::vector<Tensor> kc, vc, outs;
  for (int r = 0; r < n; ++r) {
    kc.emplace_back(std::vector<int64_t>{B, cap, Hkv, D}, Dt::kF32);
    vc.emplace_back(std::vector<int64_t>{B, cap, Hkv, D}, Dt::kF32);
    outs.emplace_back(std::vector<int64_t>{B, L, Hq, D}, Dt::kF32);
  }
  LocalGroup g(n, 5.0);
  ASSERT_EQ(g.status, STRIA_SUCCESS);
  struct Bad {
    const char* name;
    const char* needle;
    std::function<void(int, stria_attention_params_t&, std::vector<int64_t>&, int&, const DLTensor*&)> edit;
  };
  const std::vector<Bad> bads = {
      {"mode", "not a stria_prefill_t", [](int, auto&, auto&, int& mode, auto&) { mode = 7; }},
      {"zigzag_odd_L", "zigzag", [](int, auto& p, auto&, auto&, auto&) { p.layout = STRIA_LAYOUT_ZIGZAG; }},
      {"past_capacity", "cache->lens[0]", [](int, auto&, auto& lens, auto&, auto&) { lens[0] = 2 * 16 - 5; }},
      {"k_and_v_heads_differ", "v has shape",
       [&k_bad](int, auto&, auto&, auto&, const DLTensor*& kp) { kp = &k_bad.dl; }},
      {"modes_differ", "ranks disagree", [](int r, auto&, auto&, int& mode, auto&) { mode = r == 1 ? 2 : 1; }},
      {"window_right", "window_right", [](int, auto& p, auto&, auto&, auto&) { p.window_right = 1; }},
  };
  auto call = [&](const Bad* bad, std::vector<stria_status_t>* st, std::vector<std::string>* msg) {
    st->assign(n, STRIA_SUCCESS);
    msg->assign(n, "");
    RunRanks(n, [&](int r) {
      stria_attention_params_t p;
      stria_attention_params_init(&p);
      std::vector<int64_t> lens = {5};
      int mode = STRIA_PREFILL_AUTO;
      const DLTensor* kp = &k.dl;
      if (bad != nullptr) bad->edit(r, p, lens, mode, kp);
      stria_kv_cache_t cache;
      stria_kv_cache_init(&cache);
      cache.k = &kc[static_cast<size_t>(r)].dl;
      cache.v = &vc[static_cast<size_t>(r)].dl;
      cache.lens = lens.data();
      (*st)[static_cast<size_t>(r)] =
          stria_attention_prefill(g.ctx[static_cast<size_t>(r)], &p, &cache, static_cast<stria_prefill_t>(mode), &q.dl,
                                  kp, &v.dl, &outs[static_cast<size_t>(r)].dl, nullptr, nullptr);
      (*msg)[static_cast<size_t>(r)] = stria_get_last_error();
    });
  };
  std::vector<stria_status_t> st;
  std::vector<std::string> msg;
  for (const Bad& bad : bads) {
    SCOPED_TRACE(bad.name);
    call(&bad, &st, &msg);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_ERROR_INVALID_ARGUMENT) << msg[static_cast<size_t>(r)];
      EXPECT_NE(msg[static_cast<size_t>(r)].find(bad.needle), std::string::npos) << msg[static_cast<size_t>(r)];
    }
    call(nullptr, &st, &msg);
    for (int r = 0; r < n; ++r) EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << msg[static_cast<size_t>(r)];
  }
}

// Bad input: the documented status and a message naming what to fix, on every rank of the group
// (ranks given different lengths, or one rank a bad block table, fail together), and the group
// stays usable: the next good call gives the same bits as the one before.
struct DecodeArgs {
  stria_attention_params_t p;
  stria_kv_cache_t cache;
  const DLTensor *q, *k_new, *v_new;
  DLTensor *out, *lse;
  void* stream = nullptr;
};

struct BadDecode {
  std::string name;
  stria_status_t want;
  const char* needle;
  std::function<void(int rank, DecodeArgs&)> edit;
};

class DecodeErrors : public ::testing::TestWithParam<BadDecode> {};

void PrintTo(const BadDecode& c, std::ostream* os) {
  *os << c.name;
}

TEST_P(DecodeErrors, FailOnEveryRankAndLeaveTheGroupUsable) {
  const BadDecode& bad = GetParam();
  constexpr int n = 2;
  const int64_t B = 2, T = 2, Hq = 4, Hkv = 2, D = 16, bs = 8, max_blocks = 4;
  std::mt19937_64 rng(5);
  Tensor q({B, T, Hq, D}, Dt::kF32), k_new({B, T, Hkv, D}, Dt::kF32), v_new({B, T, Hkv, D}, Dt::kF32);
  q.FillRandom(rng);
  k_new.FillRandom(rng);
  v_new.FillRandom(rng);
  std::vector<Tensor> kc, vc, outs, lses;
  std::vector<std::vector<int32_t>> tables(n);
  std::vector<int64_t> table_shape = {B, max_blocks};
  std::vector<DLTensor> table_dl(n);
  for (int r = 0; r < n; ++r) {
    kc.emplace_back(std::vector<int64_t>{B * max_blocks, bs, Hkv, D}, Dt::kF32);
    vc.emplace_back(std::vector<int64_t>{B * max_blocks, bs, Hkv, D}, Dt::kF32);
    kc.back().FillRandom(rng);
    vc.back().FillRandom(rng);
    outs.emplace_back(std::vector<int64_t>{B, T, Hq, D}, Dt::kF32);
    lses.emplace_back(std::vector<int64_t>{B, Hq, T}, Dt::kF32);
    for (int32_t i = 0; i < B * max_blocks; ++i) tables[static_cast<size_t>(r)].push_back(i);
    DLTensor& t = table_dl[static_cast<size_t>(r)];
    t.data = tables[static_cast<size_t>(r)].data();
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 2;
    t.dtype = DLDataType{kDLInt, 32, 1};
    t.shape = table_shape.data();
  }
  std::vector<int64_t> lens = {5, 40};
  LocalGroup g(n, 5.0);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  auto good = [&](int r) {
    DecodeArgs a;
    stria_attention_params_init(&a.p);
    stria_kv_cache_init(&a.cache);
    a.cache.k = &kc[static_cast<size_t>(r)].dl;
    a.cache.v = &vc[static_cast<size_t>(r)].dl;
    a.cache.block_table = &table_dl[static_cast<size_t>(r)];
    a.cache.lens = lens.data();
    a.q = &q.dl;
    a.k_new = &k_new.dl;
    a.v_new = &v_new.dl;
    a.out = &outs[static_cast<size_t>(r)].dl;
    a.lse = &lses[static_cast<size_t>(r)].dl;
    return a;
  };
  auto run = [&](bool with_bad, std::vector<stria_status_t>* st, std::vector<std::string>* msg) {
    st->assign(n, STRIA_SUCCESS);
    msg->assign(n, "");
    RunRanks(n, [&](int r) {
      DecodeArgs a = good(r);
      if (with_bad) bad.edit(r, a);
      (*st)[static_cast<size_t>(r)] = stria_attention_decode(g.ctx[static_cast<size_t>(r)], &a.p, &a.cache, a.q,
                                                             a.k_new, a.v_new, a.out, a.lse, a.stream);
      (*msg)[static_cast<size_t>(r)] = stria_get_last_error();
    });
  };
  std::vector<stria_status_t> st;
  std::vector<std::string> msg;
  run(false, &st, &msg);
  for (int r = 0; r < n; ++r) ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << msg[static_cast<size_t>(r)];
  const std::vector<uint8_t> before = outs[0].storage;
  run(true, &st, &msg);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(st[static_cast<size_t>(r)], bad.want) << "rank " << r << ": " << msg[static_cast<size_t>(r)];
    if (bad.needle != nullptr) {
      EXPECT_NE(msg[static_cast<size_t>(r)].find(bad.needle), std::string::npos)
          << "rank " << r << "'s message does not name \"" << bad.needle << "\": " << msg[static_cast<size_t>(r)];
    }
  }
  std::fill(outs[0].storage.begin(), outs[0].storage.end(), 0);
  run(false, &st, &msg);
  for (int r = 0; r < n; ++r) ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << msg[static_cast<size_t>(r)];
  EXPECT_EQ(before, outs[0].storage) << "the call after the bad one gives other bits";
}

std::vector<BadDecode> BadDecodes() {
  const stria_status_t kInv = STRIA_ERROR_INVALID_ARGUMENT;
  static float flat[64];
  static int64_t flat_shape[1] = {64};
  static int32_t bad_table[8] = {0, 1, 2, 3, 4, 5, 99, 7};
  static int64_t huge[2] = {5, 1000};
  static int64_t negative[2] = {5, -1};
  static int64_t other_lens[2] = {6, 40};
  static stria_plan_t fake_plan = reinterpret_cast<stria_plan_t>(0x1234);
  std::vector<BadDecode> v;
  auto all = [&](const char* name, stria_status_t want, const char* needle, std::function<void(DecodeArgs&)> f) {
    v.push_back(BadDecode{name, want, needle, [f](int, DecodeArgs& a) { f(a); }});
  };
  all("params_null", kInv, "params", [](DecodeArgs& a) { a.p.struct_size = 0; });
  all("cache_struct_size", kInv, "cache->struct_size", [](DecodeArgs& a) { a.cache.struct_size = 3; });
  all("cache_k_null", kInv, "cache->k is NULL", [](DecodeArgs& a) { a.cache.k = nullptr; });
  all("lens_null", kInv, "cache->lens", [](DecodeArgs& a) { a.cache.lens = nullptr; });
  all("lens_past_capacity", kInv, "cache->lens[1]", [](DecodeArgs& a) { a.cache.lens = huge; });
  all("lens_negative", kInv, "cache->lens[1]", [](DecodeArgs& a) { a.cache.lens = negative; });
  all("q_null", kInv, "q is NULL", [](DecodeArgs& a) { a.q = nullptr; });
  all("k_new_without_v_new", kInv, "v_new is NULL", [](DecodeArgs& a) { a.v_new = nullptr; });
  all("out_null", kInv, "out is NULL", [](DecodeArgs& a) { a.out = nullptr; });
  all("window_right", kInv, "window_right", [](DecodeArgs& a) { a.p.window_right = 3; });
  all("window_left_below_minus_one", kInv, "window_left", [](DecodeArgs& a) { a.p.window_left = -2; });
  all("documents", kInv, "cu_seqlens", [](DecodeArgs& a) {
    static int64_t cu[3] = {0, 1, 2};
    a.p.cu_seqlens = cu;
    a.p.num_seqs = 1;
  });
  all("plan", kInv, "params->plan", [](DecodeArgs& a) { a.p.plan = fake_plan; });
  all("softcap_negative", kInv, "softcap", [](DecodeArgs& a) { a.p.softcap = -1.f; });
  all("stream_on_cpu", kInv, "stream", [](DecodeArgs& a) { a.stream = reinterpret_cast<void*>(0x10); });
  all("heads_do_not_divide", kInv, "heads", [](DecodeArgs& a) {
    static Tensor q3({2, 2, 3, 16}, Dt::kF32);
    static Tensor o3({2, 2, 3, 16}, Dt::kF32);
    a.q = &q3.dl;
    a.out = &o3.dl;
  });
  all("lse_shape", kInv, "lse", [](DecodeArgs& a) {
    static Tensor l({2, 4, 3}, Dt::kF32);
    a.lse = &l.dl;
  });
  all("out_dtype", kInv, "out", [](DecodeArgs& a) {
    static Tensor o({2, 2, 4, 16}, Dt::kBF16);
    a.out = &o.dl;
  });
  all("k_new_shape", kInv, "k_new", [](DecodeArgs& a) {
    static Tensor k({2, 1, 2, 16}, Dt::kF32);
    a.k_new = &k.dl;
  });
  all("block_table_dtype", kInv, "block_table", [](DecodeArgs& a) {
    thread_local DLTensor t{};
    t = *a.cache.block_table;
    t.dtype = DLDataType{kDLInt, 64, 1};
    a.cache.block_table = &t;
  });
  all("sinks_shape", kInv, "sinks", [](DecodeArgs& a) {
    thread_local DLTensor t{};
    t.data = flat;
    t.device = DLDevice{kDLCPU, 0};
    t.ndim = 1;
    t.dtype = DLDataType{kDLFloat, 32, 1};
    t.shape = flat_shape;
    a.p.sinks = &t;
  });
  // One rank alone is wrong: both fail, the good one naming the other.
  v.push_back(BadDecode{"block_table_entry_on_rank_1", kInv, "block_table[1][2]", [](int r, DecodeArgs& a) {
                          if (r != 1) return;
                          thread_local DLTensor t{};
                          t = *a.cache.block_table;
                          t.data = bad_table;
                          a.cache.block_table = &t;
                        }});
  v.push_back(BadDecode{"lens_differ_across_ranks", kInv, "ranks disagree", [](int r, DecodeArgs& a) {
                          if (r == 1) a.cache.lens = other_lens;
                        }});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Bad, DecodeErrors, ::testing::ValuesIn(BadDecodes()),
                         [](const ::testing::TestParamInfo<BadDecode>& i) { return i.param.name; });

}  // namespace
}  // namespace stria_test
