// One rank of the NCCL benchmarks (bench/nccl_run.sh starts them, one process per GPU).
//   ring:     the causal ring per layout on GPUs, forward and backward, bf16; prints each call's
//             wall time (from the last rank's entry to the last rank's exit, CLOCK_MONOTONIC,
//             which all processes of a host share), each after a device synchronisation.
//             With STRIA_BENCH_GRID=U, on a grid of all-to-all groups of U ranks (the ring
//             across the groups, the heads exchanged within each).
//   ring-local: the same at world 1 through the in-process transport (a local group of one),
//             the anchor of the NCCL transport's overhead at world 1 (bench/gpu_run.sh).
//   ring-gpus: the same ring over WORLD_SIZE GPUs in one process (run with RANK=0): a local group
//             with rank r on GPU r, blocks copied peer to peer; the anchor of the NCCL ring.
//   transfer: K/V-block-sized messages from rank 0 to rank 1 through the NCCL transport module
//             itself, one at a time as the ring sends them (post, wait), and the same through
//             plain NCCL (a blocking communicator of its own, ncclSend/ncclRecv, a stream
//             synchronisation per message): the anchor. Prints both bandwidths.
// Ranks come from RANK/WORLD_SIZE, the GPU from LOCAL_RANK (default: RANK), and the rendezvous
// from STRIA_ROOT. The transfer anchor passes NCCL's id through the file NCCL_ID_FILE.
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <nccl.h>
#include <stria/stria.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "transport/module_abi.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

DLTensor Tensor(void* data, int ndim, int64_t* shape, DLDataType dtype, int device) {
  DLTensor t{};
  t.data = data;
  t.device = {kDLCUDA, device};
  t.ndim = ndim;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

void* DeviceFilled(size_t bytes, unsigned seed) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
  std::vector<uint16_t> h(bytes / 2);
  for (size_t i = 0; i < h.size(); ++i) {
    // bf16 values in [-0.5, 0.5): the upper half of a float's bits
    const float f = static_cast<float>((i * 2654435761u + seed) % 1000) / 1000.f - 0.5f;
    uint32_t b;
    std::memcpy(&b, &f, 4);
    h[i] = static_cast<uint16_t>(b >> 16);
  }
  cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice);
  return p;
}

// Times the causal ring per layout on one rank's context: forward and backward, bf16, after a
// warm-up call; prints one CALL line per call (start and end on CLOCK_MONOTONIC).
int TimeCalls(stria_context_t ctx, int rank, int device, int64_t L, int64_t H, int64_t D, int reps) {
  const size_t n = static_cast<size_t>(L * H * D), bytes = n * 2;
  void* buf[8];
  for (int i = 0; i < 8; ++i) buf[i] = DeviceFilled(bytes, static_cast<unsigned>(rank * 8 + i));
  float* lse = nullptr;
  cudaMalloc(&lse, static_cast<size_t>(H * L) * sizeof(float));
  int64_t shape[4] = {1, L, H, D}, lse_shape[3] = {1, H, L};
  const DLDataType bf16 = {kDLBfloat, 16, 1}, f32 = {kDLFloat, 32, 1};
  DLTensor tq = Tensor(buf[0], 4, shape, bf16, device), tk = Tensor(buf[1], 4, shape, bf16, device),
           tv = Tensor(buf[2], 4, shape, bf16, device), to = Tensor(buf[3], 4, shape, bf16, device),
           tdo = Tensor(buf[4], 4, shape, bf16, device), tdq = Tensor(buf[5], 4, shape, bf16, device),
           tdk = Tensor(buf[6], 4, shape, bf16, device), tdv = Tensor(buf[7], 4, shape, bf16, device),
           tl = Tensor(lse, 3, lse_shape, f32, device);
  const stria_layout_t layouts[3] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_ZIGZAG, STRIA_LAYOUT_STRIPED};
  const char* names[3] = {"contiguous", "zigzag", "striped"};
  int rc = 0;
  for (int li = 0; li < 3 && rc == 0; ++li) {
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    p.layout = layouts[li];
    p.causal = 1;
    for (int rep = -1; rep < reps && rc == 0; ++rep) {  // rep -1 warms up
      for (int pass = 0; pass < 2; ++pass) {
        const double t0 = Now();
        stria_status_t s =
            pass == 0 ? stria_attention_forward(ctx, &p, &tq, &tk, &tv, &to, &tl, nullptr)
                      : stria_attention_backward(ctx, &p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv, nullptr);
        if (s == STRIA_SUCCESS && cudaDeviceSynchronize() != cudaSuccess) s = STRIA_ERROR_CUDA;
        const double t1 = Now();
        if (s != STRIA_SUCCESS) {
          std::fprintf(stderr, "rank %d: %s\n", rank, stria_get_last_error());
          rc = 1;
          break;
        }
        if (rep >= 0)
          std::printf("CALL %s %s %d %d %.6f %.6f\n", names[li], pass == 0 ? "fwd" : "bwd", rep, rank, t0, t1);
      }
    }
  }
  for (void* b : buf) cudaFree(b);
  cudaFree(lse);
  return rc;
}

// One rank of a ring over NCCL, or (`local`) a local group of one context: the in-process
// transport's device-to-device copies, the anchor of the NCCL transport's overhead at world 1.
int Ring(int rank, int world, int device, int64_t L, int64_t H, int64_t D, int reps, bool local) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = local ? STRIA_TRANSPORT_LOCAL : STRIA_TRANSPORT_NCCL;
  cfg.device = {kDLCUDA, device};
  cfg.timeout_s = 600;
  stria_context_t ctx;
  if (local && world != 1) {
    std::fprintf(stderr, "ring-local runs a world of 1\n");
    return 2;
  }
  const stria_status_t created =
      local ? stria_context_create_local_group(&cfg, 1, &ctx) : stria_context_create(&cfg, &ctx);
  if (created != STRIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: %s\n", rank, stria_get_last_error());
    return 1;
  }
  // STRIA_BENCH_GRID=U: the calls on a grid of all-to-all groups of U ranks (stria_context_set_grid).
  const int grid = EnvInt("STRIA_BENCH_GRID", 1);
  if (grid > 1 && stria_context_set_grid(ctx, grid) != STRIA_SUCCESS) {
    std::fprintf(stderr, "rank %d: %s\n", rank, stria_get_last_error());
    stria_context_destroy(ctx);
    return 1;
  }
  const int rc = TimeCalls(ctx, rank, device, L, H, D, reps);
  stria_context_destroy(ctx);
  return rc;
}

// The same ring over `gpus` GPUs in this one process, without NCCL: a local group with rank r on
// GPU r (stria_context_create_local_group_on_devices, peer-to-peer copies), each rank driven by
// its own thread. The anchor of the multi-process NCCL ring on the same GPUs.
int RingOnDevices(int gpus, int64_t L, int64_t H, int64_t D, int reps) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.timeout_s = 600;
  std::vector<DLDevice> devices;
  for (int r = 0; r < gpus; ++r) devices.push_back({kDLCUDA, r});
  std::vector<stria_context_t> ctx(static_cast<size_t>(gpus), nullptr);
  if (stria_context_create_local_group_on_devices(&cfg, devices.data(), gpus, ctx.data()) != STRIA_SUCCESS) {
    std::fprintf(stderr, "%s\n", stria_get_last_error());
    return 1;
  }
  std::vector<int> rc(static_cast<size_t>(gpus), 0);
  std::vector<std::thread> ranks;
  for (int r = 0; r < gpus; ++r)
    ranks.emplace_back([&, r] {
      cudaSetDevice(r);
      rc[static_cast<size_t>(r)] = TimeCalls(ctx[static_cast<size_t>(r)], r, r, L, H, D, reps);
    });
  for (auto& t : ranks) t.join();
  for (stria_context_t c : ctx) stria_context_destroy(c);
  for (int v : rc)
    if (v != 0) return v;
  return 0;
}

// Plain NCCL between ranks 0 and 1, the anchor of the transfer benchmark.
double PlainNccl(int rank, size_t bytes, int iters, void* dev) {
  const char* path = std::getenv("NCCL_ID_FILE");
  if (path == nullptr) return -1;
  ncclUniqueId id;
  if (rank == 0) {
    ncclGetUniqueId(&id);
    std::ofstream(std::string(path) + ".tmp", std::ios::binary).write(id.internal, sizeof id.internal);
    std::rename((std::string(path) + ".tmp").c_str(), path);
  } else {
    for (;;) {
      std::ifstream in(path, std::ios::binary);
      if (in.read(id.internal, sizeof id.internal)) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  ncclComm_t comm = nullptr;
  if (ncclCommInitRank(&comm, 2, id, rank) != ncclSuccess) return -1;
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  double dt = 0;
  for (int round = 0; round < 2; ++round) {
    const int n = round == 0 ? 3 : iters;
    const double t0 = Now();
    for (int i = 0; i < n; ++i) {
      if (rank == 0)
        ncclSend(dev, bytes, ncclUint8, 1, comm, stream);
      else
        ncclRecv(dev, bytes, ncclUint8, 0, comm, stream);
      cudaStreamSynchronize(stream);
    }
    dt = Now() - t0;
  }
  cudaStreamDestroy(stream);
  ncclCommDestroy(comm);
  return static_cast<double>(bytes) * iters / dt / 1e9;
}

int Transfer(int rank, int world, int device, size_t bytes, int iters) {
  void* lib = dlopen(STRIA_NCCL_MODULE, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::fprintf(stderr, "%s\n", dlerror());
    return 1;
  }
  auto* module = static_cast<const stria::TransportModule*>(dlsym(lib, "stria_nccl_module_v3"));
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.rank = rank;
  cfg.world_size = world;
  cfg.transport = STRIA_TRANSPORT_NCCL;
  cfg.device = {kDLCUDA, device};
  stria::Transport* t = nullptr;
  stria::Status s = module->create(cfg, nullptr, 600, &t);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.message().c_str());
    return 1;
  }
  void* dev = DeviceFilled(bytes, static_cast<unsigned>(rank));
  char token[8] = {}, all[64] = {};
  double ours = 0;
  for (int round = 0; round < 2; ++round) {  // round 0 warms up
    (void)t->AllGather(token, all, 8, 600, "start");
    const double t0 = Now();
    const int n = round == 0 ? 3 : iters;
    for (int i = 0; i < n && rank < 2; ++i) {
      const int64_t tag = (int64_t{round * 1000 + i + 1} << 24) | 1;
      stria::RequestId r = 0;
      s = rank == 0 ? t->Isend(1, tag, dev, bytes, &r) : t->Irecv(0, tag, dev, bytes, &r);
      if (s.ok()) s = t->Wait(r, 600, "transfer");
      if (!s.ok()) {
        std::fprintf(stderr, "rank %d: %s\n", rank, s.message().c_str());
        return 1;
      }
    }
    ours = static_cast<double>(bytes) * iters / (Now() - t0) / 1e9;
  }
  (void)t->AllGather(token, all, 8, 600, "end");
  delete t;
  const double plain = rank < 2 ? PlainNccl(rank, bytes, iters, dev) : -1;
  if (rank == 1) std::printf("TRANSFER %zu %d %.3f %.3f\n", bytes, iters, ours, plain);
  cudaFree(dev);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line into a pipe too: a run that a time limit stops keeps every line it printed whole.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  const int rank = EnvInt("RANK", -1), world = EnvInt("WORLD_SIZE", -1);
  const int device = EnvInt("LOCAL_RANK", rank);
  const std::string mode = argc > 1 ? argv[1] : "ring";
  if (rank < 0 || world < 1) {
    std::fprintf(stderr, "set RANK, WORLD_SIZE and STRIA_ROOT (LOCAL_RANK: the GPU)\n");
    return 2;
  }
  cudaSetDevice(device);
  if (mode == "ring-gpus")
    return RingOnDevices(world, argc > 2 ? std::atoll(argv[2]) : 8192, argc > 3 ? std::atoll(argv[3]) : 16,
                         argc > 4 ? std::atoll(argv[4]) : 128, argc > 5 ? std::atoi(argv[5]) : 5);
  if (mode == "ring" || mode == "ring-local")
    return Ring(rank, world, device, argc > 2 ? std::atoll(argv[2]) : 8192, argc > 3 ? std::atoll(argv[3]) : 16,
                argc > 4 ? std::atoll(argv[4]) : 128, argc > 5 ? std::atoi(argv[5]) : 5, mode == "ring-local");
  if (mode == "transfer")
    return Transfer(rank, world, device, argc > 2 ? std::strtoull(argv[2], nullptr, 10) : (64u << 20),
                    argc > 3 ? std::atoi(argv[3]) : 50);
  std::fprintf(stderr, "mode: ring | ring-local | ring-gpus | transfer\n");
  return 2;
}
