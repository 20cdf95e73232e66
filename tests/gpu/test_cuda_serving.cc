// Decode and prefill over a KV cache sharded across CUDA ranks (stria_attention_decode and
// stria_attention_prefill on the CUDA backend), against the float64 reference over the whole cache
// on one device: the cases of the CPU suite (tests/serving_cases.h) with every tensor in device
// memory, block tables included, on local groups of 1 to 5 ranks. Every rank must give the same
// bits, the new tokens must land in the slots of the ranks that hold their positions, pass-KV and
// pass-Q must agree, and a bad block table entry must fail every rank with a message and leave the
// group usable.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpu_util.h"
#include "serving_cases.h"

namespace stria_test {
namespace {

// Device copies of one rank's cache: K, V and a paged cache's block table (or, `table_on_host`, the
// table where the test keeps it, in host memory, as serving engines keep one beside the device's).
struct DeviceCache {
  std::unique_ptr<DeviceTensor> k, v;
  int32_t* table = nullptr;
  DLTensor table_dl{};

  DeviceCache(const Case& c, const RankCache& rc, bool table_on_host = false)
      : k(std::make_unique<DeviceTensor>(rc.k)), v(std::make_unique<DeviceTensor>(rc.v)) {
    if (!c.paged) return;
    if (table_on_host) {
      table_dl = rc.table_dl;  // its data: rc.table_data, host memory
      return;
    }
    const size_t bytes = rc.table_data.size() * sizeof(int32_t);
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&table), bytes), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(table, rc.table_data.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    table_dl = rc.table_dl;
    table_dl.data = table;
    table_dl.device = DLDevice{kDLCUDA, 0};
  }
  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;
  ~DeviceCache() { cudaFree(table); }
  void Fill(const Case& c, const std::vector<int64_t>& lens, stria_kv_cache_t* cache) {
    stria_kv_cache_init(cache);
    cache->k = &k->dl;
    cache->v = &v->dl;
    cache->block_table = c.paged ? &table_dl : nullptr;
    cache->lens = lens.data();
  }
};

// Runs one decode call on a CUDA local group: every rank's out and LSE back on the host, and every
// rank's cache back into in.caches (where the new tokens landed). `on_stream`: the call's stream is
// one the test creates (else the default stream); `lens_on_device`: cache->lens in device memory;
// `counts` (on the runtime model): what the ranks' calls queued; `table_on_host`: a paged cache's
// block table in host memory.
void RunCudaDecode(const Case& c, DecodeInputs& in, std::vector<Tensor>& outs_host, std::vector<Tensor>& lses_host,
                   bool on_stream = false, bool lens_on_device = false, ModelCounts* counts = nullptr,
                   bool table_on_host = false) {
  const int64_t B = c.B, T = c.T, Hq = c.Hq, D = c.D;
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CudaGroup g(c.n);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  DeviceTensor q(in.q), k_new(in.k_new), v_new(in.v_new), sinks(in.sinks_t);
  std::vector<std::unique_ptr<DeviceCache>> caches;
  std::vector<std::unique_ptr<DeviceTensor>> outs, lses;
  for (int r = 0; r < c.n; ++r) {
    caches.push_back(std::make_unique<DeviceCache>(c, in.caches[static_cast<size_t>(r)], table_on_host));
    outs_host.emplace_back(std::vector<int64_t>{B, T, Hq, D}, c.dt);
    lses_host.emplace_back(std::vector<int64_t>{B, Hq, T}, Dt::kF32);
    outs.push_back(std::make_unique<DeviceTensor>(outs_host.back()));
    lses.push_back(std::make_unique<DeviceTensor>(lses_host.back()));
    outs.back()->Poison();
    lses.back()->Poison();
  }
  DeviceInt64s lens_dev(c.lens.size());
  ASSERT_EQ(cudaMemcpy(lens_dev.ptr, c.lens.data(), c.lens.size() * sizeof(int64_t), cudaMemcpyHostToDevice),
            cudaSuccess);
  std::vector<stria_status_t> st(static_cast<size_t>(c.n));
  std::vector<std::string> err(static_cast<size_t>(c.n));
  const ModelCounts before = counts != nullptr ? ModelCounts::Now() : ModelCounts();
  RunRanks(c.n, [&](int r) {
    cudaSetDevice(0);
    cudaStream_t stream = nullptr;
    if (on_stream) cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    stria_attention_params_t p = DecodeParams(c, &sinks.dl);
    stria_kv_cache_t cache;
    caches[static_cast<size_t>(r)]->Fill(c, c.lens, &cache);
    if (lens_on_device) cache.lens = lens_dev.ptr;
    st[static_cast<size_t>(r)] = stria_attention_decode(
        g.ctx[static_cast<size_t>(r)], &p, &cache, &q.dl, c.append ? &k_new.dl : nullptr,
        c.append ? &v_new.dl : nullptr, &outs[static_cast<size_t>(r)]->dl, &lses[static_cast<size_t>(r)]->dl, stream);
    if (st[static_cast<size_t>(r)] != STRIA_SUCCESS) err[static_cast<size_t>(r)] = stria_get_last_error();
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      cudaStreamDestroy(stream);
    }
  });
  for (int r = 0; r < c.n; ++r)
    ASSERT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << err[static_cast<size_t>(r)];
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (counts != nullptr) *counts = ModelCounts::Now() - before;
  for (int r = 0; r < c.n; ++r) {
    outs[static_cast<size_t>(r)]->CopyTo(&outs_host[static_cast<size_t>(r)]);
    lses[static_cast<size_t>(r)]->CopyTo(&lses_host[static_cast<size_t>(r)]);
    caches[static_cast<size_t>(r)]->k->CopyTo(&in.caches[static_cast<size_t>(r)].k);
    caches[static_cast<size_t>(r)]->v->CopyTo(&in.caches[static_cast<size_t>(r)].v);
  }
}

// One decode call against the float64 reference (RunCudaDecode's options); `prepare` may change
// the inputs first (what the reference never reads).
void RunCudaCase(const Case& c, uint64_t seed, bool on_stream = false, bool lens_on_device = false,
                 bool table_on_host = false, const std::function<void(DecodeInputs&)>& prepare = {}) {
  SCOPED_TRACE(c.Name());
  DecodeInputs in(c, seed);
  if (prepare) prepare(in);
  std::vector<Tensor> outs, lses;
  RunCudaDecode(c, in, outs, lses, on_stream, lens_on_device, nullptr, table_on_host);
  if (::testing::Test::HasFatalFailure()) return;
  ExpectDecodeResults(c, in, outs, lses, in.caches);
}

std::vector<Case> CudaCases() {
  std::vector<Case> cases;
  std::mt19937_64 rng(11);
  // Every rank count to 5 and layout, contiguous and paged caches (a block table on the device, its
  // blocks shuffled); lengths that differ, one empty and one full.
  for (int n : {1, 2, 3, 5})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG}) {
      Case c;
      c.n = n;
      c.layout = layout;
      c.paged = (n + static_cast<int>(layout)) % 2 == 1;
      c.dt = Dt::kBF16;
      c.B = 3;
      c.capacity = 64;
      c.lens = Lengths(c.B, n * c.capacity - c.T, rng);
      cases.push_back(c);
    }
  for (Dt dt : {Dt::kF32, Dt::kF16}) {
    Case c;
    c.n = 3;
    c.dt = dt;
    c.lens = Lengths(c.B, c.n * c.capacity - c.T, rng);
    cases.push_back(c);
  }
  AppendSpeculativeCases(2, 48, rng, &cases);
  {  // more rows than a CTA takes (GQA 12:1 times 2 tokens); windows, softcap, sinks over many items
    Case c;
    c.n = 3;
    c.B = 2;
    c.T = 2;
    c.Hq = 24;
    c.Hkv = 2;
    c.D = 64;
    c.dt = Dt::kBF16;
    c.capacity = 400;
    c.paged = true;  // pages of 16 keys, each a segment of its own: the items join them
    c.lens = {1100, 613};
    cases.push_back(c);
    c.T = 1;
    c.Hq = 8;
    AppendDecodeScoreCases(c, &cases);
  }
  AppendDecodeHeadDimCases(150, 512, &cases);
  // The tensor-core decode (16-bit rows at D 64 and 128): each layout, contiguous and paged, both
  // 16-bit dtypes, speculative tokens (causal among themselves, rows from several tokens in one
  // m16 tile) and lengths that end in partial tiles of 64 keys.
  for (Dt dt : {Dt::kBF16, Dt::kF16})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG}) {
      Case c;
      c.n = 3;
      c.layout = layout;
      c.paged = layout != STRIA_LAYOUT_CONTIGUOUS;
      c.dt = dt;
      c.B = 3;
      c.T = dt == Dt::kF16 ? 3 : 1;
      c.Hq = 8;
      c.Hkv = 2;
      c.D = layout == STRIA_LAYOUT_ZIGZAG ? 64 : 128;
      c.capacity = 160;
      c.lens = Lengths(c.B, c.n * c.capacity - c.T, rng);
      cases.push_back(c);
    }
  {  // many new tokens (the wide tensor-core form: 160 rows a K/V head, two whole CTAs of 64 rows
     // and part of a third) over several work items, causal among themselves, with a window
    Case c;
    c.n = 2;
    c.dt = Dt::kBF16;
    c.B = 2;
    c.T = 20;
    c.Hq = 16;
    c.Hkv = 2;
    c.D = 128;
    c.capacity = 700;
    c.paged = true;
    c.lens = {1200, 75};
    cases.push_back(c);
    c.window_left = 300;
    c.dt = Dt::kF16;
    c.D = 64;
    c.paged = false;
    cases.push_back(c);
  }
  {  // a world of one finishes on the device: with sinks, and a sequence that sees no key at all
    Case c;
    c.n = 1;
    c.dt = Dt::kBF16;
    c.B = 2;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = 128;
    c.capacity = 300;
    c.sinks = true;
    c.lens = {0, 290};
    c.append = false;
    cases.push_back(c);
    c.append = true;
    c.dt = Dt::kF32;
    c.D = 40;
    cases.push_back(c);
    c.sinks = false;  // and speculative tokens: every stride of out and lse in use
    c.dt = Dt::kF16;
    c.D = 64;
    c.T = 3;
    c.lens = {17, 250};
    cases.push_back(c);
  }
  return cases;
}

class CudaDecode : public ::testing::TestWithParam<Case> {};

TEST_P(CudaDecode, MatchesOneDevice) {
  STRIA_REQUIRE_GPU();
  RunCudaCase(GetParam(), 4321);
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecode, ::testing::ValuesIn(CudaCases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_" + std::to_string(i.index);
                         });
INSTANTIATE_TEST_SUITE_P(Random, CudaDecode, ::testing::ValuesIn(RandomCases(false, RandomCaseCount(4))),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_seed" + std::to_string(i.index);
                         });

// The caller's stream and cache->lens in device memory (a framework's tensor).
TEST(CudaDecodeCalls, OnTheCallersStreamWithLengthsOnTheDevice) {
  STRIA_REQUIRE_GPU();
  Case c;
  c.n = 3;
  c.dt = Dt::kBF16;
  c.layout = STRIA_LAYOUT_ZIGZAG;
  c.lens = {37, 150, 0};
  c.B = 3;
  RunCudaCase(c, 99, /*on_stream=*/true, /*lens_on_device=*/true);
}

// NaN never passes (NaNKeyCase) on both decode kernels: the tensor-core one (bf16, D 128) in its
// narrow and wide forms, and SIMT (float32, D 40).
TEST(CudaDecodeCalls, ANaNInASeenKeyReachesExactlyTheRowsThatSeeIt) {
  STRIA_REQUIRE_GPU();
  // Forms 0-2: tensor cores narrow, wide (5 tokens x 4 heads), SIMT; 3: wide over empty caches, where
  // the first token's only key is the NaN (a maximum of -inf beside a NaN sum).
  for (const int form : {0, 1, 2, 3}) {
    const bool tensor_cores = form != 2;
    Case c = NaNKeyCase(tensor_cores ? Dt::kBF16 : Dt::kF32, tensor_cores ? 128 : 40);
    if (form == 1 || form == 3) c.T = 5;
    if (form == 3) c.lens = {0, 0};
    SCOPED_TRACE(c.Name());
    DecodeInputs in(c, 77);
    PoisonOneNewKey(c, &in);
    std::vector<Tensor> outs, lses;
    RunCudaDecode(c, in, outs, lses);
    if (HasFatalFailure()) return;
    ExpectNaNExactlyWhereSeen(c, outs, lses);
  }
}

// A key the window hides never reaches the rows (WindowCase) on both decode kernels: SIMT
// (float32, and bf16 at D 40) and the tensor-core one (bf16, D 64) in its narrow and wide (5 tokens
// x 4 heads) forms, striped and contiguous.
TEST(CudaDecodeCalls, AKeyOutsideTheWindowNeverReachesTheRows) {
  STRIA_REQUIRE_GPU();
  struct Form {
    Dt dt;
    int64_t D, T;
  };
  for (const Form f : {Form{Dt::kF32, 64, 1}, Form{Dt::kBF16, 40, 1}, Form{Dt::kBF16, 64, 1}, Form{Dt::kBF16, 64, 5}})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS}) {
      Case c = WindowCase(f.dt, f.D, layout);
      c.T = f.T;
      RunCudaCase(c, 99, false, false, false, [&](DecodeInputs& in) { PoisonKeysBeforeTheWindow(c, &in); });
      if (HasFatalFailure()) return;
    }
}

// An infinite V at the window's first key, which of 20 new tokens only the first sees: the call's
// keys start there, so the kernels compute its tile for the later tokens too. A CTA's product
// takes only the keys some row of it sees (DecodeSpan::SeenKeys), so the value reaches the first
// token's rows and no row of a CTA without them. Checked on the last four tokens' rows, which both
// kernels give CTAs of their own: SIMT (float32; eight rows a CTA, two tokens of a group of four)
// and the tensor-core wide form (bf16; 64 rows a CTA, sixteen tokens); the first token's rows are
// not finite where V is. Rows that share a CTA with the first token's see what its product takes.
TEST(CudaDecodeCalls, AKeyOnlyTheFirstTokenSeesStaysInItsCtas) {
  STRIA_REQUIRE_GPU();
  for (Dt dt : {Dt::kF32, Dt::kBF16})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS}) {
      Case c = WindowCase(dt, 64, layout);
      c.T = 20;
      SCOPED_TRACE(c.Name());
      DecodeInputs in(c, 99);
      const int64_t first = c.lens[0] - c.window_left;  // the first token's window start
      int rank = 0;
      int64_t slot = 0;
      Place(c, first, &rank, &slot);
      RankCache& rc = in.caches[static_cast<size_t>(rank)];
      for (int64_t h = 0; h < c.Hkv; ++h) rc.v.Set(rc.Index(c, 0, slot, h) + 5, INFINITY);
      std::vector<Tensor> outs, lses;
      RunCudaDecode(c, in, outs, lses);
      if (HasFatalFailure()) return;
      std::vector<double> got, want;
      for (int64_t t = 0; t < c.T; ++t)
        for (int64_t x = 0; x < c.Hq * c.D; ++x) {
          const double o = outs[0].Get(t * c.Hq * c.D + x);
          if (t == 0 && x % c.D == 5) {
            ASSERT_FALSE(std::isfinite(o)) << "the first token's row " << x / c.D << " sees the infinite V";
          }
          if (t < 16) continue;
          got.push_back(o);
          want.push_back(in.ref.out[static_cast<size_t>(t * c.Hq * c.D + x)]);
        }
      EXPECT_LT(RelError(got, want), dt == Dt::kF32 ? 1e-5 : 2e-2) << "the last four tokens' rows";
    }
}

// A sliding window's calls read from the window's start: the block-table entries of pages wholly
// before it may hold anything (ForgetPagesBefore), here in device memory and, for the tensor-core
// kernel, in host memory. SIMT (float32) and tensor cores (bf16, D 64: one token, narrow, and five,
// wide), every layout, on three ranks.
TEST(CudaDecodeCalls, PagesBeforeTheWindowAreNeverLookedUp) {
  STRIA_REQUIRE_GPU();
  for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG})
    for (const int form : {0, 1, 2}) {
      Case c = PagedWindowCase(layout);
      c.dt = form == 0 ? Dt::kF32 : Dt::kBF16;
      c.D = form == 0 ? 32 : 64;
      c.T = form == 2 ? 5 : 1;
      c.Hq = form == 2 ? 8 : 4;  // 5 tokens x 4 heads: the wide form's 20 rows
      RunCudaCase(c, 5, false, false, /*table_on_host=*/form == 1,
                  [&](DecodeInputs& in) { ForgetPagesBefore(c, WindowStarts(c), &in.caches); });
      if (HasFatalFailure()) return;
    }
}

// The ranks' records travel device to device and one kernel merges them, sinks included: a decode
// call on several ranks (cache lengths and sinks in device memory) copies nothing to the host. And a
// world of one's step with a new token is one upload and three kernels (store the token, attend,
// merge the items into out and lse). Seen on the runtime model, which counts what a call queues.
TEST(CudaDecodeCalls, RanksMergeOnTheDeviceWithNoCopyToTheHost) {
  STRIA_REQUIRE_GPU();
  if (!ModelCounts::Available()) GTEST_SKIP() << "counts what a call queues on the runtime model only";
  for (const int n : {1, 2, 4}) {
    Case c;
    c.n = n;
    c.dt = Dt::kBF16;
    c.B = 2;
    c.T = 2;
    c.lens = {45, 90};
    c.sinks = true;
    SCOPED_TRACE(c.Name());
    DecodeInputs in(c, 31 + static_cast<uint64_t>(n));
    std::vector<Tensor> outs, lses;
    ModelCounts counts;
    RunCudaDecode(c, in, outs, lses, /*on_stream=*/true, /*lens_on_device=*/false, &counts);
    if (HasFatalFailure()) return;
    EXPECT_EQ(counts.to_host, 0u);
    if (n == 1) {
      EXPECT_EQ(counts.to_device, 1u);
      EXPECT_EQ(counts.launches, 3u);
    }
    ExpectDecodeResults(c, in, outs, lses, in.caches);
  }
}

// A paged cache's block table in host memory (serving engines keep one there beside the device's):
// the call reads it where it is, while a table in device memory comes to the host first (a copy
// after the stream's work, which the host waits for) at every call. The same results either way.
TEST(CudaDecodeCalls, ABlockTableOnTheHostIsReadWithoutACopy) {
  STRIA_REQUIRE_GPU();
  if (!ModelCounts::Available()) GTEST_SKIP() << "counts what a call queues on the runtime model only";
  for (const int n : {1, 3}) {
    for (const bool on_host : {false, true}) {
      Case c;
      c.n = n;
      c.dt = Dt::kBF16;
      c.B = 2;
      c.T = 1;
      c.capacity = 192;  // per rank: a world of one holds both sequences whole
      c.paged = true;
      c.lens = {45, 130};
      SCOPED_TRACE(c.Name() + (on_host ? " table on the host" : " table on the device"));
      DecodeInputs in(c, 57 + static_cast<uint64_t>(n));
      std::vector<Tensor> outs, lses;
      ModelCounts counts;
      RunCudaDecode(c, in, outs, lses, /*on_stream=*/true, /*lens_on_device=*/false, &counts, on_host);
      if (HasFatalFailure()) return;
      if (on_host)
        EXPECT_EQ(counts.to_host, 0u);
      else
        EXPECT_EQ(counts.to_host, static_cast<uint64_t>(n));  // each rank's table, once
      ExpectDecodeResults(c, in, outs, lses, in.caches);
    }
  }
}

// A generation loop: each step's new token goes into the cache (across the ranks' slots as the
// sequence grows) and the next step's queries see it.
TEST(CudaDecodeCalls, GenerationLoopMatchesTheReferenceAtEveryStep) {
  STRIA_REQUIRE_GPU();
  Case c;
  c.n = 3;
  c.dt = Dt::kF32;
  c.B = 2;
  c.capacity = 16;
  for (int step = 0; step < 5; ++step) {
    c.lens = {static_cast<int64_t>(step * 7), static_cast<int64_t>(40 - step)};
    RunCudaCase(c, static_cast<uint64_t>(500 + step));
  }
}

// A prefill call on a CUDA local group, every tensor in device memory: its inputs, each rank's
// tensors, and its outputs back (Finish).
struct CudaPrefillCall {
  Case c;
  PrefillInputs in;
  std::unique_ptr<DeviceTensor> sinks;
  std::vector<std::unique_ptr<DeviceCache>> caches;
  std::vector<std::unique_ptr<DeviceTensor>> qs, ks, vs, outs, lses;
  std::vector<Tensor> outs_host, lses_host;

  CudaPrefillCall(const Case& cs, uint64_t seed) : c(cs), in(cs, seed) {
    EXPECT_EQ(cudaSetDevice(0), cudaSuccess);
    sinks = std::make_unique<DeviceTensor>(in.sinks_t);
    for (int r = 0; r < c.n; ++r) {
      const size_t i = static_cast<size_t>(r);
      caches.push_back(std::make_unique<DeviceCache>(c, in.caches[i]));
      qs.push_back(std::make_unique<DeviceTensor>(in.qs[i]));
      ks.push_back(std::make_unique<DeviceTensor>(in.ks[i]));
      vs.push_back(std::make_unique<DeviceTensor>(in.vs[i]));
      outs_host.emplace_back(std::vector<int64_t>{c.B, c.T, c.Hq, c.D}, c.dt);
      lses_host.emplace_back(std::vector<int64_t>{c.B, c.Hq, c.T}, Dt::kF32);
      outs.push_back(std::make_unique<DeviceTensor>(outs_host.back()));
      lses.push_back(std::make_unique<DeviceTensor>(lses_host.back()));
      outs.back()->Poison();
      lses.back()->Poison();
    }
  }
  // Every rank's call, rank r's on streams[r] (the default stream where there are none).
  bool Launch(const CudaGroup& g, const std::vector<cudaStream_t>& streams = {}) {
    std::vector<stria_status_t> st(static_cast<size_t>(c.n));
    std::vector<std::string> err(static_cast<size_t>(c.n));
    RunRanks(c.n, [&](int r) {
      cudaSetDevice(0);
      const size_t i = static_cast<size_t>(r);
      stria_attention_params_t p = DecodeParams(c, &sinks->dl);
      stria_kv_cache_t cache;
      caches[i]->Fill(c, c.lens, &cache);
      st[i] = stria_attention_prefill(g.ctx[i], &p, &cache, c.mode, &qs[i]->dl, &ks[i]->dl, &vs[i]->dl, &outs[i]->dl,
                                      &lses[i]->dl, streams.empty() ? nullptr : streams[i]);
      if (st[i] != STRIA_SUCCESS) err[i] = stria_get_last_error();
    });
    for (int r = 0; r < c.n; ++r)
      EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r << ": " << err[static_cast<size_t>(r)];
    return !::testing::Test::HasFailure();
  }
  // After the device is done: each rank's output against the reference.
  std::vector<std::vector<double>> Finish() {
    for (int r = 0; r < c.n; ++r) {
      const size_t i = static_cast<size_t>(r);
      outs[i]->CopyTo(&outs_host[i]);
      lses[i]->CopyTo(&lses_host[i]);
      caches[i]->k->CopyTo(&in.caches[i].k);
      caches[i]->v->CopyTo(&in.caches[i].v);
    }
    return ExpectPrefillResults(c, in, outs_host, lses_host, in.caches);
  }
};

std::vector<std::vector<double>> RunCudaPrefill(const Case& c, uint64_t seed) {
  CudaPrefillCall call(c, seed);
  CudaGroup g(c.n);
  EXPECT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  if (!call.Launch(g)) return {};
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  return call.Finish();
}

// Two prefill calls on one group, the host waiting for neither: the first on streams of the
// device's least priority, which the runtime model runs late under
// STRIA_CUDA_MODEL_LEAST_PRIORITY_DELAY_MS (the model:serving_late case), the second at once on
// other streams. They share each rank's ring buffers, so the second's work must follow the
// first's on the device whatever the streams; both match the reference.
TEST(CudaPrefillCalls, ConsecutiveCallsOnTwoStreams) {
  STRIA_REQUIRE_GPU();
  Case c;
  c.n = 2;
  c.dt = Dt::kF32;
  c.B = 2;
  c.T = 4;
  c.capacity = 32;
  c.lens = {9, 40};
  c.mode = STRIA_PREFILL_PASS_KV;
  CudaGroup g(c.n);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  int least = 0, greatest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&least, &greatest), cudaSuccess);
  std::vector<cudaStream_t> late(2), soon(2);
  for (cudaStream_t& s : late) ASSERT_EQ(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, least), cudaSuccess);
  for (cudaStream_t& s : soon) ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  for (stria_prefill_t mode : {STRIA_PREFILL_PASS_KV, STRIA_PREFILL_PASS_Q}) {
    SCOPED_TRACE(mode == STRIA_PREFILL_PASS_Q ? "pass-Q" : "pass-KV");
    c.mode = mode;
    CudaPrefillCall first(c, 91), second(c, 92);
    ASSERT_TRUE(first.Launch(g, late));
    ASSERT_TRUE(second.Launch(g, soon));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    first.Finish();
    second.Finish();
  }
  for (auto* streams : {&late, &soon})
    for (cudaStream_t s : *streams) cudaStreamDestroy(s);
}

std::vector<Case> CudaPrefillCases() {
  std::vector<Case> cases;
  std::mt19937_64 rng(13);
  for (int n : {1, 2, 3, 5})
    for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG}) {
      Case c;
      c.n = n;
      c.layout = layout;
      c.paged = (n + static_cast<int>(layout)) % 2 == 0;
      c.dt = Dt::kBF16;
      c.B = 2;
      c.T = 4;  // new tokens per rank
      c.capacity = 48;
      c.lens = Lengths(c.B, n * c.capacity - n * c.T, rng);
      cases.push_back(c);
    }
  AppendPrefillScoreCases(&cases);
  // Prefill's attention on the tensor-core decode's wide form: a chunk's rows (tokens times the
  // GQA group) in m16 tiles a warp each, causal among the chunk's tokens; 24 rows (one CTA, part
  // of it), then 88 (a whole CTA of 64 and part of a second).
  for (Dt dt : {Dt::kBF16, Dt::kF16}) {
    Case c;
    c.n = 3;
    c.dt = dt;
    c.B = 2;
    c.T = 6;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = dt == Dt::kBF16 ? 64 : 128;
    c.capacity = 96;
    c.paged = dt == Dt::kBF16;
    c.lens = {150, 31};
    cases.push_back(c);
  }
  {
    Case c;
    c.n = 2;
    c.dt = Dt::kBF16;
    c.B = 2;
    c.T = 22;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = 128;
    c.capacity = 160;
    c.lens = {230, 0};
    cases.push_back(c);
  }
  return cases;
}

class CudaPrefill : public ::testing::TestWithParam<Case> {};

// Pass-KV and pass-Q each against the reference, and against each other.
TEST_P(CudaPrefill, BothModesMatchOneDevice) {
  STRIA_REQUIRE_GPU();
  Case c = GetParam();
  c.mode = STRIA_PREFILL_PASS_KV;
  const auto kv = RunCudaPrefill(c, 78);
  if (HasFailure()) return;
  c.mode = STRIA_PREFILL_PASS_Q;
  const auto q = RunCudaPrefill(c, 78);
  if (HasFailure()) return;
  for (size_t r = 0; r < kv.size(); ++r)
    EXPECT_LT(RelError(q[r], kv[r]), c.dt == Dt::kF32 ? 1e-6 : 1e-2) << "rank " << r << ": pass-Q against pass-KV";
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaPrefill, ::testing::ValuesIn(CudaPrefillCases()),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_" + std::to_string(i.index);
                         });
INSTANTIATE_TEST_SUITE_P(Random, CudaPrefill, ::testing::ValuesIn(RandomCases(true, RandomCaseCount(4))),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return i.param.Name() + "_seed" + std::to_string(i.index);
                         });

// One rank's block table entry outside the pool, read from device memory, fails every rank
// naming it, before any rank communicates; and the group stays usable: a decode call runs after.
TEST(CudaDecodeCalls, RefusedCallsFailEveryRankAndLeaveTheGroupUsable) {
  STRIA_REQUIRE_GPU();
  Case c;
  c.n = 2;
  c.dt = Dt::kBF16;
  c.paged = true;
  c.lens = {5, 40};
  DecodeInputs in(c, 7);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  CudaGroup g(c.n);
  ASSERT_EQ(g.status, STRIA_SUCCESS) << stria_get_last_error();
  DeviceTensor q(in.q), k_new(in.k_new), v_new(in.v_new);
  Tensor out_host({c.B, c.T, c.Hq, c.D}, c.dt);
  std::vector<std::unique_ptr<DeviceCache>> caches;
  std::vector<std::unique_ptr<DeviceTensor>> outs;
  for (int r = 0; r < c.n; ++r) {
    caches.push_back(std::make_unique<DeviceCache>(c, in.caches[static_cast<size_t>(r)]));
    outs.push_back(std::make_unique<DeviceTensor>(out_host));
  }
  // Rank 1's table: sequence 1's first block outside the pool; the table in device memory, then in
  // host memory (read where it is, checked the same).
  const int32_t bad = static_cast<int32_t>(in.caches[1].num_blocks);
  std::vector<int32_t> broken = in.caches[1].table_data;
  broken[static_cast<size_t>(in.caches[1].max_blocks)] = bad;
  for (const bool host_table : {false, true}) {
    SCOPED_TRACE(host_table ? "the bad table in host memory" : "the bad table in device memory");
    std::vector<std::string> errs(static_cast<size_t>(c.n));
    std::vector<stria_status_t> sts(static_cast<size_t>(c.n));
    RunRanks(c.n, [&](int r) {
      cudaSetDevice(0);
      stria_attention_params_t p = DecodeParams(c, nullptr);
      stria_kv_cache_t cache;
      caches[static_cast<size_t>(r)]->Fill(c, c.lens, &cache);
      DLTensor table = caches[static_cast<size_t>(r)]->table_dl;
      int32_t* entries = nullptr;
      if (r == 1 && host_table) {
        table.data = broken.data();
        table.device = DLDevice{kDLCPU, 0};
      } else if (r == 1) {
        cudaMalloc(reinterpret_cast<void**>(&entries), broken.size() * sizeof(int32_t));
        cudaMemcpy(entries, broken.data(), broken.size() * sizeof(int32_t), cudaMemcpyHostToDevice);
        table.data = entries;
      }
      cache.block_table = &table;
      sts[static_cast<size_t>(r)] =
          stria_attention_decode(g.ctx[static_cast<size_t>(r)], &p, &cache, &q.dl, nullptr, nullptr,
                                 &outs[static_cast<size_t>(r)]->dl, nullptr, nullptr);
      errs[static_cast<size_t>(r)] = stria_get_last_error();
      cudaFree(entries);
    });
    for (int r = 0; r < c.n; ++r) {
      EXPECT_EQ(sts[static_cast<size_t>(r)], STRIA_ERROR_INVALID_ARGUMENT) << errs[static_cast<size_t>(r)];
      const std::string expected = r == 1 ? "cache->block_table[1][0]" : "rank 1";
      EXPECT_NE(errs[static_cast<size_t>(r)].find(expected), std::string::npos)
          << "rank " << r << ": " << errs[static_cast<size_t>(r)];
    }
  }
  // The same group, a call that runs.
  std::vector<stria_status_t> ok(static_cast<size_t>(c.n));
  RunRanks(c.n, [&](int r) {
    cudaSetDevice(0);
    stria_attention_params_t p = DecodeParams(c, nullptr);
    stria_kv_cache_t cache;
    caches[static_cast<size_t>(r)]->Fill(c, c.lens, &cache);
    ok[static_cast<size_t>(r)] = stria_attention_decode(g.ctx[static_cast<size_t>(r)], &p, &cache, &q.dl, &k_new.dl,
                                                        &v_new.dl, &outs[static_cast<size_t>(r)]->dl, nullptr, nullptr);
  });
  for (int r = 0; r < c.n; ++r) EXPECT_EQ(ok[static_cast<size_t>(r)], STRIA_SUCCESS) << "rank " << r;
}

}  // namespace
}  // namespace stria_test
