// The NCCL transport on GPUs (labels nccl and gpu; each test skips, saying why, where the GPUs it
// needs are missing):
// - one GPU: the module's own requests at world 1 (a rank sends to itself on both lanes, in either
//   posting order, a block larger than NCCL's buffers), its guard on posting order, the world-1
//   ring through the C API against the float64 reference, a caller's communicator (used, checked,
//   never destroyed), and a communicator set-up that times out when a rank never gets to NCCL;
// - two GPUs or more: a wait that times out and one ended by an abort from another thread (two
//   ranks as threads of this process), a ring of ranks as threads (up to four GPUs), and rings
//   of 2..4 processes (tests/nccl/nccl_rank.cc) against the reference, with the id from
//   stria_get_unique_id or from STRIA_ROOT, and with a rank killed or aborted mid-call.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include "gpu/gpu_util.h"
#include "gpu/ring_order_check.h"
#include "launcher.h"
#include "ring_results.h"
#include "serving_cases.h"
#include "transport/module_abi.h"
#include "transport/rendezvous/rendezvous.h"

using namespace stria_test;
using stria::Status;
using stria::Transport;

namespace {

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

#define REQUIRE_GPUS(n)                                                                             \
  do {                                                                                              \
    STRIA_REQUIRE_GPU();                                                                            \
    if (GpuCount() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, " << GpuCount() << " visible"; \
  } while (0)

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const stria::TransportModule* Module() {
  static void* handle = dlopen(STRIA_NCCL_MODULE, RTLD_NOW | RTLD_LOCAL);
  return handle ? static_cast<const stria::TransportModule*>(dlsym(handle, "stria_nccl_module_v4")) : nullptr;
}

stria_context_config_t NcclConfig(int rank, int world, int device, double timeout_s = 60) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = STRIA_TRANSPORT_NCCL;
  cfg.device = DLDevice{kDLCUDA, device};
  cfg.timeout_s = timeout_s;
  return cfg;
}

// The module's transport itself, as the engine sees it.
std::unique_ptr<Transport> Direct(const stria_context_config_t& cfg, Status* s) {
  Transport* t = nullptr;
  *s = Module()->create(cfg, nullptr, cfg.timeout_s, &t);
  return std::unique_ptr<Transport>(t);
}

// The engine's tags: call, step, kind (1 K/V, 2 dK/dV).
int64_t Tag(uint64_t call, int64_t step, int kind) {
  return static_cast<int64_t>((call << 24) | (static_cast<uint64_t>(step) << 2) | static_cast<uint64_t>(kind));
}

struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes;
  explicit DeviceBuffer(size_t n) : bytes(n) { EXPECT_EQ(cudaMalloc(&ptr, n), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
  void Fill(uint8_t seed) {
    std::vector<uint8_t> h(bytes);
    for (size_t i = 0; i < bytes; ++i) h[i] = static_cast<uint8_t>(i * 131 + seed);
    EXPECT_EQ(cudaMemcpy(ptr, h.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  bool Holds(uint8_t seed) const {
    std::vector<uint8_t> h(bytes);
    EXPECT_EQ(cudaMemcpy(h.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    for (size_t i = 0; i < bytes; ++i)
      if (h[i] != static_cast<uint8_t>(i * 131 + seed)) return false;
    return true;
  }
};

TEST(NcclTransport, WorldOfOneSendsToItselfOnBothLanes) {
  STRIA_REQUIRE_GPU();
  Status s;
  auto t = Direct(NcclConfig(0, 1, 0), &s);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_STREQ(t->name(), "nccl");
  const size_t big = size_t{48} << 20;  // a large block, in many of NCCL's chunks
  DeviceBuffer kv_src(big), kv_dst(big), dkv_src(1 << 20), dkv_dst(1 << 20);
  for (int64_t step = 0; step < 3; ++step) {
    kv_src.Fill(static_cast<uint8_t>(step));
    dkv_src.Fill(static_cast<uint8_t>(100 + step));
    cudaMemset(kv_dst.ptr, 0, big);
    cudaMemset(dkv_dst.ptr, 0, dkv_dst.bytes);
    cudaDeviceSynchronize();
    stria::RequestId kr = 0, ks = 0, dr = 0, ds = 0;
    // K/V as the forward posts it (receive, then send); dK/dV as the backward does (send first).
    ASSERT_TRUE(t->Irecv(0, Tag(1, step, 1), kv_dst.ptr, big, &kr).ok());
    ASSERT_TRUE(t->Isend(0, Tag(1, step, 1), kv_src.ptr, big, &ks).ok());
    ASSERT_TRUE(t->Isend(0, Tag(1, step, 2), dkv_src.ptr, dkv_src.bytes, &ds).ok());
    ASSERT_TRUE(t->Irecv(0, Tag(1, step, 2), dkv_dst.ptr, dkv_dst.bytes, &dr).ok());
    for (stria::RequestId r : {kr, ks, dr, ds}) {
      s = t->Wait(r, 60, "test");
      ASSERT_TRUE(s.ok()) << s.message();
    }
    EXPECT_TRUE(kv_dst.Holds(static_cast<uint8_t>(step))) << "step " << step;
    EXPECT_TRUE(dkv_dst.Holds(static_cast<uint8_t>(100 + step))) << "step " << step;
  }
  const char mine[5] = "abcd";
  char all[5] = {};
  ASSERT_TRUE(t->AllGather(mine, all, 4, 10, "test").ok());
  EXPECT_STREQ(all, "abcd");
  // Waiting on an unknown request is an internal error, not a crash.
  EXPECT_EQ(t->Wait(12345, 1, "test").code(), STRIA_ERROR_INTERNAL);
}

TEST(NcclTransport, PostingOrderIsGuarded) {
  STRIA_REQUIRE_GPU();
  Status s;
  auto t = Direct(NcclConfig(0, 1, 0), &s);
  ASSERT_TRUE(s.ok()) << s.message();
  DeviceBuffer a(4096), b(4096);
  stria::RequestId r1 = 0, r2 = 0;
  ASSERT_TRUE(t->Irecv(0, Tag(2, 1, 1), b.ptr, 4096, &r1).ok());
  ASSERT_TRUE(t->Isend(0, Tag(2, 1, 1), a.ptr, 4096, &r2).ok());
  ASSERT_TRUE(t->Wait(r1, 30, "test").ok());
  ASSERT_TRUE(t->Wait(r2, 30, "test").ok());
  // A receive with an older tag than the last one on this lane: NCCL would pair it with the
  // wrong message on the other side.
  s = t->Irecv(0, Tag(2, 0, 1), b.ptr, 4096, &r1);
  EXPECT_EQ(s.code(), STRIA_ERROR_INTERNAL);
  EXPECT_NE(s.message().find("posting order"), std::string::npos) << s.message();
  // The transport is poisoned with that first error.
  Status again = t->Isend(0, Tag(3, 0, 2), a.ptr, 4096, &r2);
  EXPECT_EQ(again.code(), STRIA_ERROR_INTERNAL);
  EXPECT_EQ(again.message(), s.message());
  const auto t0 = std::chrono::steady_clock::now();
  t->CancelAll();
  t.reset();
  EXPECT_LT(SecondsSince(t0), 15);
}

// Rank 1 joins the rendezvous but never calls NCCL: rank 0's nonblocking set-up gives up at its
// timeout with a message instead of hanging in ncclCommInitRankConfig.
TEST(NcclTransport, SetupTimesOutWhenARankNeverGetsToNccl) {
  STRIA_REQUIRE_GPU();
  unsetenv("STRIA_ROOT");
  stria_unique_id_t raw;
  ASSERT_TRUE(Module()->get_unique_id(&raw).ok());
  stria::RendezvousId id;
  ASSERT_TRUE(stria::DecodeId(raw, &id).ok());
  std::thread impostor([&] {
    int version = 0;
    ncclGetVersion(&version);
    stria::Bytes blob{'S', 'N', 'C', 'L'};
    for (int shift = 24; shift >= 0; shift -= 8) blob.push_back(static_cast<uint8_t>(version >> shift));
    std::vector<stria::Bytes> table;
    EXPECT_TRUE(stria::JoinRendezvous(id, 1, 2, blob, 20, nullptr, &table).ok());
  });
  stria_context_config_t cfg = NcclConfig(0, 2, 0, 3);
  cfg.unique_id = raw;
  Status s;
  const auto t0 = std::chrono::steady_clock::now();
  auto t = Direct(cfg, &s);
  impostor.join();
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_NE(s.message().find("ncclCommInitRankConfig"), std::string::npos) << s.message();
  EXPECT_LT(SecondsSince(t0), 20);
  EXPECT_EQ(t, nullptr);
}

// The world-1 ring through the C API: NCCL context, CUDA backend, against float64.
// Under ThreadSanitizer (where the runtime model runs the kernels some ten times slower) the
// reference suites below take one configuration: what TSan judges, the threads of the transport,
// the engine and the ranks, is the same for every layout, dtype and mask, and the other builds
// check the numbers of every configuration.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif

TEST(NcclContext, WorldOfOneMatchesReference) {
  STRIA_REQUIRE_GPU();
  cudaSetDevice(0);
  stria_context_config_t cfg = NcclConfig(0, 1, 0);
  stria_context_t ctx = nullptr;
  ASSERT_EQ(stria_context_create(&cfg, &ctx), STRIA_SUCCESS) << stria_get_last_error();
  for (Dt dt : {Dt::kBF16, Dt::kF32})
    for (bool causal : {true, false}) {
      if (kThreadSanitizer && !(dt == Dt::kBF16 && causal)) continue;
      SCOPED_TRACE(std::string(DtName(dt)) + (causal ? " causal" : " full"));
      const int64_t B = 1, L = 96, Hq = 4, Hkv = 2, D = 64;
      AttentionTensors h(B, L, Hq, Hkv, D, dt, causal ? 5 : 6);
      DeviceTensor q(h.q), k(h.k), v(h.v), out(h.out), lse(h.lse), dout(h.dout), dq(h.dq), dk(h.dk), dv(h.dv);
      for (DeviceTensor* x : {&out, &lse, &dq, &dk, &dv}) x->Poison();
      stria_attention_params_t p;
      stria_attention_params_init(&p);
      p.causal = causal;
      ASSERT_EQ(stria_attention_forward(ctx, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr), STRIA_SUCCESS)
          << stria_get_last_error();
      ASSERT_EQ(stria_attention_backward(ctx, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, &dout.dl, &dq.dl, &dk.dl,
                                         &dv.dl, nullptr),
                STRIA_SUCCESS)
          << stria_get_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out.CopyTo(&h.out);
      lse.CopyTo(&h.lse);
      dq.CopyTo(&h.dq);
      dk.CopyTo(&h.dk);
      dv.CopyTo(&h.dv);
      const auto dd = h.dout.ToDouble();
      const Reference ref = DenseAttention(h.q.ToDouble(), h.k.ToDouble(), h.v.ToDouble(), &dd, B, L, Hq, Hkv, D,
                                           causal, 1.0 / std::sqrt(static_cast<double>(D)));
      const double tol = dt == Dt::kF32 ? 1e-5 : 2e-2;
      EXPECT_LT(RelError(h.out.ToDouble(), ref.out), tol) << "out";
      EXPECT_LT(RelError(h.lse.ToDouble(), ref.lse), dt == Dt::kF32 ? 1e-5 : 1e-3) << "lse";
      EXPECT_LT(RelError(h.dq.ToDouble(), ref.dq), tol) << "dq";
      EXPECT_LT(RelError(h.dk.ToDouble(), ref.dk), tol) << "dk";
      EXPECT_LT(RelError(h.dv.ToDouble(), ref.dv), tol) << "dv";
    }
  EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);
}

// How often the host has waited for the calling thread's default stream so far, on the CUDA
// runtime model (0 on a GPU).
uint64_t HostWaits() {
  return stria_cuda_runtime_model_host_waits != nullptr ? stria_cuda_runtime_model_host_waits(nullptr) : 0;
}

// One NCCL context per GPU, rank r on GPU r, each made by a thread of its own (as a process that
// drives all of its GPUs would), joined by stria_get_unique_id.
void ThreadContexts(int world, std::vector<stria_context_t>* ctx) {
  stria_unique_id_t id;
  ASSERT_EQ(stria_get_unique_id(&id), STRIA_SUCCESS) << stria_get_last_error();
  ctx->assign(static_cast<size_t>(world), nullptr);
  std::vector<std::string> made(static_cast<size_t>(world));
  RunRanks(world, [&](int r) {
    cudaSetDevice(r);
    stria_context_config_t cfg = NcclConfig(r, world, r);
    cfg.unique_id = id;
    if (stria_context_create(&cfg, &(*ctx)[static_cast<size_t>(r)]) != STRIA_SUCCESS)
      made[static_cast<size_t>(r)] = stria_get_last_error();
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(made[static_cast<size_t>(r)], "") << "rank " << r;
}

// One rank of a ring test over NCCL threads: its forward and backward (bf16, on the default
// stream) on the shards of q, k, v and dO that `shard` cuts (L slots each), gathered into `full`;
// what failed goes to *err.
void RankForwardBackward(stria_context_t c, const stria_attention_params_t& p, const Window& window, int64_t L,
                         const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                         const std::function<Tensor(const Tensor&)>& shard, int r, GatheredResults* full,
                         std::string* err) {
  const int64_t B = q.shape[0], Hq = q.shape[2], Hkv = k.shape[2], D = q.shape[3];
  Tensor ql = shard(q), kl = shard(k), vl = shard(v), dol = shard(dout);
  Tensor out({B, L, Hq, D}, Dt::kBF16), lse({B, Hq, L}, Dt::kF32);
  Tensor dq({B, L, Hq, D}, Dt::kBF16), dk({B, L, Hkv, D}, Dt::kBF16), dv({B, L, Hkv, D}, Dt::kBF16);
  DeviceTensor q_d(ql), k_d(kl), v_d(vl), do_d(dol), out_d(out), lse_d(lse), dq_d(dq), dk_d(dk), dv_d(dv);
  for (DeviceTensor* t : {&out_d, &lse_d, &dq_d, &dk_d, &dv_d}) t->Poison();
  const std::vector<int64_t> no_documents;
  if (AttentionForward(c, &p, no_documents, 0, &q_d.dl, &k_d.dl, &v_d.dl, &out_d.dl, &lse_d.dl, nullptr, window) !=
      STRIA_SUCCESS)
    *err += std::string("forward: ") + stria_get_last_error();
  if (AttentionBackward(c, &p, no_documents, 0, &q_d.dl, &k_d.dl, &v_d.dl, &out_d.dl, &lse_d.dl, &do_d.dl, &dq_d.dl,
                        &dk_d.dl, &dv_d.dl, nullptr, window) != STRIA_SUCCESS)
    *err += std::string(" backward: ") + stria_get_last_error();
  if (cudaDeviceSynchronize() != cudaSuccess) *err += " cudaDeviceSynchronize failed";
  out_d.CopyTo(&out);
  lse_d.CopyTo(&lse);
  dq_d.CopyTo(&dq);
  dk_d.CopyTo(&dk);
  dv_d.CopyTo(&dv);
  full->Gather(r, out, lse, dq, dk, dv);
}

// A rank's shard of a full tensor, cut by the layout, plan or grid a test uses (stria_shard and
// its kin): cut(r, full, local) into `local` of L slots.
using Cut = std::function<stria_status_t(int r, const DLTensor* full, DLTensor* local)>;

// Every rank of `ctx` (a thread each, on GPU r) runs its forward and backward on the shards
// `cut` makes (RankForwardBackward); the gathered results must match `ref`.
void RingOfThreadsMatches(const std::vector<stria_context_t>& ctx, const stria_attention_params_t& p,
                          const Window& window, int64_t L, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& dout, const Cut& cut, GatheredResults* full, const Reference& ref) {
  const int world = static_cast<int>(ctx.size());
  std::vector<std::string> errors(static_cast<size_t>(world));
  RunRanks(world, [&](int r) {
    cudaSetDevice(r);
    auto shard = [&](const Tensor& t) {
      Tensor local({t.shape[0], L, t.shape[2], t.shape[3]}, t.dt);
      EXPECT_EQ(cut(r, &t.dl, &local.dl), STRIA_SUCCESS) << stria_get_last_error();
      return local;
    };
    RankForwardBackward(ctx[static_cast<size_t>(r)], p, window, L, q, k, v, dout, shard, r, full,
                        &errors[static_cast<size_t>(r)]);
  });
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  full->ExpectMatches(ref, 2e-2, 1e-3);
}

// Ranks as threads of one process, a GPU each (a process that drives all of its GPUs), joined by
// stria_get_unique_id: the ring through the C API, every layout, causal and not, against float64.
TEST(NcclContext, RingOfThreadsMatchesReference) {
  REQUIRE_GPUS(2);
  const int world = std::min(GpuCount(), 4);
  std::vector<stria_context_t> ctx;
  ASSERT_NO_FATAL_FAILURE(ThreadContexts(world, &ctx));

  const int64_t B = 1, L = 96, Hq = 4, Hkv = 2, D = 64, S = L * world;
  // Windows that shorten the contiguous ring: 2 steps (each partial home to the previous rank),
  // and 3 (on 4 GPUs: two ranks back).
  for (stria_layout_t layout : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
    for (bool causal : {true, false})
      for (const Window window : {Window{}, Window{L / 2, -1}, Window{L + L / 2, -1}}) {
        if (window.active() && !(layout == STRIA_LAYOUT_CONTIGUOUS && causal)) continue;
        if (kThreadSanitizer && !(layout == STRIA_LAYOUT_STRIPED && causal)) continue;
        SCOPED_TRACE(std::string(LayoutName(layout)) + (causal ? " causal" : " full") + " window " +
                     WindowName(window));
        std::mt19937_64 rng(11 + static_cast<int>(layout) * 2 + (causal ? 1 : 0));
        Tensor q({B, S, Hq, D}, Dt::kBF16), k({B, S, Hkv, D}, Dt::kBF16), v({B, S, Hkv, D}, Dt::kBF16);
        Tensor dout({B, S, Hq, D}, Dt::kBF16);
        for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
        const auto dd = dout.ToDouble();
        const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dd, B, S, Hq, Hkv, D, causal,
                                             1.0 / std::sqrt(static_cast<double>(D)), nullptr, window);
        GatheredResults full(layout, world, B, S, Hq, Hkv, D, Dt::kBF16);
        stria_attention_params_t p;
        stria_attention_params_init(&p);
        p.layout = layout;
        p.causal = causal;
        RingOfThreadsMatches(
            ctx, p, window, L, q, k, v, dout,
            [&](int r, const DLTensor* t, DLTensor* local) {
              return stria_shard(layout, world, r, 1, t, local, nullptr);
            },
            &full, ref);
      }
  RunRanks(world, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
}

// The ring on NCCL keeps its compute and its transfers apart on the device (gpu/ring_order_check.h).
TEST(NcclContext, RingOrdersItsStepsOnTheDevice) {
  REQUIRE_GPUS(3);
  if (stria_cuda_runtime_model_host_waits == nullptr)
    GTEST_SKIP() << "the host's waits are counted by the CUDA runtime model only";
  std::vector<stria_context_t> ctx;
  ASSERT_NO_FATAL_FAILURE(ThreadContexts(3, &ctx));
  ExpectRingOrderedOnTheDevice(ctx, [](int r) { return r; });
  RunRanks(3, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
}

// A grid's all-to-all exchanges keep the same order: the host queues the exchanges, their
// unpacking and the compute without waiting for the stream. On four GPUs a ring of two groups of
// two, whose rings wait on the host for their inputs first; on three, one group of three.
TEST(NcclContext, GridOrdersItsExchangesOnTheDevice) {
  REQUIRE_GPUS(3);
  if (stria_cuda_runtime_model_host_waits == nullptr)
    GTEST_SKIP() << "the host's waits are counted by the CUDA runtime model only";
  const int world = GpuCount() >= 4 ? 4 : 3, ulysses = world == 4 ? 2 : 3;
  const auto device_of = [](int r) { return r; };
  std::vector<stria_context_t> ctx;
  ASSERT_NO_FATAL_FAILURE(ThreadContexts(world, &ctx));
  ExpectRingOrderedOnTheDevice(ctx, device_of, ulysses);
  RunRanks(world, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
}

// A rank aborted while the ring runs, its steps ordered on the device: it fails ABORTED, its
// peers fail with an error within their timeout instead of waiting on the device for a transfer
// that never comes, and every context is destroyed. On a grid (`ulysses` 3: one all-to-all group)
// the same holds for its exchanges.
void AbortMidCallEndsEveryRank(int ulysses) {
  const int world = 3;
  const double timeout = 5;
  stria_unique_id_t id;
  ASSERT_EQ(stria_get_unique_id(&id), STRIA_SUCCESS) << stria_get_last_error();
  std::vector<stria_context_t> ctx(static_cast<size_t>(world), nullptr);
  RunRanks(world, [&](int r) {
    cudaSetDevice(r);
    stria_context_config_t cfg = NcclConfig(r, world, r, timeout);
    cfg.unique_id = id;
    EXPECT_EQ(stria_context_create(&cfg, &ctx[static_cast<size_t>(r)]), STRIA_SUCCESS) << stria_get_last_error();
    if (ctx[static_cast<size_t>(r)] != nullptr) {
      EXPECT_EQ(stria_context_set_grid(ctx[static_cast<size_t>(r)], ulysses), STRIA_SUCCESS);
    }
  });
  for (stria_context_t c : ctx) ASSERT_NE(c, nullptr);
  const int64_t B = 1, L = OnRuntimeModel() ? 256 : 8192, Hkv = 2 * ulysses, Hq = 2 * Hkv, D = 64;
  std::vector<stria_status_t> code(static_cast<size_t>(world), STRIA_SUCCESS);
  std::vector<double> seconds(static_cast<size_t>(world), 0);
  RunRanks(world, [&](int r) {
    cudaSetDevice(r);
    std::mt19937_64 rng(40 + r);
    Tensor q({B, L, Hq, D}, Dt::kBF16), k({B, L, Hkv, D}, Dt::kBF16), v({B, L, Hkv, D}, Dt::kBF16);
    Tensor out({B, L, Hq, D}, Dt::kBF16), lse({B, Hq, L}, Dt::kF32);
    for (Tensor* t : {&q, &k, &v}) t->FillRandom(rng);
    DeviceTensor q_d(q), k_d(k), v_d(v), out_d(out), lse_d(lse);
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    p.causal = true;
    const stria_context_t c = ctx[static_cast<size_t>(r)];
    std::thread fault;
    if (r == 1)
      fault = std::thread([c] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        stria_context_abort(c);
      });
    const auto t0 = std::chrono::steady_clock::now();
    stria_status_t st = STRIA_SUCCESS;
    for (int call = 0; call < 50 && st == STRIA_SUCCESS; ++call)
      st = stria_attention_forward(c, &p, &q_d.dl, &k_d.dl, &v_d.dl, &out_d.dl, &lse_d.dl, nullptr);
    code[static_cast<size_t>(r)] = st;
    seconds[static_cast<size_t>(r)] = SecondsSince(t0);
    if (fault.joinable()) fault.join();
  });
  for (int r = 0; r < world; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    if (r == 1)
      EXPECT_EQ(code[1], STRIA_ERROR_ABORTED);
    else
      EXPECT_TRUE(code[static_cast<size_t>(r)] == STRIA_ERROR_TIMEOUT ||
                  code[static_cast<size_t>(r)] == STRIA_ERROR_TRANSPORT)
          << code[static_cast<size_t>(r)];
  }
  const auto t0 = std::chrono::steady_clock::now();
  RunRanks(world, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
  EXPECT_LT(SecondsSince(t0), 3 * timeout + 30);
}

TEST(NcclContext, AbortMidRingEndsEveryRank) {
  REQUIRE_GPUS(3);
  AbortMidCallEndsEveryRank(1);
}

TEST(NcclContext, AbortMidGridEndsEveryRank) {
  REQUIRE_GPUS(3);
  AbortMidCallEndsEveryRank(3);
}

// Packed documents on a plan whose ranks keep documents of their own past whole tiles: their part
// of the local block runs on a stream of its own beside the ring's, whose K/V blocks and dK/dV
// partials NCCL moves (the kept documents' K/V stay in a buffer the ring never receives into).
TEST(NcclContext, PlanOfThreadsKeepsDocumentsApart) {
  REQUIRE_GPUS(2);
  const int world = std::min(GpuCount(), 3);
  std::vector<stria_context_t> ctx;
  ASSERT_NO_FATAL_FAILURE(ThreadContexts(world, &ctx));
  const int64_t B = 1, Hq = 4, Hkv = 2, D = 64, S = 640 * world - 1;
  std::mt19937_64 rng(23);
  const std::vector<int64_t> documents = HomeDocuments(B, S, 8, rng);
  stria_plan_config_t pc;
  stria_plan_config_init(&pc);
  pc.world_size = world;
  pc.tile = 128;
  stria_plan_t plan = nullptr;
  ASSERT_EQ(stria_plan_create(&pc, documents.data(), 8, B, S, &plan), STRIA_SUCCESS) << stria_get_last_error();
  stria_plan_info_t info;
  info.struct_size = sizeof info;
  ASSERT_EQ(stria_plan_get_info(plan, &info), STRIA_SUCCESS);
  const int64_t L = info.local_len;
  Tensor q({B, S, Hq, D}, Dt::kBF16), k({B, S, Hkv, D}, Dt::kBF16), v({B, S, Hkv, D}, Dt::kBF16);
  Tensor dout({B, S, Hq, D}, Dt::kBF16);
  for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
  const auto dd = dout.ToDouble();
  const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dd, B, S, Hq, Hkv, D, true,
                                       1.0 / std::sqrt(static_cast<double>(D)), &documents);
  GatheredResults full(STRIA_LAYOUT_STRIPED, world, B, S, Hq, Hkv, D, Dt::kBF16);
  full.UsePlan(plan);
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.plan = plan;
  RingOfThreadsMatches(
      ctx, p, Window{}, L, q, k, v, dout,
      [&](int r, const DLTensor* t, DLTensor* local) { return stria_plan_shard(plan, r, 1, t, local, nullptr); }, &full,
      ref);
  RunRanks(world, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
  stria_plan_destroy(plan);
}

// Decode and prefill over a KV cache sharded across NCCL ranks (threads of this process, one GPU
// each, up to four): decode's partial records gathered by ncclAllGather and merged, prefill's rings
// in both modes, all in the device's order (the host waits for none of a call's work on its
// stream, counted on the runtime model); the new tokens stored by their ranks; striped and zigzag
// caches, GQA, a sequence whose cache is empty.
TEST(NcclContext, ServingOfThreadsMatchesReference) {
  REQUIRE_GPUS(2);
  const int world = std::min(GpuCount(), 4);
  std::vector<stria_context_t> ctx;
  ASSERT_NO_FATAL_FAILURE(ThreadContexts(world, &ctx));
  for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
    Case c;
    c.n = world;
    c.layout = layout;
    c.dt = Dt::kBF16;
    c.B = 2;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = 64;
    c.capacity = 96;  // 192 positions or more
    c.lens = {0, 150};
    SCOPED_TRACE(c.Name());
    DecodeInputs in(c, 31);
    std::vector<Tensor> outs, lses;
    for (int r = 0; r < world; ++r) {
      outs.emplace_back(std::vector<int64_t>{c.B, c.T, c.Hq, c.D}, c.dt);
      lses.emplace_back(std::vector<int64_t>{c.B, c.Hq, c.T}, Dt::kF32);
    }
    std::vector<std::string> errors(static_cast<size_t>(world));
    RunRanks(world, [&](int r) {
      cudaSetDevice(r);
      RankCache& rc = in.caches[static_cast<size_t>(r)];
      DeviceTensor q_d(in.q), k_new_d(in.k_new), v_new_d(in.v_new), k_d(rc.k), v_d(rc.v);
      DeviceTensor out_d(outs[static_cast<size_t>(r)]), lse_d(lses[static_cast<size_t>(r)]);
      out_d.Poison();
      lse_d.Poison();
      stria_attention_params_t p = DecodeParams(c, nullptr);
      stria_kv_cache_t cache;
      stria_kv_cache_init(&cache);
      cache.k = &k_d.dl;
      cache.v = &v_d.dl;
      cache.lens = c.lens.data();
      const uint64_t before = HostWaits();
      if (stria_attention_decode(ctx[static_cast<size_t>(r)], &p, &cache, &q_d.dl, &k_new_d.dl, &v_new_d.dl, &out_d.dl,
                                 &lse_d.dl, nullptr) != STRIA_SUCCESS)
        errors[static_cast<size_t>(r)] = stria_get_last_error();
      // Gathered and merged in the device's order: the host waits for none of the call's work on
      // its stream (counted on the runtime model; the host's order waits once).
      EXPECT_EQ(HostWaits() - before, 0u) << "rank " << r;
      if (cudaDeviceSynchronize() != cudaSuccess) errors[static_cast<size_t>(r)] += " cudaDeviceSynchronize failed";
      out_d.CopyTo(&outs[static_cast<size_t>(r)]);
      lse_d.CopyTo(&lses[static_cast<size_t>(r)]);
      k_d.CopyTo(&rc.k);
      v_d.CopyTo(&rc.v);
    });
    for (int r = 0; r < world; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    ExpectDecodeResults(c, in, outs, lses, in.caches);
  }
  // Prefill over NCCL: pass-KV's ring of K/V messages, and pass-Q's ring of queries with every
  // partial result sent home and the new tokens' rows sent to their owners at the end.
  for (stria_prefill_t mode : {STRIA_PREFILL_PASS_KV, STRIA_PREFILL_PASS_Q}) {
    Case c;
    c.n = world;
    c.layout = STRIA_LAYOUT_ZIGZAG;
    c.dt = Dt::kBF16;
    c.B = 2;
    c.T = 4;
    c.Hq = 8;
    c.Hkv = 2;
    c.D = 64;
    c.capacity = 48;
    c.lens = {0, 70};
    c.mode = mode;
    SCOPED_TRACE(c.Name() + (mode == STRIA_PREFILL_PASS_Q ? " pass-Q" : " pass-KV"));
    PrefillInputs in(c, 41);
    std::vector<Tensor> outs, lses;
    for (int r = 0; r < world; ++r) {
      outs.emplace_back(std::vector<int64_t>{c.B, c.T, c.Hq, c.D}, c.dt);
      lses.emplace_back(std::vector<int64_t>{c.B, c.Hq, c.T}, Dt::kF32);
    }
    std::vector<std::string> errors(static_cast<size_t>(world));
    RunRanks(world, [&](int r) {
      cudaSetDevice(r);
      const size_t i = static_cast<size_t>(r);
      RankCache& rc = in.caches[i];
      DeviceTensor q_d(in.qs[i]), k_d(in.ks[i]), v_d(in.vs[i]), ck(rc.k), cv(rc.v);
      DeviceTensor out_d(outs[i]), lse_d(lses[i]);
      out_d.Poison();
      lse_d.Poison();
      stria_attention_params_t p = DecodeParams(c, nullptr);
      stria_kv_cache_t cache;
      stria_kv_cache_init(&cache);
      cache.k = &ck.dl;
      cache.v = &cv.dl;
      cache.lens = c.lens.data();
      const uint64_t before = HostWaits();
      if (stria_attention_prefill(ctx[i], &p, &cache, c.mode, &q_d.dl, &k_d.dl, &v_d.dl, &out_d.dl, &lse_d.dl,
                                  nullptr) != STRIA_SUCCESS)
        errors[i] = stria_get_last_error();
      // Both rings in the device's order (the host's waits twice in pass-KV, five times in pass-Q).
      EXPECT_EQ(HostWaits() - before, 0u) << "rank " << r;
      if (cudaDeviceSynchronize() != cudaSuccess) errors[i] += " cudaDeviceSynchronize failed";
      out_d.CopyTo(&outs[i]);
      lse_d.CopyTo(&lses[i]);
      ck.CopyTo(&rc.k);
      cv.CopyTo(&rc.v);
    });
    for (int r = 0; r < world; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
    ExpectPrefillResults(c, in, outs, lses, in.caches);
  }
  RunRanks(world, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
}

// A grid over NCCL: the all-to-all within a group (in rounds of one receive and one send, which
// the lanes launch together) and the ring across groups: 2 x 2 on 4 GPUs, else one group of all
// (3 GPUs: two rounds); K/V heads split over the group, and one K/V head shared by all.
TEST(NcclContext, GridOfThreadsMatchesReference) {
  REQUIRE_GPUS(2);
  const int world = std::min(GpuCount(), 4), ulysses = world == 4 ? 2 : world;
  stria_unique_id_t id;
  ASSERT_EQ(stria_get_unique_id(&id), STRIA_SUCCESS) << stria_get_last_error();
  std::vector<stria_context_t> ctx(static_cast<size_t>(world), nullptr);
  std::vector<std::string> made(static_cast<size_t>(world));
  RunRanks(world, [&](int r) {
    cudaSetDevice(r);
    stria_context_config_t cfg = NcclConfig(r, world, r);
    cfg.unique_id = id;
    stria_context_t& c = ctx[static_cast<size_t>(r)];
    if (stria_context_create(&cfg, &c) != STRIA_SUCCESS || stria_context_set_grid(c, ulysses) != STRIA_SUCCESS)
      made[static_cast<size_t>(r)] = stria_get_last_error();
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(made[static_cast<size_t>(r)], "") << "rank " << r;
  const int64_t B = 1, L = 48, Hq = 12, D = 64, S = L * world;
  for (stria_layout_t layout : {STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG}) {
    const bool causal = layout == STRIA_LAYOUT_STRIPED;
    const int64_t Hkv = causal ? 6 : 1;
    if (kThreadSanitizer && !causal) continue;
    SCOPED_TRACE(std::string(LayoutName(layout)) + (causal ? " causal" : " full") + " Hkv " + std::to_string(Hkv));
    std::mt19937_64 rng(21 + static_cast<int>(layout));
    Tensor q({B, S, Hq, D}, Dt::kBF16), k({B, S, Hkv, D}, Dt::kBF16), v({B, S, Hkv, D}, Dt::kBF16);
    Tensor dout({B, S, Hq, D}, Dt::kBF16);
    for (Tensor* t : {&q, &k, &v, &dout}) t->FillRandom(rng);
    const auto dd = dout.ToDouble();
    const Reference ref = DenseAttention(q.ToDouble(), k.ToDouble(), v.ToDouble(), &dd, B, S, Hq, Hkv, D, causal,
                                         1.0 / std::sqrt(static_cast<double>(D)));
    GatheredResults full(layout, world, B, S, Hq, Hkv, D, Dt::kBF16);
    full.UseGrid(ulysses);
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    p.layout = layout;
    p.causal = causal;
    RingOfThreadsMatches(
        ctx, p, Window{}, L, q, k, v, dout,
        [&](int r, const DLTensor* t, DLTensor* local) {
          return stria_grid_shard(layout, world, ulysses, r, 1, t, local, nullptr);
        },
        &full, ref);
  }
  RunRanks(world, [&](int r) { EXPECT_EQ(stria_context_destroy(ctx[static_cast<size_t>(r)]), STRIA_SUCCESS); });
}

// A caller's communicator, blocking or not: stria works off it, checks it against the config,
// and leaves it to its owner, usable.
TEST(NcclContext, CallersCommunicator) {
  STRIA_REQUIRE_GPU();
  for (int blocking : {1, 0}) {
    SCOPED_TRACE(blocking ? "blocking communicator" : "nonblocking communicator");
    cudaSetDevice(0);
    ncclUniqueId uid;
    ASSERT_EQ(ncclGetUniqueId(&uid), ncclSuccess);
    ncclConfig_t nc = NCCL_CONFIG_INITIALIZER;
    nc.blocking = blocking;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, 1, uid, 0, &nc);
    ncclResult_t state = r;
    while (state == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    ASSERT_EQ(state, ncclSuccess) << ncclGetErrorString(state);

    stria_context_config_t cfg = NcclConfig(0, 1, 0);
    stria_context_t ctx = nullptr;
    ASSERT_EQ(stria_context_create_with_nccl_comm(&cfg, comm, &ctx), STRIA_SUCCESS) << stria_get_last_error();
    AttentionTensors h(1, 64, 2, 2, 64, Dt::kBF16, 11);
    DeviceTensor q(h.q), k(h.k), v(h.v), out(h.out), lse(h.lse);
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    EXPECT_EQ(stria_attention_forward(ctx, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
    EXPECT_EQ(stria_context_destroy(ctx), STRIA_SUCCESS);

    // A config that does not describe the communicator.
    cfg = NcclConfig(0, 2, 0);
    ctx = reinterpret_cast<stria_context_t>(0x99);
    EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, comm, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stria_get_last_error()).find("has 1 ranks"), std::string::npos) << stria_get_last_error();
    EXPECT_EQ(ctx, nullptr);
    cfg = NcclConfig(1, 2, 0);
    EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, comm, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
    if (GpuCount() > 1) {
      cfg = NcclConfig(0, 1, 1);
      EXPECT_EQ(stria_context_create_with_nccl_comm(&cfg, comm, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(stria_get_last_error()).find("device"), std::string::npos) << stria_get_last_error();
    }

    // Still the caller's, and still working: an all-reduce on it.
    int count = 0;
    ASSERT_EQ(ncclCommCount(comm, &count), ncclSuccess);
    EXPECT_EQ(count, 1);
    float* x = nullptr;
    ASSERT_EQ(cudaMalloc(&x, 4 * sizeof(float)), cudaSuccess);
    r = ncclAllReduce(x, x, 4, ncclFloat, ncclSum, comm, nullptr);
    state = r;
    while (state == ncclInProgress) ASSERT_EQ(ncclCommGetAsyncError(comm, &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess) << ncclGetErrorString(state);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaFree(x);
    EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  }
}

// Two ranks as threads of this process, one GPU each.
struct Pair {
  std::unique_ptr<Transport> t[2];
  Status s[2];
  explicit Pair(double timeout_s) {
    unsetenv("STRIA_ROOT");
    stria_unique_id_t id;
    EXPECT_TRUE(Module()->get_unique_id(&id).ok());
    std::thread ranks[2];
    for (int r = 0; r < 2; ++r)
      ranks[r] = std::thread([&, r] {
        cudaSetDevice(r);
        stria_context_config_t cfg = NcclConfig(r, 2, r, timeout_s);
        cfg.unique_id = id;
        t[r] = Direct(cfg, &s[r]);
      });
    for (auto& th : ranks) th.join();
  }
};

TEST(NcclTransportPair, WaitTimesOutAndTheTransportIsPoisoned) {
  REQUIRE_GPUS(2);
  Pair p(30);
  ASSERT_TRUE(p.s[0].ok()) << p.s[0].message();
  ASSERT_TRUE(p.s[1].ok()) << p.s[1].message();
  cudaSetDevice(0);
  DeviceBuffer a(1 << 20), b(1 << 20);
  stria::RequestId rr = 0, rs = 0;
  ASSERT_TRUE(p.t[0]->Irecv(1, Tag(1, 0, 1), b.ptr, b.bytes, &rr).ok());
  ASSERT_TRUE(p.t[0]->Isend(1, Tag(1, 0, 1), a.ptr, a.bytes, &rs).ok());
  // Rank 1 posts nothing.
  const auto t0 = std::chrono::steady_clock::now();
  Status s = p.t[0]->Wait(rr, 1.5, "K/V block of ring step 0");
  EXPECT_EQ(s.code(), STRIA_ERROR_TIMEOUT) << s.message();
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  EXPECT_LT(SecondsSince(t0), 10);
  EXPECT_EQ(p.t[0]->Wait(rs, 1, "again").code(), STRIA_ERROR_TIMEOUT);
  char all[16];
  EXPECT_EQ(p.t[0]->AllGather("x", all, 1, 1, "test").code(), STRIA_ERROR_TIMEOUT);
  const auto t1 = std::chrono::steady_clock::now();
  p.t[0]->CancelAll();
  p.t[0].reset();
  p.t[1].reset();
  EXPECT_LT(SecondsSince(t1), 20) << "destroying after a timeout must not block";
}

TEST(NcclTransportPair, AbortFromAnotherThreadEndsAWait) {
  REQUIRE_GPUS(2);
  Pair p(60);
  ASSERT_TRUE(p.s[0].ok()) << p.s[0].message();
  ASSERT_TRUE(p.s[1].ok()) << p.s[1].message();
  cudaSetDevice(0);
  DeviceBuffer a(1 << 20), b(1 << 20);
  stria::RequestId rr = 0, rs = 0;
  ASSERT_TRUE(p.t[0]->Irecv(1, Tag(1, 0, 1), b.ptr, b.bytes, &rr).ok());
  ASSERT_TRUE(p.t[0]->Isend(1, Tag(1, 0, 1), a.ptr, a.bytes, &rs).ok());
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cudaSetDevice(1);  // another thread, another current device: the abort must not care
    p.t[0]->Abort();
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = p.t[0]->Wait(rr, 60, "K/V block of ring step 0");
  aborter.join();
  EXPECT_EQ(s.code(), STRIA_ERROR_ABORTED) << s.message();
  EXPECT_LT(SecondsSince(t0), 10);
  EXPECT_EQ(p.t[0]->Isend(1, Tag(2, 0, 1), a.ptr, a.bytes, &rs).code(), STRIA_ERROR_ABORTED);
  p.t[0]->CancelAll();
  // The peer's end does not block on the aborted rank either.
  const auto t1 = std::chrono::steady_clock::now();
  p.t[0].reset();
  p.t[1].reset();
  EXPECT_LT(SecondsSince(t1), 20);
}

// Rings of processes, one GPU each.

struct RingCase {
  int world;
  std::string layout;
  bool causal;
  bool id_file;              // the id from stria_get_unique_id through a file, instead of STRIA_ROOT
  int64_t window_left = -1;  // >= 0: a sliding window to the left (the contiguous ring then stops early)
  int plan_docs = 0;         // > 0: on a document plan of this many documents (nccl_rank's --plan-docs)
  // With plan_docs: documents each rank keeps past whole tiles (--plan-home), at a shape the
  // tensor-core kernels take (640 tokens a rank, D 64, bf16): their part of the local block runs on
  // a stream of its own beside the ring's, whose transfers NCCL makes.
  bool plan_home = false;
};

class NcclRing : public ::testing::TestWithParam<RingCase> {};

TEST_P(NcclRing, MatchesReference) {
  const RingCase& c = GetParam();
  REQUIRE_GPUS(c.world);
  const std::string dir = TempDir("stria-nccl");
  Launch launch(dir);
  const int port = FreePort();
  for (int r = 0; r < c.world; ++r) {
    std::vector<std::string> args{"--rank",   std::to_string(r), "--world",  std::to_string(c.world),
                                  "--layout", c.layout,          "--causal", c.causal ? "1" : "0",
                                  "--dtypes", "bf16,f32",        "--iters",  "2"};
    if (c.id_file) {
      args.push_back("--id-file");
      args.push_back(dir + "/id");
    }
    if (c.window_left >= 0) args.insert(args.end(), {"--window-left", std::to_string(c.window_left)});
    if (c.plan_docs > 0) args.insert(args.end(), {"--plan-docs", std::to_string(c.plan_docs)});
    if (c.plan_home) {
      args.insert(args.end(), {"--plan-home", "1", "--L", "640", "--dim", "64"});
      args[std::find(args.begin(), args.end(), "--dtypes") - args.begin() + 1] = "bf16";
    }
    launch.Start(r, STRIA_NCCL_RANK, args,
                 c.id_file ? std::vector<std::string>{}
                           : std::vector<std::string>{"STRIA_ROOT=127.0.0.1:" + std::to_string(port)});
  }
  auto results = launch.Wait(400);
  ASSERT_EQ(results.size(), static_cast<size_t>(c.world)) << Describe(results);
  for (auto& [rank, r] : results) EXPECT_EQ(r.code, STRIA_SUCCESS) << Describe(results);
}

std::vector<RingCase> RingCases() {
  std::vector<RingCase> cases;
  for (int world : {2, 3, 4})
    for (const char* layout : {"striped", "zigzag", "contiguous"})
      cases.push_back(RingCase{world, layout, layout[0] != 'c' || world == 2, world == 3});
  cases.push_back(RingCase{2, "striped", false, true});
  // A window of 80 over blocks of 64: three of four steps, each dK/dV partial sent two ranks back.
  cases.push_back(RingCase{4, "contiguous", true, false, 80});
  // Packed documents on a plan (S one short of whole blocks).
  cases.push_back(RingCase{3, "striped", true, false, -1, 7});
  cases.push_back(RingCase{3, "striped", true, false, -1, 8, true});
  return cases;
}

std::string CaseName(const ::testing::TestParamInfo<RingCase>& info) {
  const RingCase& c = info.param;
  return "N" + std::to_string(c.world) + "_" + c.layout + (c.causal ? "_causal" : "_full") +
         (c.id_file ? "_unique_id" : "_env") + (c.window_left >= 0 ? "_window" + std::to_string(c.window_left) : "") +
         (c.plan_docs > 0 ? "_plan" + std::to_string(c.plan_docs) : "") + (c.plan_home ? "_home" : "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, NcclRing, ::testing::ValuesIn(RingCases()), CaseName);

// A rank that dies or is aborted mid-call: the others fail (timeout, or NCCL's report of the
// broken connection) within their timeout and destroy cleanly; nobody hangs.
void FaultCase(const std::string& fault, int world) {
  REQUIRE_GPUS(world);
  const std::string dir = TempDir("stria-nccl");
  Launch launch(dir);
  const int port = FreePort();
  const double timeout = 8;
  for (int r = 0; r < world; ++r)
    launch.Start(r, STRIA_NCCL_RANK,
                 {"--rank", std::to_string(r), "--world", std::to_string(world), "--iters", "4", "--L", "2048",
                  "--timeout", std::to_string(timeout), "--fault", fault, "--fault-rank", "1", "--fault-delay-ms", "5"},
                 {"STRIA_ROOT=127.0.0.1:" + std::to_string(port)});
  auto results = launch.Wait(120);
  for (int r = 0; r < world; ++r) {
    if (fault == "kill" && r == 1) continue;
    ASSERT_TRUE(results.count(r)) << Describe(results);
    const RankResult& res = results[r];
    EXPECT_TRUE(res.exited) << "rank " << r << " hung or crashed\n" << Describe(results);
    if (fault == "abort" && r == 1) {
      EXPECT_EQ(res.code, STRIA_ERROR_ABORTED) << Describe(results);
    } else {
      EXPECT_TRUE(res.code == STRIA_ERROR_TIMEOUT || res.code == STRIA_ERROR_TRANSPORT) << Describe(results);
      EXPECT_LT(res.seconds, 3 * timeout + 60) << Describe(results);
    }
    EXPECT_EQ(res.message.find("BUG"), std::string::npos) << Describe(results);
  }
}

TEST(NcclFaults, PeerKilledMidCall) {
  FaultCase("kill", std::min(std::max(GpuCount(), 2), 4));
}

TEST(NcclFaults, PeerAbortedMidCall) {
  FaultCase("abort", std::min(std::max(GpuCount(), 2), 4));
}

}  // namespace
