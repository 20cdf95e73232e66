// The decode cases shared by the serving suites (tests/test_serving.cc on the CPU,
// tests/gpu/test_cuda_serving.cc on CUDA): a case's shape, where the cache keeps each position,
// every rank's share of a cache, the inputs and float64 reference of a decode call, and the checks
// of its results.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "test_util.h"

namespace stria_test {

struct Case {
  int n = 2;
  stria_layout_t layout = STRIA_LAYOUT_STRIPED;
  bool paged = false;
  int64_t block_size = 16;
  Dt dt = Dt::kF32;
  int64_t B = 2, T = 1, Hq = 4, Hkv = 2, D = 32;
  int64_t capacity = 96;  // slots per rank (a paged cache: max_blocks * block_size)
  std::vector<int64_t> lens;
  bool append = true;
  bool causal = true;
  int64_t window_left = -1;
  double softcap = 0;
  bool sinks = false;
  stria_prefill_t mode = STRIA_PREFILL_AUTO;  // prefill cases: T is the new tokens per rank
  std::string Name() const {
    std::string s =
        Format("N%d_%s_%s_%s_B%lld_T%lld_H%lldx%lld_D%lld", n, LayoutName(layout), paged ? "paged" : "contig",
               DtName(dt), (long long)B, (long long)T, (long long)Hq, (long long)Hkv, (long long)D);
    if (!append) s += "_noappend";
    if (!causal) s += "_full";
    if (window_left >= 0) s += Format("_w%lld", (long long)window_left);
    if (softcap > 0) s += "_softcap";
    if (sinks) s += "_sinks";
    return s;
  }
  static std::string Format(const char* fmt, ...) {
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
  }
};

// gtest prints a parameter's bytes unless told otherwise (padding included); the name says it all.
inline void PrintTo(const Case& c, std::ostream* os) {
  *os << c.Name();
}

// Where the cache keeps position t (stria.h, stria_kv_cache_t), written out independently here.
inline void Place(const Case& c, int64_t t, int* rank, int64_t* slot) {
  const int64_t n = c.n, cap = c.capacity;
  if (c.layout == STRIA_LAYOUT_STRIPED) {
    *rank = static_cast<int>(t % n);
    *slot = t / n;
  } else if (c.layout == STRIA_LAYOUT_CONTIGUOUS) {
    *rank = static_cast<int>(t / cap);
    *slot = t % cap;
  } else {
    const int64_t half = cap / 2, chunk = t / half;
    *rank = static_cast<int>(chunk < n ? chunk : 2 * n - 1 - chunk);
    *slot = (chunk < n ? 0 : half) + t % half;
  }
}

// One rank's cache: contiguous [B, cap, Hkv, D], or a pool [blocks, block_size, Hkv, D] with a
// shuffled block table. Every slot starts as NaN: a read of a slot the call should not see fails.
struct RankCache {
  Tensor k, v, table;
  std::vector<int32_t> table_data;
  std::vector<int64_t> table_shape;
  DLTensor table_dl{};
  int64_t max_blocks = 0, num_blocks = 0;

  RankCache(const Case& c, std::mt19937_64& rng) {
    if (c.paged) {
      max_blocks = c.capacity / c.block_size;
      num_blocks = c.B * max_blocks + 3;  // spare blocks nobody uses
      k.Init({num_blocks, c.block_size, c.Hkv, c.D}, c.dt);
      v.Init({num_blocks, c.block_size, c.Hkv, c.D}, c.dt);
      std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      table_data.assign(perm.begin(), perm.begin() + c.B * max_blocks);
      table_shape = {c.B, max_blocks};
      table_dl.data = table_data.data();
      table_dl.device = DLDevice{kDLCPU, 0};
      table_dl.ndim = 2;
      table_dl.dtype = DLDataType{kDLInt, 32, 1};
      table_dl.shape = table_shape.data();
    } else {
      k.Init({c.B, c.capacity, c.Hkv, c.D}, c.dt);
      v.Init({c.B, c.capacity, c.Hkv, c.D}, c.dt);
    }
    k.Poison();
    v.Poison();
  }
  // Flat element index of (b, slot, h, 0).
  int64_t Index(const Case& c, int64_t b, int64_t slot, int64_t h) const {
    if (!c.paged) return ((b * c.capacity + slot) * c.Hkv + h) * c.D;
    const int64_t block = table_data[static_cast<size_t>(b * max_blocks + slot / c.block_size)];
    return ((block * c.block_size + slot % c.block_size) * c.Hkv + h) * c.D;
  }
};

// Every rank's cache holding the prefix of the whole cache kf, vf ([B, S, Hkv, D]): positions below
// lens[b] of sequence b, each in the slot that holds it.
inline std::vector<RankCache> ShardCache(const Case& c, const Tensor& kf, const Tensor& vf, std::mt19937_64& rng) {
  const int64_t most = kf.shape[1], Hkv = c.Hkv, D = c.D;
  std::vector<RankCache> caches;
  for (int r = 0; r < c.n; ++r) caches.emplace_back(c, rng);
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < c.lens[static_cast<size_t>(b)]; ++t) {
      int rank = 0;
      int64_t slot = 0;
      Place(c, t, &rank, &slot);
      RankCache& rc = caches[static_cast<size_t>(rank)];
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          rc.k.Set(rc.Index(c, b, slot, h) + d, kf.Get(((b * most + t) * Hkv + h) * D + d));
          rc.v.Set(rc.Index(c, b, slot, h) + d, vf.Get(((b * most + t) * Hkv + h) * D + d));
        }
    }
  return caches;
}

// Random attention-sink logits, one per query head: *values for the reference, the tensor for the call.
inline Tensor SinkLogits(int64_t Hq, std::mt19937_64& rng, std::vector<double>* values) {
  values->resize(static_cast<size_t>(Hq));
  for (double& z : *values) z = std::normal_distribution<double>(0.5, 1.0)(rng);
  Tensor t({Hq}, Dt::kF32);
  for (int64_t h = 0; h < Hq; ++h) t.Set(h, (*values)[static_cast<size_t>(h)]);
  return t;
}

// A decode call's inputs, drawn from `seed`: the whole cache as one device would hold it
// ([B, most, Hkv, D]), the queries, the new tokens (the cache's next positions), the sinks, every
// rank's share of the cache, and the float64 reference.
struct DecodeInputs {
  int64_t added = 0, most = 0;
  Tensor kf, vf, q, k_new, v_new, sinks_t;
  std::vector<double> sinks;
  std::vector<RankCache> caches;
  Reference ref;

  DecodeInputs(const Case& c, uint64_t seed) {
    std::mt19937_64 rng(seed);
    const int64_t B = c.B, T = c.T, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    added = c.append ? T : 0;
    for (int64_t l : c.lens) most = std::max(most, l + added);
    kf.Init({B, std::max<int64_t>(most, 1), Hkv, D}, c.dt);
    vf.Init({B, std::max<int64_t>(most, 1), Hkv, D}, c.dt);
    kf.FillRandom(rng);
    vf.FillRandom(rng);
    q.Init({B, T, Hq, D}, c.dt);
    k_new.Init({B, T, Hkv, D}, c.dt);
    v_new.Init({B, T, Hkv, D}, c.dt);
    q.FillRandom(rng);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < added; ++t)
        for (int64_t i = 0; i < Hkv * D; ++i) {
          k_new.Set((b * T + t) * Hkv * D + i, kf.Get((b * most + c.lens[static_cast<size_t>(b)] + t) * Hkv * D + i));
          v_new.Set((b * T + t) * Hkv * D + i, vf.Get((b * most + c.lens[static_cast<size_t>(b)] + t) * Hkv * D + i));
        }
    sinks_t = SinkLogits(Hq, rng, &sinks);
    caches = ShardCache(c, kf, vf, rng);
    ScoreMods mods;
    mods.softcap = c.softcap;
    mods.sinks = c.sinks ? &sinks : nullptr;
    ref = DecodeReference(q, kf, vf, c.lens, added, c.causal, c.window_left, mods);
  }
};

// The params of a case's calls.
inline stria_attention_params_t DecodeParams(const Case& c, DLTensor* sinks) {
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.layout = c.layout;
  p.causal = c.causal ? 1 : 0;
  p.window_left = c.window_left;
  p.softcap = static_cast<float>(c.softcap);
  p.sinks = c.sinks ? sinks : nullptr;
  return p;
}

// Every rank's out and LSE (host copies) against the reference and each other (the same bits on
// every rank), and the new tokens in the slots of their ranks exactly as given (`caches`: every
// rank's cache after the call, on the host).
inline void ExpectDecodeResults(const Case& c, const DecodeInputs& in, const std::vector<Tensor>& outs,
                                const std::vector<Tensor>& lses, const std::vector<RankCache>& caches) {
  const double tol = c.dt == Dt::kF32 ? 1e-5 : 2e-2;
  EXPECT_LT(RelError(outs[0].ToDouble(), in.ref.out), tol);
  EXPECT_LT(RelError(lses[0].ToDouble(), in.ref.lse), c.dt == Dt::kF32 ? 1e-5 : 1e-3);
  for (int r = 1; r < c.n; ++r) {
    EXPECT_EQ(0,
              std::memcmp(outs[0].storage.data(), outs[static_cast<size_t>(r)].storage.data(), outs[0].storage.size()))
        << "rank " << r << "'s output differs from rank 0's";
    EXPECT_EQ(0,
              std::memcmp(lses[0].storage.data(), lses[static_cast<size_t>(r)].storage.data(), lses[0].storage.size()))
        << "rank " << r << "'s LSE differs from rank 0's";
  }
  for (int64_t b = 0; b < c.B; ++b)
    for (int64_t t = 0; t < in.added; ++t) {
      int rank = 0;
      int64_t slot = 0;
      Place(c, c.lens[static_cast<size_t>(b)] + t, &rank, &slot);
      const RankCache& rc = caches[static_cast<size_t>(rank)];
      for (int64_t h = 0; h < c.Hkv; ++h)
        for (int64_t d = 0; d < c.D; ++d) {
          ASSERT_EQ(rc.k.Get(rc.Index(c, b, slot, h) + d), in.k_new.Get(((b * c.T + t) * c.Hkv + h) * c.D + d));
          ASSERT_EQ(rc.v.Get(rc.Index(c, b, slot, h) + d), in.v_new.Get(((b * c.T + t) * c.Hkv + h) * c.D + d));
        }
    }
}

// Prefill: P = T * n new tokens per sequence, rank r holding those of the layout's chunk positions
// (local token i is chunk position pos[r][i], at lens[b] + pos[r][i]); each attends to the cache and,
// causally, to the new tokens. The inputs drawn from `seed`, every rank's share of the cache, and
// the reference over the whole cache.
struct PrefillInputs {
  int64_t P = 0, most = 0;
  Tensor kf, vf, qf, sinks_t;
  std::vector<double> sinks;
  std::vector<RankCache> caches;
  std::vector<std::vector<int64_t>> pos;
  std::vector<Tensor> qs, ks, vs;  // each rank's new tokens
  Reference ref;

  PrefillInputs(const Case& c, uint64_t seed) {
    const int64_t B = c.B, L = c.T, Hq = c.Hq, Hkv = c.Hkv, D = c.D;
    P = L * c.n;
    std::mt19937_64 rng(seed);
    for (int64_t l : c.lens) most = std::max(most, l + P);
    kf.Init({B, most, Hkv, D}, c.dt);
    vf.Init({B, most, Hkv, D}, c.dt);
    qf.Init({B, P, Hq, D}, c.dt);
    kf.FillRandom(rng);
    vf.FillRandom(rng);
    qf.FillRandom(rng);
    sinks_t = SinkLogits(Hq, rng, &sinks);
    caches = ShardCache(c, kf, vf, rng);
    pos.assign(static_cast<size_t>(c.n), std::vector<int64_t>(static_cast<size_t>(L)));
    for (int r = 0; r < c.n; ++r) {
      EXPECT_EQ(stria_layout_positions(c.layout, P, c.n, r, pos[static_cast<size_t>(r)].data()), STRIA_SUCCESS);
      qs.emplace_back(std::vector<int64_t>{B, L, Hq, D}, c.dt);
      ks.emplace_back(std::vector<int64_t>{B, L, Hkv, D}, c.dt);
      vs.emplace_back(std::vector<int64_t>{B, L, Hkv, D}, c.dt);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < L; ++i) {
          const int64_t cp = pos[static_cast<size_t>(r)][static_cast<size_t>(i)];
          const int64_t at = c.lens[static_cast<size_t>(b)] + cp;
          for (int64_t x = 0; x < Hq * D; ++x)
            qs.back().Set((b * L + i) * Hq * D + x, qf.Get((b * P + cp) * Hq * D + x));
          for (int64_t x = 0; x < Hkv * D; ++x) {
            ks.back().Set((b * L + i) * Hkv * D + x, kf.Get((b * most + at) * Hkv * D + x));
            vs.back().Set((b * L + i) * Hkv * D + x, vf.Get((b * most + at) * Hkv * D + x));
          }
        }
    }
    ScoreMods mods;
    mods.softcap = c.softcap;
    mods.sinks = c.sinks ? &sinks : nullptr;
    ref = DecodeReference(qf, kf, vf, c.lens, P, c.causal, c.window_left, mods);
  }
};

// Every rank's out and LSE (host copies) against the reference's rows of its tokens, and every new
// token in the slot that holds its position, exactly as given (`caches`: every rank's cache after
// the call, on the host). Returns each rank's output.
inline std::vector<std::vector<double>> ExpectPrefillResults(const Case& c, const PrefillInputs& in,
                                                             const std::vector<Tensor>& outs,
                                                             const std::vector<Tensor>& lses,
                                                             const std::vector<RankCache>& caches) {
  const int64_t B = c.B, L = c.T, Hq = c.Hq, Hkv = c.Hkv, D = c.D, P = in.P;
  std::vector<std::vector<double>> results;
  const double tol = c.dt == Dt::kF32 ? 1e-5 : 2e-2;
  for (int r = 0; r < c.n; ++r) {
    const std::vector<int64_t>& pos = in.pos[static_cast<size_t>(r)];
    std::vector<double> want_out, want_lse;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < L; ++i)
        for (int64_t x = 0; x < Hq * D; ++x)
          want_out.push_back(in.ref.out[static_cast<size_t>((b * P + pos[static_cast<size_t>(i)]) * Hq * D + x)]);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < Hq; ++h)
        for (int64_t i = 0; i < L; ++i)
          want_lse.push_back(in.ref.lse[static_cast<size_t>((b * Hq + h) * P + pos[static_cast<size_t>(i)])]);
    results.push_back(outs[static_cast<size_t>(r)].ToDouble());
    EXPECT_LT(RelError(results.back(), want_out), tol) << "rank " << r;
    EXPECT_LT(RelError(lses[static_cast<size_t>(r)].ToDouble(), want_lse), c.dt == Dt::kF32 ? 1e-5 : 1e-3)
        << "rank " << r;
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < P; ++t) {
      const int64_t at = c.lens[static_cast<size_t>(b)] + t;
      int rank = 0;
      int64_t slot = 0;
      Place(c, at, &rank, &slot);
      const RankCache& rc = caches[static_cast<size_t>(rank)];
      for (int64_t h = 0; h < Hkv; ++h)
        for (int64_t d = 0; d < D; ++d) {
          EXPECT_EQ(rc.k.Get(rc.Index(c, b, slot, h) + d), in.kf.Get(((b * in.most + at) * Hkv + h) * D + d))
              << "sequence " << b << " position " << at;
          EXPECT_EQ(rc.v.Get(rc.Index(c, b, slot, h) + d), in.vf.Get(((b * in.most + at) * Hkv + h) * D + d));
          if (::testing::Test::HasFailure()) return results;
        }
    }
  return results;
}

// Decode cases over a long cache (`base`: its ranks, heads, capacity and lengths): windows of 0, 7
// and 300 keys, softcap, sinks, and a sequence with no key at all, with and without a sink.
inline void AppendDecodeScoreCases(Case c, std::vector<Case>* cases) {
  for (int64_t w : {0, 7, 300}) {
    c.window_left = w;
    cases->push_back(c);
  }
  c.window_left = -1;
  c.softcap = 5.0;
  cases->push_back(c);
  c.softcap = 0;
  c.sinks = true;
  cases->push_back(c);
  c.lens = {0, 3};  // a sequence with no key at all: out 0 and LSE the sink
  c.append = false;
  cases->push_back(c);
  c.sinks = false;  // and without a sink: out 0, LSE -inf
  cases->push_back(c);
}

// The head dims of the model families (128, 256, and Gemma 4's global layers' 512 where the
// backend takes it: up to max_d) on two ranks of `capacity` slots, bf16.
inline void AppendDecodeHeadDimCases(int64_t capacity, int64_t max_d, std::vector<Case>* cases) {
  for (int64_t D : {128, 256, 512}) {
    if (D > max_d) continue;
    Case c;
    c.n = 2;
    c.D = D;
    c.dt = Dt::kBF16;
    c.capacity = capacity;
    c.lens = {2 * capacity - 2, 57};
    c.B = 2;
    cases->push_back(c);
  }
}

// The prefill cases beyond rank counts and layouts: GQA 4:1 on three ranks with a paged cache, a
// window, softcap and sinks, not causal, each dtype.
inline void AppendPrefillScoreCases(std::vector<Case>* cases) {
  Case c;
  c.n = 3;
  c.B = 2;
  c.T = 6;
  c.Hq = 8;
  c.Hkv = 2;
  c.D = 40;
  c.capacity = 64;
  c.paged = true;
  c.block_size = 8;
  c.lens = {100, 7};
  c.window_left = 20;
  cases->push_back(c);
  c.window_left = -1;
  c.softcap = 4.0;
  c.sinks = true;
  cases->push_back(c);
  c.causal = false;
  cases->push_back(c);
  c.causal = true;
  for (Dt dt : {Dt::kBF16, Dt::kF16}) {
    c.dt = dt;
    cases->push_back(c);
  }
}

// Random cache lengths in [0, room], one sequence empty and one full where B allows.
inline std::vector<int64_t> Lengths(int64_t B, int64_t room, std::mt19937_64& rng) {
  std::vector<int64_t> lens(static_cast<size_t>(B));
  for (int64_t& l : lens) l = std::uniform_int_distribution<int64_t>(0, room)(rng);
  if (B > 1) lens[0] = 0;
  if (B > 2) lens[2] = room;
  return lens;
}

// Features in random combination, each case from its seed: ranks, layout, a contiguous or paged
// cache, dtype, GQA, head dim, new tokens, lengths, appending or not (decode), causal or not, a
// window, softcap, sinks. `prefill`: T is the new tokens per rank, and the layout must split them.
// The other cases take each feature through its own; these are for how they meet.
inline std::vector<Case> RandomCases(bool prefill, int count) {
  std::vector<Case> cases;
  for (int seed = 0; seed < count; ++seed) {
    std::mt19937_64 rng(static_cast<uint64_t>(seed) * 104729 + (prefill ? 7 : 3));
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
    Case c;
    c.n = 1 + pick(5);
    c.layout = static_cast<stria_layout_t>(pick(3));
    c.paged = pick(2) != 0;
    c.block_size = pick(2) ? 8 : 16;
    c.dt = std::vector<Dt>{Dt::kF32, Dt::kBF16, Dt::kF16}[static_cast<size_t>(pick(3))];
    c.B = 1 + pick(3);
    c.Hkv = 1 + pick(2);
    c.Hq = c.Hkv * std::vector<int64_t>{1, 2, 4}[static_cast<size_t>(pick(3))];
    c.D = std::vector<int64_t>{32, 40, 64, 128}[static_cast<size_t>(pick(4))];
    c.T = prefill ? (c.layout == STRIA_LAYOUT_ZIGZAG ? 2 * (1 + pick(2)) : 1 + pick(4)) : 1 + pick(4);
    c.capacity = c.block_size * 2 * (1 + pick(4));  // whole blocks, an even count of slots
    const int64_t added = prefill ? c.n * c.T : c.T;
    if (c.n * c.capacity < added) c.capacity = c.block_size * 2 * ((added + 2 * c.block_size - 1) / (2 * c.block_size));
    c.lens = Lengths(c.B, c.n * c.capacity - added, rng);
    if (!prefill) c.append = pick(3) != 0;
    c.causal = pick(4) != 0;
    if (pick(3) == 0) c.window_left = pick(static_cast<int>(c.n * c.capacity));
    if (pick(4) == 0) c.softcap = 30.0;
    c.sinks = pick(4) == 0;
    cases.push_back(c);
  }
  return cases;
}

// How many random cases a suite lists: STRIA_TEST_RANDOM_CASES (read when the tests are listed),
// else `fallback`.
inline int RandomCaseCount(int fallback) {
  const char* env = std::getenv("STRIA_TEST_RANDOM_CASES");
  return env != nullptr ? std::atoi(env) : fallback;
}

// NaN never passes: a NaN in one new token's key (sequence 1, token 0, K/V head 1; stored into
// the cache, then seen by the call's queries) must make exactly the rows that see it NaN, out and
// LSE, on every rank, and leave every other row finite. The case (a new token per sequence, GQA
// 4:1, causal), the poison, and the check of every rank's results.
// Keys the window hides, just before its start: an infinite V there must not reach the rows (the
// reference never reads it). Sequence 0's V rows at positions 3 to 9 before the window's first key
// (of the first new token) are infinite: on a rank's run, in the 64-key block that holds the
// window's start (striped: every other position; contiguous: the same rank). A call's keys start
// at the window (FirstSeenPosition), and a kernel's product takes only the keys some row sees
// (which CudaDecodeCalls.AKeyOnlyTheFirstTokenSeesStaysInItsCtas checks on its own).
inline Case WindowCase(Dt dt, int64_t D, stria_layout_t layout) {
  Case c;
  c.n = 2;
  c.B = 1;
  c.Hq = 8;
  c.Hkv = 2;
  c.D = D;
  c.dt = dt;
  c.layout = layout;
  c.capacity = 300;
  c.lens = {500};
  c.window_left = 40;
  return c;
}
inline void PoisonKeysBeforeTheWindow(const Case& c, DecodeInputs* in) {
  const int64_t query = c.lens[0];
  for (int64_t p = query - c.window_left - 9; p < query - c.window_left - 2; ++p) {
    int rank = 0;
    int64_t slot = 0;
    Place(c, p, &rank, &slot);
    RankCache& rc = in->caches[static_cast<size_t>(rank)];
    for (int64_t h = 0; h < c.Hkv; ++h) rc.v.Set(rc.Index(c, 0, slot, h) + 5, INFINITY);
  }
}

// A paged cache over three ranks with a window of 20 keys, whose sequences reach well past it:
// the cases of ForgetPagesBefore.
inline Case PagedWindowCase(stria_layout_t layout) {
  Case c;
  c.n = 3;
  c.layout = layout;
  c.paged = true;
  c.block_size = 4;
  c.capacity = 96;
  c.B = 2;
  c.lens = {230, 61};
  c.window_left = 20;
  return c;
}
// What a serving engine that reclaims a sliding window's pages leaves in a paged cache's block
// table: every entry whose block holds only positions before first[b] is -1 (not a block of the
// pool), on every rank. No query sees those keys, so a call must not look the entries up.
inline void ForgetPagesBefore(const Case& c, const std::vector<int64_t>& first, std::vector<RankCache>* caches) {
  for (int64_t b = 0; b < c.B; ++b) {
    std::vector<std::vector<bool>> keep(caches->size(), std::vector<bool>(static_cast<size_t>(c.capacity), false));
    for (int64_t p = 0; p < c.n * c.capacity; ++p) {
      int rank = 0;
      int64_t slot = 0;
      Place(c, p, &rank, &slot);
      if (p >= first[static_cast<size_t>(b)])
        keep[static_cast<size_t>(rank)][static_cast<size_t>(slot / c.block_size)] = true;
    }
    for (size_t r = 0; r < caches->size(); ++r) {
      RankCache& rc = (*caches)[r];
      for (int64_t i = 0; i < rc.max_blocks; ++i)
        if (!keep[r][static_cast<size_t>(i)]) rc.table_data[static_cast<size_t>(b * rc.max_blocks + i)] = -1;
    }
  }
}
// The first position a call's new tokens see under the case's window (the first new token's, at
// the sequence's cached length).
inline std::vector<int64_t> WindowStarts(const Case& c) {
  std::vector<int64_t> first;
  for (int64_t len : c.lens) first.push_back(len - c.window_left);
  return first;
}

inline Case NaNKeyCase(Dt dt, int64_t D) {
  Case c;
  c.n = 3;
  c.dt = dt;
  c.D = D;
  c.B = 2;
  c.Hq = 8;
  c.Hkv = 2;
  c.capacity = 120;
  c.lens = {150, 300};
  return c;
}
inline void PoisonOneNewKey(const Case& c, DecodeInputs* in) {
  in->k_new.Set(((1 * c.T + 0) * c.Hkv + 1) * c.D + 3, std::nan(""));
}
inline void ExpectNaNExactlyWhereSeen(const Case& c, const std::vector<Tensor>& outs, const std::vector<Tensor>& lses) {
  const int64_t group = c.Hq / c.Hkv;
  for (size_t r = 0; r < outs.size(); ++r)
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t h = 0; h < c.Hq; ++h) {
          const bool sees = b == 1 && h / group == 1;
          const double lse = lses[r].Get((b * c.Hq + h) * c.T + t);
          EXPECT_EQ(std::isnan(lse), sees) << "rank " << r << ", sequence " << b << ", head " << h << ": lse " << lse;
          for (int64_t d = 0; d < c.D; ++d) {
            const double o = outs[r].Get(((b * c.T + t) * c.Hq + h) * c.D + d);
            ASSERT_EQ(std::isnan(o), sees) << "rank " << r << ", sequence " << b << ", head " << h << ", d " << d;
          }
        }
}

// Speculative decode on four ranks of `capacity` slots: several new tokens per sequence, causal
// among themselves, then seeing each other, then none appended (the queries see the cache alone);
// MQA and a head dim off the kernels' tiles and vector widths.
inline void AppendSpeculativeCases(int64_t B, int64_t capacity, std::mt19937_64& rng, std::vector<Case>* cases) {
  Case c;
  c.n = 4;
  c.T = 4;
  c.Hq = 6;
  c.Hkv = 1;
  c.D = 40;
  c.B = B;
  c.capacity = capacity;
  c.lens = Lengths(c.B, c.n * c.capacity - c.T, rng);
  cases->push_back(c);
  c.causal = false;  // every new token sees every other
  cases->push_back(c);
  c.causal = true;
  c.append = false;  // the queries see the cache alone
  c.layout = STRIA_LAYOUT_CONTIGUOUS;
  cases->push_back(c);
}

}  // namespace stria_test
