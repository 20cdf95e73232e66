// The CUDA backend's edges: device shard/unshard against the host one, bad inputs refused before
// any rank communicates (host memory in a CUDA context, unsupported head dims), a full device
// (every rank fails, none hangs, the group recovers), no device
// allocation per call once the workspace has grown, abort and timeout of a GPU ring, NaN
// propagation, document boundaries in device memory, and outputs written over inputs in a world
// of one. Skips, saying why, where no GPU is present.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "fp8_inputs.h"
#include "gpu_util.h"

using namespace stria_test;

namespace {

TEST(CudaShard, MatchesHostShardForEveryLayout) {
  STRIA_REQUIRE_GPU();
  const int N = 4;
  const int64_t S = 24;
  Tensor full({2, S, 3, 5}, Dt::kBF16);
  std::mt19937_64 rng(5);
  full.FillRandom(rng);
  DeviceTensor full_d(full);
  for (stria_layout_t lay : {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG})
    for (int r = 0; r < N; ++r) {
      Tensor host({2, S / N, 3, 5}, Dt::kBF16), back({2, S / N, 3, 5}, Dt::kBF16);
      ASSERT_EQ(stria_shard(lay, N, r, 1, &full.dl, &host.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
      DeviceTensor local_d(back);
      local_d.Poison();
      ASSERT_EQ(stria_shard(lay, N, r, 1, &full_d.dl, &local_d.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      local_d.CopyTo(&back);
      EXPECT_EQ(back.storage, host.storage) << LayoutName(lay) << " rank " << r;
      // And back: unshard into a poisoned device copy of the full tensor, rank by rank.
    }
  Tensor rebuilt({2, S, 3, 5}, Dt::kBF16);
  DeviceTensor rebuilt_d(rebuilt);
  rebuilt_d.Poison();
  for (int r = 0; r < N; ++r) {
    Tensor local({2, S / N, 3, 5}, Dt::kBF16);
    ASSERT_EQ(stria_shard(STRIA_LAYOUT_ZIGZAG, N, r, 1, &full.dl, &local.dl, nullptr), STRIA_SUCCESS);
    DeviceTensor local_d(local);
    ASSERT_EQ(stria_unshard(STRIA_LAYOUT_ZIGZAG, N, r, 1, &local_d.dl, &rebuilt_d.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  rebuilt_d.CopyTo(&rebuilt);
  EXPECT_EQ(rebuilt.storage, full.storage);
  // Host memory that claims to be on the GPU is refused, not dereferenced by a kernel.
  Tensor host_local({2, S / N, 3, 5}, Dt::kBF16);
  DLTensor lying = host_local.dl;
  lying.device = DLDevice{kDLCUDA, 0};
  EXPECT_EQ(stria_shard(STRIA_LAYOUT_STRIPED, N, 0, 1, &full_d.dl, &lying, nullptr), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("host memory"), std::string::npos) << stria_get_last_error();
}

struct RankTensors {
  AttentionTensors host;
  DeviceTensor q, k, v, out, lse, dout, dq, dk, dv;
  RankTensors(int64_t L, int64_t D, Dt dt, uint64_t seed)
      : host(1, L, 4, 2, D, dt, seed),
        q(host.q),
        k(host.k),
        v(host.v),
        out(host.out),
        lse(host.lse),
        dout(host.dout),
        dq(host.dq),
        dk(host.dk),
        dv(host.dv) {}
  stria_status_t Forward(stria_context_t ctx, const stria_attention_params_t* p, const DLTensor* qq = nullptr) {
    return stria_attention_forward(ctx, p, qq ? qq : &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr);
  }
  stria_status_t Backward(stria_context_t ctx, const stria_attention_params_t* p) {
    return stria_attention_backward(ctx, p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, &dout.dl, &dq.dl, &dk.dl, &dv.dl,
                                    nullptr);
  }
};

// Tests that run every tensor-core family and SIMT (STRIA_CUDA_KERNELS; a family the device lacks
// runs mma.sync instead).
const char* const kFamilies[] = {"mma", "wgmma", "tma", "simt"};

TEST(CudaErrors, HostMemoryIsRefusedOnEveryRank) {
  STRIA_REQUIRE_GPU();
  const int N = 3;
  CudaGroup group(N);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  std::vector<stria_status_t> st(N);
  std::vector<std::string> msg(N);
  RunRanks(N, [&](int r) {
    RankTensors t(64, 64, Dt::kBF16, 7 + r);
    DLTensor host_q = t.host.q.dl;
    host_q.device = DLDevice{kDLCUDA, 0};
    st[r] = t.Forward(group.ctx[r], &p, r == 1 ? &host_q : nullptr);
    msg[r] = stria_get_last_error();
  });
  // Rank 1 says what is wrong with its q; the others name rank 1.
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(st[r], STRIA_ERROR_INVALID_ARGUMENT) << "rank " << r << ": " << msg[r];
    const std::string expected = r == 1 ? "host memory" : "rank 1 rejected its arguments";
    EXPECT_NE(msg[r].find(expected), std::string::npos) << "rank " << r << ": " << msg[r];
  }
  // The group is still usable after an argument error.
  RunRanks(N, [&](int r) {
    RankTensors t(64, 64, Dt::kBF16, 7 + r);
    st[r] = t.Forward(group.ctx[r], &p);
    msg[r] = stria_get_last_error();
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(st[r], STRIA_SUCCESS) << msg[r];
}

// The serving calls take the same checks as the ring's: a rank whose queries are in host memory
// fails with the reason, the others name it, and the group runs a ring call after it.
TEST(CudaErrors, ServingCallsRefuseHostMemoryOnEveryRank) {
  STRIA_REQUIRE_GPU();
  const int N = 2;
  CudaGroup group(N);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  std::vector<stria_status_t> st(N);
  std::vector<std::string> msg(N);
  RunRanks(N, [&](int r) {
    RankTensors t(64, 64, Dt::kBF16, 3 + r);
    std::vector<int64_t> lens = {0};  // the new tokens fill the cache
    stria_kv_cache_t cache;
    stria_kv_cache_init(&cache);
    cache.k = &t.k.dl;
    cache.v = &t.v.dl;
    cache.lens = lens.data();
    DLTensor host_q = t.host.q.dl;
    host_q.device = DLDevice{kDLCUDA, 0};
    st[r] = stria_attention_prefill(group.ctx[r], &p, &cache, STRIA_PREFILL_AUTO, r == 1 ? &host_q : &t.q.dl, &t.k.dl,
                                    &t.v.dl, &t.out.dl, nullptr, nullptr);
    msg[r] = stria_get_last_error();
  });
  for (int r = 0; r < N; ++r) {
    EXPECT_EQ(st[r], STRIA_ERROR_INVALID_ARGUMENT) << "rank " << r << ": " << msg[r];
    const std::string expected = r == 1 ? "host memory" : "rank 1 rejected its arguments";
    EXPECT_NE(msg[r].find(expected), std::string::npos) << "rank " << r << ": " << msg[r];
  }
  RunRanks(N, [&](int r) {
    RankTensors t(64, 64, Dt::kBF16, 7 + r);
    st[r] = t.Forward(group.ctx[r], &p);
    msg[r] = stria_get_last_error();
  });
  for (int r = 0; r < N; ++r) EXPECT_EQ(st[r], STRIA_SUCCESS) << msg[r];
}

TEST(CudaErrors, HeadDimAbove512IsUnsupported) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  RankTensors t(8, 520, Dt::kF16, 1);
  EXPECT_EQ(t.Forward(group.ctx[0], &p), STRIA_ERROR_UNSUPPORTED);
  EXPECT_NE(std::string(stria_get_last_error()).find("1..512"), std::string::npos) << stria_get_last_error();
}

// Heads wider than 256 run on the SIMT kernels' wide build, whose tiles take 193 KB of shared memory
// a block at 512 (simt_attention.cuh): where the GPU gives that (Hopper and later), a forward and a
// backward run; where it does not (an A100's 163 KB: the runtime model's
// STRIA_CUDA_MODEL_SMEM_OPTIN=166912, ctest model:narrow_smem), both are refused by name before
// anything is queued, and the context stays usable.
TEST(CudaShapes, WideHeadsRunWhereTheGpuGivesTheirSharedMemory) {
  STRIA_REQUIRE_GPU();
  int device = 0, optin = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), cudaSuccess);
  const bool fits = optin >= 197120;  // 49,280 floats: the dK/dV kernel's tiles
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.causal = 1;
  RankTensors wide(40, 512, Dt::kBF16, 3);
  for (int pass = 0; pass < 2; ++pass) {
    const stria_status_t st = pass == 0 ? wide.Forward(group.ctx[0], &p) : wide.Backward(group.ctx[0], &p);
    const std::string msg = stria_get_last_error();
    if (fits) {
      EXPECT_EQ(st, STRIA_SUCCESS) << msg;
    } else {
      EXPECT_EQ(st, STRIA_ERROR_UNSUPPORTED);
      EXPECT_NE(msg.find("head dim 512 runs on CUDA cores"), std::string::npos) << msg;
      EXPECT_NE(msg.find("this GPU gives 163 KB"), std::string::npos) << msg;
    }
  }
  RankTensors narrow(40, 128, Dt::kBF16, 4);
  EXPECT_EQ(narrow.Forward(group.ctx[0], &p), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// An error the caller left pending on its thread (a failed cudaSetDevice: not sticky) is the
// caller's: stria's launches must neither fail on it nor consume it. With launches checked by
// cudaGetLastError, every call below failed with "invalid device ordinal" and cleared it; with
// shared-memory limits raised by cudaFuncSetAttribute, which clears it even when it succeeds (an
// H200, and the runtime model after it), the bf16 call on wgmma and TMA cleared it.
TEST(CudaErrors, ACallersPendingErrorIsNeitherReportedNorCleared) {
  STRIA_REQUIRE_GPU();
  // Every family, both head dims (their kernels' shared memory differs: mma.sync's D 64 kernels
  // fit in 48 KB, the others raise the limit) and both backwards; float32 takes SIMT on any family.
  for (const char* family : kFamilies) {
    setenv("STRIA_CUDA_KERNELS", family, 1);  // read when the context is created
    CudaGroup group(1);
    unsetenv("STRIA_CUDA_KERNELS");
    ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    for (const Dt dt : {Dt::kBF16, Dt::kF32}) {
      for (const int64_t D : {64, 128}) {
        for (const int deterministic : {0, 1}) {
          SCOPED_TRACE(std::string(family) + (dt == Dt::kBF16 ? " bf16" : " f32") + " D " + std::to_string(D) +
                       (deterministic ? " deterministic" : ""));
          ASSERT_EQ(stria_context_set_deterministic(group.ctx[0], deterministic), STRIA_SUCCESS);
          RankTensors t(64, D, dt, 21);
          ASSERT_EQ(cudaSetDevice(-1), cudaErrorInvalidDevice);
          EXPECT_EQ(t.Forward(group.ctx[0], &p), STRIA_SUCCESS) << stria_get_last_error();
          EXPECT_EQ(t.Backward(group.ctx[0], &p), STRIA_SUCCESS) << stria_get_last_error();
          EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidDevice) << "stria consumed the caller's pending error";
          EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        }
      }
    }
  }
}

// Whether device `ordinal`'s primary context exists in this process (the driver's
// cuDevicePrimaryCtxGetState, through the runtime); -1 where that cannot be told.
int PrimaryContextActive(int ordinal) {
  using GetState = int (*)(int, unsigned int*, int*);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &fn, 12000, cudaEnableDefault, &found) !=
          cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return -1;
  unsigned int flags = 0;
  int active = 0;
  return reinterpret_cast<GetState>(fn)(ordinal, &flags, &active) == 0 ? active : -1;
}

// A thread that never chose a device creates, runs and destroys contexts on device 1. Giving it
// "its" device 0 back afterwards would create device 0's primary context, memory on a GPU this
// process never asked for (in a multi-GPU job, on every process).
TEST(CudaDevices, AThreadWithoutADeviceLeavesDeviceZeroAlone) {
  STRIA_REQUIRE_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, " << n << " here";
  const int before = PrimaryContextActive(0);
  if (before != 0) GTEST_SKIP() << "device 0's primary context is already there (or cannot be queried)";
  std::thread fresh([] {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.device = DLDevice{kDLCUDA, 1};
    stria_context_t ctx[2] = {nullptr, nullptr};
    ASSERT_EQ(stria_context_create_local_group(&cfg, 2, ctx), STRIA_SUCCESS) << stria_get_last_error();
    EXPECT_EQ(stria_context_abort(ctx[0]), STRIA_SUCCESS);
    EXPECT_EQ(stria_context_destroy(ctx[0]), STRIA_SUCCESS);
    EXPECT_EQ(stria_context_destroy(ctx[1]), STRIA_SUCCESS);
  });
  fresh.join();
  EXPECT_EQ(PrimaryContextActive(0), 0) << "stria made device 0's context current on a thread that had none";
}

TEST(CudaErrors, OrdinalOutOfRange) {
  STRIA_REQUIRE_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.device = DLDevice{kDLCUDA, n};
  stria_context_t ctx = nullptr;
  EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("out of range"), std::string::npos) << stria_get_last_error();
  // The same in a group on devices, named by its rank.
  CudaGroup group(std::vector<int>{0, n});
  EXPECT_EQ(group.status, STRIA_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(stria_get_last_error()).find("devices[1]: CUDA device ordinal"), std::string::npos)
      << stria_get_last_error();
  for (stria_context_t c : group.ctx) EXPECT_EQ(c, nullptr);
}

// The kernel switches a test or benchmark sets (STRIA_CUDA_KERNELS, and the TMA family's
// STRIA_CUDA_TMA_DQ, STRIA_CUDA_TMA_SCHEDULE and STRIA_CUDA_TMA_FORWARD_ROWS, and every family's
// STRIA_CUDA_HEAD_GROUP_BYTES): a misspelt value is refused at context creation, by name; a valid
// one is taken.
TEST(CudaErrors, MisspeltKernelSwitchesAreRefusedByName) {
  STRIA_REQUIRE_GPU();
  struct Case {
    const char* var;
    const char* bad;
    const char* good;
  };
  for (const Case& c :
       {Case{"STRIA_CUDA_KERNELS", "tmaa", "tma"}, Case{"STRIA_CUDA_TMA_DQ", "atomics", "atomic"},
        Case{"STRIA_CUDA_TMA_SCHEDULE", "persistant", "persistent"}, Case{"STRIA_CUDA_TMA_FORWARD_ROWS", "196", "192"},
        Case{"STRIA_CUDA_HEAD_GROUP_BYTES", "32MB", "33554432"}}) {
    SCOPED_TRACE(c.var);
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.device = DLDevice{kDLCUDA, 0};
    stria_context_t ctx = nullptr;
    setenv(c.var, c.bad, 1);
    EXPECT_EQ(stria_context_create(&cfg, &ctx), STRIA_ERROR_INVALID_ARGUMENT);
    const std::string msg = stria_get_last_error();
    EXPECT_NE(msg.find(c.var), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.bad), std::string::npos) << msg;
    EXPECT_EQ(ctx, nullptr);
    setenv(c.var, c.good, 1);
    const stria_status_t st = stria_context_create(&cfg, &ctx);
    unsetenv(c.var);
    EXPECT_EQ(st, STRIA_SUCCESS) << stria_get_last_error();
    stria_context_destroy(ctx);
  }
}

// In a group on two GPUs, each rank's tensors must be on its own GPU: a rank handing in memory of
// the other GPU is refused by name, and every rank fails at once.
TEST(CudaDevices, EachRankOfAGroupOnDevicesChecksItsOwnGpu) {
  STRIA_REQUIRE_GPU();
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n < 2) GTEST_SKIP() << "needs two CUDA devices, " << n << " here";
  CudaGroup group(std::vector<int>{0, 1}, 30.0);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  std::vector<stria_status_t> st(2);
  std::vector<std::string> msg(2);
  // Rank 1's tensors on GPU 0: said so by their DLPack device, or only by where the memory is.
  for (const bool lie : {false, true}) {
    SCOPED_TRACE(lie ? "q says cuda:1" : "q says cuda:0");
    RunRanks(2, [&](int r) {
      cudaSetDevice(0);
      RankTensors t(64, 64, Dt::kBF16, 31 + r);
      DLTensor* all[] = {&t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl};
      if (lie)
        for (DLTensor* x : all) x->device = DLDevice{kDLCUDA, r};
      st[static_cast<size_t>(r)] = t.Forward(group.ctx[static_cast<size_t>(r)], &p);
      msg[static_cast<size_t>(r)] = stria_get_last_error();
    });
    for (int r = 0; r < 2; ++r) EXPECT_EQ(st[static_cast<size_t>(r)], STRIA_ERROR_INVALID_ARGUMENT) << msg[r];
    const char* why =
        lie ? "is memory of cuda:0, but the context is on cuda:1" : "q is on cuda:0 but must be on cuda:1";
    EXPECT_NE(msg[1].find(why), std::string::npos) << msg[1];
    EXPECT_NE(msg[0].find("rank 1 rejected its arguments"), std::string::npos) << msg[0];
  }
  // Each rank on its own GPU: the group works.
  RunRanks(2, [&](int r) {
    cudaSetDevice(r);
    RankTensors t(64, 64, Dt::kBF16, 31 + r);
    EXPECT_EQ(t.Forward(group.ctx[static_cast<size_t>(r)], &p), STRIA_SUCCESS) << stria_get_last_error();
    EXPECT_EQ(t.Backward(group.ctx[static_cast<size_t>(r)], &p), STRIA_SUCCESS) << stria_get_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  });
  // The blocks went GPU to GPU: stria enabled peer access where the pair has it.
  int can = 0;
  ASSERT_EQ(cudaDeviceCanAccessPeer(&can, 1, 0), cudaSuccess);
  if (can) {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    EXPECT_EQ(cudaDeviceEnablePeerAccess(0, 0), cudaErrorPeerAccessAlreadyEnabled);
    (void)cudaGetLastError();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  }
}

// After the first call of a shape, calls allocate nothing on the device.
// Fills the device in ever smaller pieces until at most `leave` bytes are free; returns them.
std::vector<void*> FillDevice(size_t leave) {
  std::vector<void*> hog;
  for (size_t piece = size_t{1} << 30; piece >= (size_t{1} << 16); piece /= 4) {
    for (;;) {
      size_t free_bytes = 0, total = 0;
      if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess || free_bytes < leave + piece) break;
      void* ptr = nullptr;
      if (cudaMalloc(&ptr, piece) != cudaSuccess) break;
      hog.push_back(ptr);
    }
  }
  (void)cudaGetLastError();
  return hog;
}

// A device too full for the workspace (a long sequence meets a busy GPU). With no room at all,
// every rank fails on its own cudaMalloc. With room for one rank's workspace (rank 1 calls a
// moment after rank 0 has taken it, leaving half of one), rank 1's cudaMalloc fails and rank 0 learns it in the
// agreement on the call: both fail at once with OUT_OF_MEMORY, rank 0 naming rank 1, not at
// rank 0's timeout. Either way the same contexts work once the memory is back.
TEST(CudaErrors, OutOfDeviceMemoryFailsEveryRankAtOnceAndTheGroupRecovers) {
  STRIA_REQUIRE_GPU();
  const int N = 2;
  // A workspace of tens of MB on a GPU: at 1k tokens (a few MB) the first H200 run left rank 0
  // short of one 2 MB allocation in the room measured for it (page rounding and the driver's own
  // allocations are not in the measured difference), so the room has to dwarf them. The runtime
  // model counts bytes exactly and runs every kernel on the emulator: 256 tokens show the same.
  const int64_t L = OnRuntimeModel() ? 256 : 8192;
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  std::vector<std::unique_ptr<RankTensors>> t;  // the inputs exist before the device fills up
  for (int r = 0; r < N; ++r) t.push_back(std::make_unique<RankTensors>(L, 128, Dt::kBF16, 5 + r));
  size_t workspace = 0;  // one rank's, measured on a group of its own
  for (int pass = 0; pass < 2; ++pass) {
    // The first pass only warms up: on a GPU the first launches load the kernels' modules into
    // device memory (lazy loading), which must not count as workspace.
    CudaGroup probe(N);
    ASSERT_EQ(probe.status, STRIA_SUCCESS) << stria_get_last_error();
    size_t before = 0, after = 0, total = 0;
    ASSERT_EQ(cudaMemGetInfo(&before, &total), cudaSuccess);
    RunRanks(N, [&](int r) { EXPECT_EQ(t[r]->Forward(probe.ctx[r], &p), STRIA_SUCCESS) << stria_get_last_error(); });
    ASSERT_EQ(cudaMemGetInfo(&after, &total), cudaSuccess);
    workspace = (before - after) / N;
  }
  ASSERT_GT(workspace, 0u);
  const double timeout_s = 30;
  for (const bool room_for_one : {false, true}) {
    SCOPED_TRACE(room_for_one ? "room for one rank's workspace" : "no room");
    CudaGroup group(N, 0, timeout_s);  // a new group: no workspace yet
    ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
    const std::vector<void*> hog = FillDevice(room_for_one ? workspace + workspace / 2 : 0);
    std::vector<stria_status_t> st(N);
    std::vector<std::string> msg(N);
    std::vector<double> seconds(N);
    RunRanks(N, [&](int r) {
      if (room_for_one && r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const auto t0 = std::chrono::steady_clock::now();
      st[r] = t[r]->Forward(group.ctx[r], &p);
      msg[r] = stria_get_last_error();
      seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
    for (void* ptr : hog) cudaFree(ptr);
    for (int r = 0; r < N; ++r) {
      EXPECT_EQ(st[r], STRIA_ERROR_OUT_OF_MEMORY) << "rank " << r << ": " << msg[r];
      const bool own = !room_for_one || r == 1;
      EXPECT_NE(msg[r].find(own ? "cudaMalloc" : "rank 1 could not start"), std::string::npos)
          << "rank " << r << ": " << msg[r];
      EXPECT_LT(seconds[r], timeout_s / 3) << "rank " << r << " waited for its timeout: " << msg[r];
    }
    RunRanks(N, [&](int r) {
      t[r]->out.Poison();
      EXPECT_EQ(t[r]->Forward(group.ctx[r], &p), STRIA_SUCCESS) << "rank " << r << ": " << stria_get_last_error();
      if (room_for_one) {
        EXPECT_EQ(t[r]->Backward(group.ctx[r], &p), STRIA_SUCCESS) << "rank " << r << ": " << stria_get_last_error();
      }
    });
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor out({1, L, 4, 128}, Dt::kBF16);
    t[0]->out.CopyTo(&out);
    for (int64_t i = 0; i < out.numel(); ++i) ASSERT_FALSE(std::isnan(out.Get(i))) << "out[" << i << "] is the poison";
  }
}

TEST(CudaWorkspace, NoDeviceAllocationAfterTheFirstCall) {
  STRIA_REQUIRE_GPU();
  const int N = 2;
  CudaGroup group(N);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  std::vector<std::unique_ptr<RankTensors>> t;
  for (int r = 0; r < N; ++r) t.push_back(std::make_unique<RankTensors>(256, 128, Dt::kBF16, 3 + r));
  auto round = [&] {
    RunRanks(N, [&](int r) {
      EXPECT_EQ(t[r]->Forward(group.ctx[r], &p), STRIA_SUCCESS) << stria_get_last_error();
      EXPECT_EQ(t[r]->Backward(group.ctx[r], &p), STRIA_SUCCESS) << stria_get_last_error();
    });
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  };
  round();
  size_t free0 = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free0, &total), cudaSuccess);
  for (int i = 0; i < 3; ++i) round();
  size_t free1 = 0;
  ASSERT_EQ(cudaMemGetInfo(&free1, &total), cudaSuccess);
  EXPECT_EQ(free0, free1) << "device memory changed across calls of the same shape";
}

TEST(CudaFaults, MissingRankTimesOutAndAbortWorksFromAnotherThread) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(2, 0, 1.0);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  RankTensors t(64, 64, Dt::kBF16, 11);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(t.Forward(group.ctx[0], &p), STRIA_ERROR_TIMEOUT);  // rank 1 never calls
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  EXPECT_NE(std::string(stria_get_last_error()).find("rank(s) 1"), std::string::npos) << stria_get_last_error();

  CudaGroup g2(2, 0, 60.0);
  ASSERT_EQ(g2.status, STRIA_SUCCESS);
  std::atomic<bool> started{false};
  stria_status_t st = STRIA_SUCCESS;
  std::thread caller([&] {
    started = true;
    st = t.Forward(g2.ctx[0], &p);
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(stria_context_abort(g2.ctx[0]), STRIA_SUCCESS);
  caller.join();
  EXPECT_EQ(st, STRIA_ERROR_ABORTED);
}

// The backend's workspaces are shared by consecutive calls: a call on another stream must wait
// for the previous call's kernels (which may still read the state it overwrites).
TEST(CudaStreams, SwitchingStreamsBetweenCallsIsOrdered) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  // Long enough that the first call is still running on the GPU when the second is queued. On the
  // runtime model a launch always returns before its kernel runs, so a short call does as well.
  const int64_t L = OnRuntimeModel() ? 512 : 4096;
  RankTensors a(L, 128, Dt::kBF16, 21), b(L, 128, Dt::kBF16, 22);
  auto expected = [&](RankTensors& t) {
    t.out.Poison();
    EXPECT_EQ(t.Forward(group.ctx[0], &p), STRIA_SUCCESS) << stria_get_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor host({1, L, 4, 128}, Dt::kBF16);
    t.out.CopyTo(&host);
    return host.storage;
  };
  const auto want_a = expected(a), want_b = expected(b);
  cudaStream_t s1, s2;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    a.out.Poison();
    b.out.Poison();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(stria_attention_forward(group.ctx[0], &p, &a.q.dl, &a.k.dl, &a.v.dl, &a.out.dl, &a.lse.dl, s1),
              STRIA_SUCCESS);
    ASSERT_EQ(stria_attention_forward(group.ctx[0], &p, &b.q.dl, &b.k.dl, &b.v.dl, &b.out.dl, &b.lse.dl, s2),
              STRIA_SUCCESS);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor ha({1, L, 4, 128}, Dt::kBF16), hb({1, L, 4, 128}, Dt::kBF16);
    a.out.CopyTo(&ha);
    b.out.CopyTo(&hb);
    EXPECT_EQ(ha.storage, want_a) << "round " << round;
    EXPECT_EQ(hb.storage, want_b) << "round " << round;
  }
  cudaStreamDestroy(s1);
  cudaStreamDestroy(s2);
}

// A caller may destroy its stream once a call's work is done, and pass another to the next call:
// the context must not touch the old stream again (it orders the new call after the old one by an
// event it recorded while the old call ran). On the runtime model a destroyed stream is refused.
TEST(CudaStreams, AStreamDestroyedBetweenCallsIsNotUsedAgain) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.causal = 1;
  const int64_t L = 192;
  RankTensors t(L, 64, Dt::kBF16, 23);
  auto run = [&](cudaStream_t s) {
    for (DeviceTensor* d : {&t.out, &t.dq, &t.dk, &t.dv}) d->Poison();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(stria_attention_forward(group.ctx[0], &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, s),
              STRIA_SUCCESS)
        << stria_get_last_error();
    EXPECT_EQ(stria_attention_backward(group.ctx[0], &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, &t.dout.dl,
                                       &t.dq.dl, &t.dk.dl, &t.dv.dl, s),
              STRIA_SUCCESS)
        << stria_get_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> bytes;
    for (DeviceTensor* d : {&t.out, &t.dq, &t.dk, &t.dv}) {
      Tensor host({1, L, d == &t.dk || d == &t.dv ? 2 : 4, 64}, Dt::kBF16);
      d->CopyTo(&host);
      bytes.insert(bytes.end(), host.storage.begin(), host.storage.end());
    }
    return bytes;
  };
  const std::vector<uint8_t> want = run(nullptr);
  for (int round = 0; round < 3; ++round) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_EQ(run(s), want) << "round " << round;
    ASSERT_EQ(cudaStreamDestroy(s), cudaSuccess);
  }
  EXPECT_EQ(run(nullptr), want) << "after the last stream was destroyed";
}

// A call on a stream being captured into a CUDA graph is refused before it queues anything: its
// replay would reuse tables and workspaces that later calls refill or free. The capture ends
// valid (on a GPU, queuing work or waiting for the stream would have invalidated it, in the
// strictest mode), and the same calls then run on that stream outside it.
TEST(CudaStreams, ACallBeingCapturedIsRefusedAndTheCaptureStaysValid) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  const stria_context_t ctx = group.ctx[0];
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.causal = 1;
  RankTensors t(64, 64, Dt::kBF16, 29);
  const std::vector<int64_t> lens = {32};  // the cache: t.k and t.v, 64 slots, the first 32 used
  stria_kv_cache_t cache;
  stria_kv_cache_init(&cache);
  cache.k = &t.k.dl;
  cache.v = &t.v.dl;
  cache.lens = lens.data();
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  auto calls = [&](std::vector<std::string>* messages) {
    std::vector<stria_status_t> st;
    st.push_back(stria_attention_forward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, s));
    messages->push_back(stria_get_last_error());
    st.push_back(stria_attention_backward(ctx, &p, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl, &t.lse.dl, &t.dout.dl,
                                          &t.dq.dl, &t.dk.dl, &t.dv.dl, s));
    messages->push_back(stria_get_last_error());
    st.push_back(stria_attention_decode(ctx, &p, &cache, &t.q.dl, nullptr, nullptr, &t.out.dl, nullptr, s));
    messages->push_back(stria_get_last_error());
    return st;
  };
  std::vector<std::string> messages;
  ASSERT_EQ(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  const std::vector<stria_status_t> captured = calls(&messages);
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(s, &graph), cudaSuccess) << "the refused calls invalidated the capture";
  if (graph != nullptr) {
    EXPECT_EQ(cudaGraphDestroy(graph), cudaSuccess);
  }
  for (size_t i = 0; i < captured.size(); ++i) {
    EXPECT_EQ(captured[i], STRIA_ERROR_UNSUPPORTED) << "call " << i << ": " << messages[i];
    EXPECT_NE(messages[i].find("being captured into a CUDA graph"), std::string::npos) << messages[i];
  }
  messages.clear();
  for (stria_status_t st : calls(&messages)) EXPECT_EQ(st, STRIA_SUCCESS) << messages.front();
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

TEST(CudaNumerics, NanInAQueryRowStaysInThatRow) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  AttentionTensors h(1, 70, 2, 1, 64, Dt::kBF16, 4);
  h.q.Set(((0 * 70 + 5) * 2 + 1) * 64 + 3, std::numeric_limits<double>::quiet_NaN());  // row i=5, head 1
  DeviceTensor q(h.q), k(h.k), v(h.v), out(h.out), lse(h.lse);
  out.Poison();
  ASSERT_EQ(stria_attention_forward(group.ctx[0], &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr), STRIA_SUCCESS)
      << stria_get_last_error();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out.CopyTo(&h.out);
  for (int64_t i = 0; i < 70; ++i)
    for (int64_t hh = 0; hh < 2; ++hh) {
      const double x = h.out.Get(((i * 2) + hh) * 64);
      if (i == 5 && hh == 1)
        EXPECT_TRUE(std::isnan(x)) << "the NaN row";
      else
        EXPECT_TRUE(std::isfinite(x)) << "row " << i << " head " << hh;
    }
}

// A world of one reads compact K and V in place and may write its outputs from the block kernel
// itself (cuda_backend.cc): an output laid over an input must still give the numbers of the
// inputs as they were, whether it is the query tensor itself (in place) or K or V.
void ForwardOverInputs(stria_context_t ctx) {
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  const int64_t L = 200, H = 2, D = 64;  // as many K/V heads as query heads: out fits over K or V
  AttentionTensors h(1, L, H, H, D, Dt::kBF16, 21);
  // Not causal: then every query tile reads every key, so a tile's output written over K before
  // another tile has read those keys would show.
  p.causal = 0;
  const Reference ref = DenseAttention(h.q.ToDouble(), h.k.ToDouble(), h.v.ToDouble(), nullptr, 1, L, H, H, D, false,
                                       1.0 / std::sqrt(static_cast<double>(D)));
  for (const char* over : {"q", "k", "v"}) {
    SCOPED_TRACE(std::string("out over ") + over);
    DeviceTensor q(h.q), k(h.k), v(h.v), lse(h.lse);
    lse.Poison();
    DeviceTensor& out = over[0] == 'q' ? q : over[0] == 'k' ? k : v;
    ASSERT_EQ(stria_attention_forward(ctx, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, nullptr), STRIA_SUCCESS)
        << stria_get_last_error();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    Tensor got(h.out.shape, Dt::kBF16), got_lse(h.lse.shape, Dt::kF32);
    out.CopyTo(&got);
    lse.CopyTo(&got_lse);
    EXPECT_LT(RelError(got.ToDouble(), ref.out), 2e-2);
    EXPECT_LT(RelError(got_lse.ToDouble(), ref.lse), 1e-3);
  }
}

TEST(CudaAliasing, AnOutputOverAnInputOfAWorldOfOne) {
  STRIA_REQUIRE_GPU();
  for (const char* family : kFamilies) {
    setenv("STRIA_CUDA_KERNELS", family, 1);  // read when the context is created
    SCOPED_TRACE(family);
    CudaGroup group(1);
    unsetenv("STRIA_CUDA_KERNELS");
    ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
    ForwardOverInputs(group.ctx[0]);
  }
}

// The backward's counterpart: a world of one may write dK and dV from its block kernels, whose
// CTAs read every query and dO row that sees their keys; dK laid over q or dO (or over K, which
// the deterministic backward's dQ pass reads after dK/dV are done) must not change the numbers.
void KeyGradientsOverInputs(stria_context_t ctx) {
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  p.causal = 0;  // every key tile reads every query tile
  const int64_t L = 200, H = 2, D = 64;
  AttentionTensors h(1, L, H, H, D, Dt::kBF16, 22);
  const std::vector<double> dod = h.dout.ToDouble();
  const Reference ref = DenseAttention(h.q.ToDouble(), h.k.ToDouble(), h.v.ToDouble(), &dod, 1, L, H, H, D, false,
                                       1.0 / std::sqrt(static_cast<double>(D)));
  Tensor out_ref(h.out.shape, Dt::kBF16), lse_ref(h.lse.shape, Dt::kF32);
  for (int64_t x = 0; x < out_ref.numel(); ++x) out_ref.Set(x, ref.out[static_cast<size_t>(x)]);
  for (int64_t x = 0; x < lse_ref.numel(); ++x) lse_ref.Set(x, ref.lse[static_cast<size_t>(x)]);
  for (int deterministic : {0, 1}) {
    ASSERT_EQ(stria_context_set_deterministic(ctx, deterministic), STRIA_SUCCESS) << stria_get_last_error();
    for (const char* over : {"q", "dout", "k"}) {
      SCOPED_TRACE(std::string("dk over ") + over + (deterministic ? ", deterministic" : ""));
      DeviceTensor q(h.q), k(h.k), v(h.v), out(out_ref), lse(lse_ref), dout(h.dout), dq(h.dq), dv(h.dv);
      for (DeviceTensor* t : {&dq, &dv}) t->Poison();
      DeviceTensor& dk_at = over[0] == 'q' ? q : over[0] == 'd' ? dout : k;
      ASSERT_EQ(stria_attention_backward(ctx, &p, &q.dl, &k.dl, &v.dl, &out.dl, &lse.dl, &dout.dl, &dq.dl, &dk_at.dl,
                                         &dv.dl, nullptr),
                STRIA_SUCCESS)
          << stria_get_last_error();
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      Tensor got_dk(h.dk.shape, Dt::kBF16), got_dv(h.dv.shape, Dt::kBF16), got_dq(h.dq.shape, Dt::kBF16);
      dk_at.CopyTo(&got_dk);
      dv.CopyTo(&got_dv);
      dq.CopyTo(&got_dq);
      EXPECT_LT(RelError(got_dk.ToDouble(), ref.dk), 2e-2);
      EXPECT_LT(RelError(got_dv.ToDouble(), ref.dv), 2e-2);
      EXPECT_LT(RelError(got_dq.ToDouble(), ref.dq), 2e-2);
    }
  }
}

TEST(CudaAliasing, KeyGradientsOverAnInputOfAWorldOfOne) {
  STRIA_REQUIRE_GPU();
  for (const char* family : kFamilies) {
    setenv("STRIA_CUDA_KERNELS", family, 1);
    SCOPED_TRACE(family);
    CudaGroup group(1);
    unsetenv("STRIA_CUDA_KERNELS");
    ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
    KeyGradientsOverInputs(group.ctx[0]);
  }
}

// Document boundaries may be a device tensor on a CUDA context: stria reads them on the call's
// stream, validates them as it does host ones, and refuses another GPU's memory.
TEST(CudaDocuments, BoundariesInDeviceMemory) {
  STRIA_REQUIRE_GPU();
  CudaGroup group(1);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  stria_attention_params_t p;
  stria_attention_params_init(&p);
  RankTensors t(64, 64, Dt::kBF16, 12);
  auto forward = [&](const int64_t* cu, DLTensor* out) {
    return stria_attention_forward_documents(group.ctx[0], &p, cu, 3, &t.q.dl, &t.k.dl, &t.v.dl, out, &t.lse.dl,
                                             nullptr);
  };
  auto upload = [](const std::vector<int64_t>& cu, DeviceInt64s* d) {
    EXPECT_EQ(cudaMemcpy(d->ptr, cu.data(), cu.size() * sizeof(int64_t), cudaMemcpyHostToDevice), cudaSuccess);
  };
  const std::vector<int64_t> good{0, 20, 45, 64};
  DeviceInt64s cu_d(good.size());

  // The same numbers, bit for bit, as from host boundaries.
  ASSERT_EQ(forward(good.data(), &t.out.dl), STRIA_SUCCESS) << stria_get_last_error();
  Tensor from_host(t.host.out.shape, Dt::kBF16), from_device(t.host.out.shape, Dt::kBF16);
  t.out.CopyTo(&from_host);
  t.out.Poison();
  upload(good, &cu_d);
  ASSERT_EQ(forward(cu_d.ptr, &t.out.dl), STRIA_SUCCESS) << stria_get_last_error();
  t.out.CopyTo(&from_device);
  EXPECT_EQ(from_host.storage, from_device.storage);
  EXPECT_EQ(t.Backward(group.ctx[0], &p), STRIA_SUCCESS) << stria_get_last_error();  // plain, after documents

  // Bad boundaries on the device are named as on the host, backward too.
  for (const auto& [cu, why] :
       std::vector<std::pair<std::vector<int64_t>, std::string>>{{{0, 40, 20, 64}, "decreases at entry 2"},
                                                                 {{0, 20, 45, 63}, "ends at 63"},
                                                                 {{5, 20, 45, 64}, "starts at 5"}}) {
    upload(cu, &cu_d);
    EXPECT_EQ(forward(cu_d.ptr, &t.out.dl), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stria_get_last_error()).find(why), std::string::npos) << stria_get_last_error();
    EXPECT_EQ(stria_attention_backward_documents(group.ctx[0], &p, cu_d.ptr, 3, &t.q.dl, &t.k.dl, &t.v.dl, &t.out.dl,
                                                 &t.lse.dl, &t.dout.dl, &t.dq.dl, &t.dk.dl, &t.dv.dl, nullptr),
              STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stria_get_last_error()).find(why), std::string::npos) << stria_get_last_error();
  }

  // Another GPU's memory is refused, before anything is read.
  int n = 0;
  ASSERT_EQ(cudaGetDeviceCount(&n), cudaSuccess);
  if (n >= 2) {
    ASSERT_EQ(cudaSetDevice(1), cudaSuccess);
    DeviceInt64s other(good.size());
    upload(good, &other);
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    EXPECT_EQ(forward(other.ptr, &t.out.dl), STRIA_ERROR_INVALID_ARGUMENT);
    EXPECT_NE(std::string(stria_get_last_error()).find("cu_seqlens"), std::string::npos) << stria_get_last_error();
    EXPECT_NE(std::string(stria_get_last_error()).find("is memory of cuda:1, but the context is on cuda:0"),
              std::string::npos)
        << stria_get_last_error();
  }
  // The context still works.
  upload(good, &cu_d);
  EXPECT_EQ(forward(cu_d.ptr, &t.out.dl), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// FP8 inputs in device memory with descales there too, through a ring, against the float64
// reference on the values the codes stand for. At head dim 128 on compute capability 9.0 (the
// runtime model's device too) the backend takes them as they are: the e4m3 TMA kernel, K/V
// messages of one byte per value (K's rows, then V transposed), v's descale on the outputs last;
// the output then carries P's e4m3 rounding (4e-2). At head dim 64 they are widened to bf16 first
// (2e-2). Each rank's K/V bytes show which path ran. A descale in host memory is refused by name.
// With `plan`, the tokens by a document plan of the documents (trimmed K/V messages: K's rows
// that later ranks see, Vt whole) on a sequence no rank count divides.
void CheckFp8Ring(int world, int64_t D, int docs, bool plan = false) {
  STRIA_REQUIRE_GPU();
  const bool native = D == 128;
  SCOPED_TRACE(std::string(native ? "e4m3 kernel" : "widened") + ", N " + std::to_string(world) + ", documents " +
               std::to_string(docs) + (plan ? ", plan" : ""));
  const int64_t B = 1, Hq = 4, Hkv = 2, S = plan ? 200 * world - 5 : 200 * world;
  int64_t L = S / world;
  std::mt19937_64 rng(77 + D + world);
  Fp8Input q({B, S, Hq, D}, Descale::kHead, 1.0, rng), k({B, S, Hkv, D}, Descale::kTensor, 1.0, rng),
      v({B, S, Hkv, D}, Descale::kHead, 1.0, rng);
  std::vector<int64_t> cu;
  if (docs > 0) cu = RandomDocuments(B, S, docs, rng);
  const Reference ref = DenseAttention(q.Values(), k.Values(), v.Values(), nullptr, B, S, Hq, Hkv, D, true,
                                       1.0 / std::sqrt(static_cast<double>(D)), docs > 0 ? &cu : nullptr);
  stria_plan_t the_plan = nullptr;
  if (plan) {
    stria_plan_config_t cfg;
    stria_plan_config_init(&cfg);
    cfg.world_size = world;
    cfg.causal = 1;
    cfg.tile = 128;
    ASSERT_EQ(stria_plan_create(&cfg, cu.data(), docs, B, S, &the_plan), STRIA_SUCCESS) << stria_get_last_error();
    stria_plan_info_t info;
    info.struct_size = sizeof info;
    ASSERT_EQ(stria_plan_get_info(the_plan, &info), STRIA_SUCCESS);
    L = info.local_len;
  }
  auto shard = [&](int r, const DLTensor& full, DLTensor* local) {
    return plan ? stria_plan_shard(the_plan, r, 1, &full, local, nullptr)
                : stria_shard(STRIA_LAYOUT_STRIPED, world, r, 1, &full, local, nullptr);
  };
  auto unshard = [&](int r, int dim, const DLTensor& local, DLTensor* full) {
    return plan ? stria_plan_unshard(the_plan, r, dim, &local, full, nullptr)
                : stria_unshard(STRIA_LAYOUT_STRIPED, world, r, dim, &local, full, nullptr);
  };
  Tensor out_full({B, S, Hq, D}, Dt::kBF16), lse_full({B, Hq, S}, Dt::kF32);
  out_full.Poison();
  lse_full.Poison();
  CudaGroup group(world);
  ASSERT_EQ(group.status, STRIA_SUCCESS) << stria_get_last_error();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::mutex mu;
  RunRanks(world, [&](int r) {
    std::string& err = errors[static_cast<size_t>(r)];
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    Fp8Shard ql(q, L), kl(k, L), vl(v, L);
    for (auto [full, local] : {std::pair{&q, &ql}, {&k, &kl}, {&v, &vl}})
      if (shard(r, full->dl, &local->dl) != STRIA_SUCCESS) err += std::string("shard: ") + stria_get_last_error();
    // The codes to the device as they are.
    std::vector<void*> codes;
    std::vector<DLTensor> dl;
    for (Fp8Shard* t : {&ql, &kl, &vl}) {
      void* p = nullptr;
      EXPECT_EQ(cudaMalloc(&p, t->codes.size()), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(p, t->codes.data(), t->codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
      codes.push_back(p);
      DLTensor d = t->dl;
      d.data = p;
      d.device = DLDevice{kDLCUDA, 0};
      dl.push_back(d);
    }
    DeviceTensor q_scale(ql.scale), k_scale(kl.scale), v_scale(vl.scale);
    Tensor out({B, L, Hq, D}, Dt::kBF16), lse({B, Hq, L}, Dt::kF32);
    DeviceTensor out_d(out), lse_d(lse);
    out_d.Poison();
    lse_d.Poison();
    stria_attention_params_t params;
    stria_attention_params_init(&params);
    params.layout = STRIA_LAYOUT_STRIPED;
    params.plan = the_plan;
    params.cu_seqlens = cu.empty() || plan ? nullptr : cu.data();
    params.num_seqs = plan ? 0 : docs;
    params.q_descale = &q_scale.dl;
    params.k_descale = &k_scale.dl;
    params.v_descale = &v_scale.dl;
    stria_context_t ctx = group.ctx[static_cast<size_t>(r)];
    if (stria_attention_forward(ctx, &params, &dl[0], &dl[1], &dl[2], &out_d.dl, &lse_d.dl, nullptr) != STRIA_SUCCESS)
      err += std::string("forward: ") + stria_get_last_error();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    out_d.CopyTo(&out);
    lse_d.CopyTo(&lse);
    // What this rank sent: whole blocks, one byte per value (and V padded to 128 keys) or two.
    stria_traffic_t traffic;
    traffic.struct_size = sizeof traffic;
    EXPECT_EQ(stria_context_get_traffic(ctx, &traffic), STRIA_SUCCESS);
    const int64_t padded = (L + 127) / 128 * 128;
    const uint64_t message = static_cast<uint64_t>(native ? B * Hkv * D * (L + padded) : 2 * B * L * Hkv * D * 2);
    if (docs == 0) {
      EXPECT_EQ(traffic.kv_bytes, message * static_cast<uint64_t>(world - 1)) << "rank " << r;
    }
    // Host memory for a descale: refused on every rank by name, the group usable after.
    params.q_descale = &ql.scale.dl;
    const stria_status_t host =
        stria_attention_forward(ctx, &params, &dl[0], &dl[1], &dl[2], &out_d.dl, &lse_d.dl, nullptr);
    if (host != STRIA_ERROR_INVALID_ARGUMENT ||
        std::string(stria_get_last_error()).find("q_descale") == std::string::npos)
      err += std::string("host descale: ") + stria_get_last_error();
    for (void* p : codes) cudaFree(p);
    std::lock_guard<std::mutex> lock(mu);
    if (unshard(r, 1, out.dl, &out_full.dl) != STRIA_SUCCESS || unshard(r, 2, lse.dl, &lse_full.dl) != STRIA_SUCCESS)
      err += std::string("unshard: ") + stria_get_last_error();
  });
  for (int r = 0; r < world; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_LT(RelError(out_full.ToDouble(), ref.out), native ? 4e-2 : 2e-2);
  EXPECT_LT(RelError(lse_full.ToDouble(), ref.lse), 1e-3);
  if (the_plan != nullptr) stria_plan_destroy(the_plan);
}

TEST(CudaFp8, WidenedBelowHeadDim128) {
  CheckFp8Ring(2, 64, 0);
}
TEST(CudaFp8, E4m3KernelAtHeadDim128) {
  CheckFp8Ring(1, 128, 0);
  CheckFp8Ring(3, 128, 0);
}
TEST(CudaFp8, E4m3KernelWithDocuments) {
  CheckFp8Ring(2, 128, 3);
}
TEST(CudaFp8, E4m3KernelOnADocumentPlan) {
  CheckFp8Ring(3, 128, 5, true);
}

}  // namespace
