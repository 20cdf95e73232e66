// Decode over a sharded KV cache on a GPU (stria_attention_decode on the CUDA backend):
//
//   stria-decode-bench [--lens 32768,131072,524288,1048576] [--worlds 2,4,8] [--heads 32]
//                      [--kv-heads 8] [--dim 128] [--reps 20] [--prefill 512,4096] [--window W]
//
// One token per call (bf16, batch 1) against a cache of S tokens on one GPU: the call's time until
// out and lse are written (the call and a synchronisation of its stream), and the bandwidth of its
// reads of K and V; beside it the call's work on the GPU alone (`work_ms`: its kernels and its
// tables' upload, queued while the stream is held, then run back to back) and the host's (`host_ms`:
// the call's return, validation and launches). Then, for each N, two models of the call over N
// ranks:
//  - from the kernels' times (`work_*`), the measure the decode targets take: one rank's work at S / N,
//    the merge kernel over N records (`decode_merge`, measured), and the records' all-gather,
//    which one GPU cannot measure: --gather-us (default 20: a small NCCL all-gather within an
//    NVLink node) plus their bytes at --link-GBs (450);
//  - from the calls' times (`modelled_ms`): one rank's call at S / N (measured here as a world of
//    one) plus what N ranks add to a call, the merge (the agreement, the records' exchange device
//    to device, the merge kernel): an N-rank local group's call on this GPU at one cached token
//    each less a world of one's, an upper bound, since those ranks share one GPU and one host.
// With --window W, also each S's call under a sliding window of W keys (window_left W: the token
// sees the last W cached ones, a sliding-window layer's decode), `decode_window` lines, the
// bandwidth counting the window's keys alone: the call reads no others. Its anchor is SDPA on the
// window's slice of the cache (bench/torch_sdpa_gpu.py --decode ... --window W).
// And a prefill on one GPU: P new tokens (--prefill) against each S up to 128k, timed the same
// way, in TFLOP/s (the tensor-core decode's wide form attends them).
// Lines are key=value, as stria-cuda-bench's; the anchor (PyTorch SDPA's decode on the same shapes)
// is bench/torch_sdpa_gpu.py --decode.
#include <cuda_runtime_api.h>
#include <stria/stria.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "cuda/decode_launch.h"

namespace {

using bench::Median;
using bench::ParseList;

// A bf16 tensor in device memory, filled with a small constant (timing does not depend on values).
struct DeviceTensor {
  void* ptr = nullptr;
  std::vector<int64_t> shape;
  DLTensor dl{};
  DeviceTensor(std::vector<int64_t> s, DLDataType dtype, int fill) : shape(std::move(s)) {
    size_t n = static_cast<size_t>(dtype.bits / 8);
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    CHECK_CUDA(cudaMalloc(&ptr, n));
    CHECK_CUDA(cudaMemset(ptr, fill, n));
    dl.data = ptr;
    dl.device = DLDevice{kDLCUDA, 0};
    dl.ndim = static_cast<int32_t>(shape.size());
    dl.dtype = dtype;
    dl.shape = shape.data();
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(ptr); }
};

constexpr DLDataType kBF16{kDLBfloat, 16, 1};
constexpr DLDataType kF32{kDLFloat, 32, 1};

struct Shape {
  int64_t Hq, Hkv, D;
};

// Holds a stream while the host queues work behind it: a host function queued first spins until
// Open. The work then runs back to back, so that CUDA events around it time the device alone,
// without the host's launches between. A call that waited on the host for the held stream would
// hold it for ever: the function gives up after two seconds, and the timing is marked invalid.
class StreamGate {
 public:
  void Close(cudaStream_t stream) {
    open_.store(false);
    gave_up_.store(false);
    CHECK_CUDA(cudaLaunchHostFunc(stream, &Hold, this));
  }
  // Whether the stream was held until now.
  bool Open() {
    open_.store(true);
    return !gave_up_.load();
  }

 private:
  static void CUDART_CB Hold(void* self) {
    auto* g = static_cast<StreamGate*>(self);
    const auto t0 = std::chrono::steady_clock::now();
    while (!g->open_.load()) {
      if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(2)) {
        g->gave_up_.store(true);
        return;
      }
      std::this_thread::yield();
    }
  }
  std::atomic<bool> open_{true}, gave_up_{false};
};

// A decode call's time, median over the repetitions: `wall_ms` from the call until its stream is
// synchronised (the slowest rank's), and, in a world of one, `gpu_ms` between CUDA events recorded
// on the call's stream just before and after it, the anchor's method (bench/torch_sdpa_gpu.py):
// it counts the host's work up to the first queued operation and the GPU's, not the wake-up from
// the final synchronisation. In a world of one also `work_ms`, the same events around the call
// queued behind a StreamGate (the GPU's work alone; negative if the gate gave up), and
// `host_ms`, the call's own time on the host.
struct Timing {
  double wall_ms = 0, gpu_ms = 0, work_ms = -1, host_ms = 0;
};

// One decode call per rank of `ctx` (all ranks call together) over a cache of `len` cached tokens
// per rank's share of a striped cache of n * cap slots.
Timing DecodeMs(const std::vector<stria_context_t>& ctx, const Shape& s, int64_t cap, int64_t len, int reps,
                int64_t window_left = -1) {
  const int n = static_cast<int>(ctx.size());
  std::vector<double> times, gpu_times;
  struct Rank {
    std::unique_ptr<DeviceTensor> k, v, q, out, lse;
  };
  std::vector<Rank> ranks(static_cast<size_t>(n));
  for (Rank& r : ranks) {
    r.k = std::make_unique<DeviceTensor>(std::vector<int64_t>{1, cap, s.Hkv, s.D}, kBF16, 0x3c);
    r.v = std::make_unique<DeviceTensor>(std::vector<int64_t>{1, cap, s.Hkv, s.D}, kBF16, 0x3c);
    r.q = std::make_unique<DeviceTensor>(std::vector<int64_t>{1, 1, s.Hq, s.D}, kBF16, 0x3c);
    r.out = std::make_unique<DeviceTensor>(std::vector<int64_t>{1, 1, s.Hq, s.D}, kBF16, 0);
    r.lse = std::make_unique<DeviceTensor>(std::vector<int64_t>{1, s.Hq, 1}, kF32, 0);
  }
  cudaEvent_t before = nullptr, after = nullptr;
  CHECK_CUDA(cudaEventCreate(&before));
  CHECK_CUDA(cudaEventCreate(&after));
  const int64_t lens[1] = {len};
  std::vector<double> wall(static_cast<size_t>(n));
  std::vector<double> work_times, host_times;
  bool gated_ok = true;
  StreamGate gate;
  auto call = [&](int i) {
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    p.layout = STRIA_LAYOUT_STRIPED;
    p.window_left = window_left;
    stria_kv_cache_t cache;
    stria_kv_cache_init(&cache);
    Rank& r = ranks[static_cast<size_t>(i)];
    cache.k = &r.k->dl;
    cache.v = &r.v->dl;
    cache.lens = lens;
    CHECK_STRIA(stria_attention_decode(ctx[static_cast<size_t>(i)], &p, &cache, &r.q->dl, nullptr, nullptr, &r.out->dl,
                                       &r.lse->dl, nullptr));
  };
  for (int rep = 0; rep <= reps; ++rep) {
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        CHECK_CUDA(cudaSetDevice(0));
        const auto t0 = std::chrono::steady_clock::now();
        if (n == 1) CHECK_CUDA(cudaEventRecord(before, nullptr));
        call(i);
        if (n == 1) CHECK_CUDA(cudaEventRecord(after, nullptr));
        CHECK_CUDA(cudaStreamSynchronize(nullptr));
        wall[static_cast<size_t>(i)] =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      });
    for (std::thread& t : threads) t.join();
    if (rep > 0) {  // rep 0 warms up
      times.push_back(*std::max_element(wall.begin(), wall.end()));
      if (n == 1) {
        float ms = 0;
        CHECK_CUDA(cudaEventElapsedTime(&ms, before, after));
        gpu_times.push_back(ms);
      }
    }
    // Then the work's time on the GPU and the host's, the call queued behind the gate (after the warm-up
    // call, which grows the buffers: freeing one waits for the device). Once the gate gives up
    // (the call waited for the held stream), no more: each try would cost its two seconds.
    if (n == 1 && gated_ok) {
      gate.Close(nullptr);
      CHECK_CUDA(cudaEventRecord(before, nullptr));
      const auto t0 = std::chrono::steady_clock::now();
      call(0);
      const double host = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      CHECK_CUDA(cudaEventRecord(after, nullptr));
      gated_ok = gate.Open();
      CHECK_CUDA(cudaStreamSynchronize(nullptr));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, before, after));
      work_times.push_back(ms);
      host_times.push_back(host);
    }
  }
  CHECK_CUDA(cudaEventDestroy(before));
  CHECK_CUDA(cudaEventDestroy(after));
  Timing t;
  t.wall_ms = Median(times);
  t.gpu_ms = n == 1 ? Median(gpu_times) : t.wall_ms;
  if (n == 1) {
    t.work_ms = gated_ok ? Median(work_times) : -1;
    t.host_ms = host_times.empty() ? 0 : Median(host_times);
  }
  return t;
}

// The merge kernel of a call over N ranks (the records of N ranks into out and lse, as
// CudaDecoder::MergeOnDevice launches it), time per launch on the GPU: `reps` launches queued behind a
// StreamGate. The records' values do not change its time.
double MergeKernelMs(const Shape& s, int world, int reps) {
  const int64_t record = s.Hq * (s.D + 1);  // B = T = 1
  void* records = nullptr;
  CHECK_CUDA(cudaMalloc(&records, static_cast<size_t>(record * world) * sizeof(float)));
  const float* partial = static_cast<const float*>(records);
  CHECK_CUDA(cudaMemset(records, 0, static_cast<size_t>(record * world) * sizeof(float)));
  DeviceTensor out(std::vector<int64_t>{1, 1, s.Hq, s.D}, kBF16, 0);
  DeviceTensor lse(std::vector<int64_t>{1, s.Hq, 1}, kF32, 0);
  stria::cuda::DecodeFinishArgs a{};
  a.partial = partial;
  a.world = world;
  a.record_stride = record;
  a.out = out.ptr;
  a.out_strides[0] = s.Hq * s.D;
  a.out_strides[1] = s.Hq * s.D;
  a.out_strides[2] = s.D;
  a.out_strides[3] = 1;
  a.lse = static_cast<float*>(lse.ptr);
  a.lse_strides[0] = s.Hq;
  a.lse_strides[1] = 1;
  a.lse_strides[2] = 1;
  a.B = a.T = 1;
  a.Hq = static_cast<int>(s.Hq);
  a.D = static_cast<int>(s.D);
  cudaStream_t stream = nullptr;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t before = nullptr, after = nullptr;
  CHECK_CUDA(cudaEventCreate(&before));
  CHECK_CUDA(cudaEventCreate(&after));
  CHECK_CUDA(stria::cuda::LaunchDecodeFinish(stria::cuda::Elem::kBF16, a, stream));  // warms up
  StreamGate gate;
  gate.Close(stream);
  CHECK_CUDA(cudaEventRecord(before, stream));
  for (int i = 0; i < reps; ++i) CHECK_CUDA(stria::cuda::LaunchDecodeFinish(stria::cuda::Elem::kBF16, a, stream));
  CHECK_CUDA(cudaEventRecord(after, stream));
  const bool held = gate.Open();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, before, after));
  CHECK_CUDA(cudaEventDestroy(before));
  CHECK_CUDA(cudaEventDestroy(after));
  CHECK_CUDA(cudaStreamDestroy(stream));
  CHECK_CUDA(cudaFree(records));
  return held ? ms / reps : -1;
}

// A prefill of P new tokens against a cache of S tokens on one GPU (a world of one): median ms
// between CUDA events around the call, as the decode's.
double PrefillMs(stria_context_t ctx, const Shape& s, int64_t S, int64_t P, int reps) {
  DeviceTensor k(std::vector<int64_t>{1, S + P, s.Hkv, s.D}, kBF16, 0x3c);
  DeviceTensor v(std::vector<int64_t>{1, S + P, s.Hkv, s.D}, kBF16, 0x3c);
  DeviceTensor q(std::vector<int64_t>{1, P, s.Hq, s.D}, kBF16, 0x3c);
  DeviceTensor k_new(std::vector<int64_t>{1, P, s.Hkv, s.D}, kBF16, 0x3c);
  DeviceTensor v_new(std::vector<int64_t>{1, P, s.Hkv, s.D}, kBF16, 0x3c);
  DeviceTensor out(std::vector<int64_t>{1, P, s.Hq, s.D}, kBF16, 0);
  const int64_t lens[1] = {S};
  cudaEvent_t before = nullptr, after = nullptr;
  CHECK_CUDA(cudaEventCreate(&before));
  CHECK_CUDA(cudaEventCreate(&after));
  std::vector<double> times;
  for (int rep = 0; rep <= reps; ++rep) {
    stria_attention_params_t p;
    stria_attention_params_init(&p);
    stria_kv_cache_t cache;
    stria_kv_cache_init(&cache);
    cache.k = &k.dl;
    cache.v = &v.dl;
    cache.lens = lens;  // the call stores the new tokens at S..S+P-1 every time: the same work
    CHECK_CUDA(cudaEventRecord(before, nullptr));
    CHECK_STRIA(stria_attention_prefill(ctx, &p, &cache, STRIA_PREFILL_PASS_KV, &q.dl, &k_new.dl, &v_new.dl, &out.dl,
                                        nullptr, nullptr));
    CHECK_CUDA(cudaEventRecord(after, nullptr));
    CHECK_CUDA(cudaEventSynchronize(after));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, before, after));
    if (rep > 0) times.push_back(ms);  // rep 0 warms up
  }
  CHECK_CUDA(cudaEventDestroy(before));
  CHECK_CUDA(cudaEventDestroy(after));
  return Median(times);
}

std::vector<stria_context_t> Group(int n) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.device = DLDevice{kDLCUDA, 0};
  std::vector<stria_context_t> ctx(static_cast<size_t>(n), nullptr);
  CHECK_STRIA(n == 1 ? stria_context_create(&cfg, ctx.data()) : stria_context_create_local_group(&cfg, n, ctx.data()));
  return ctx;
}

void Destroy(std::vector<stria_context_t>* ctx) {
  for (stria_context_t c : *ctx) stria_context_destroy(c);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> lens = {32768, 131072, 524288, 1048576}, worlds = {2, 4, 8};
  Shape s{32, 8, 128};
  int reps = 20;
  double gather_us = 20, link_gbs = 450;
  std::vector<int64_t> prefill = {512, 4096};
  int64_t window = -1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--lens")
      lens = ParseList(argv[i + 1]);
    else if (k == "--worlds")
      worlds = ParseList(argv[i + 1]);
    else if (k == "--heads")
      s.Hq = std::atoll(argv[i + 1]);
    else if (k == "--kv-heads")
      s.Hkv = std::atoll(argv[i + 1]);
    else if (k == "--dim")
      s.D = std::atoll(argv[i + 1]);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (k == "--prefill")
      prefill = ParseList(argv[i + 1]);
    else if (k == "--window")
      window = std::atoll(argv[i + 1]);
    else if (k == "--gather-us")
      gather_us = std::atof(argv[i + 1]);
    else if (k == "--link-GBs")
      link_gbs = std::atof(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "stria-decode-bench: no GPU here\n");
    return 1;
  }
  std::vector<stria_context_t> one = Group(1);
  // One device holding the whole cache, and one rank's share at each N.
  std::vector<double> whole(lens.size()), whole_work(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) {
    const int64_t S = lens[i];
    const Timing t = DecodeMs(one, s, S, S - 1, reps);
    whole[i] = t.gpu_ms;
    whole_work[i] = t.work_ms;
    const double gbs = 2.0 * static_cast<double>(S) * static_cast<double>(s.Hkv * s.D) * 2.0 / (t.gpu_ms * 1e6);
    std::printf(
        "impl=stria_cuda decode S=%lld Hq=%lld Hkv=%lld D=%lld ms=%.4f kv_GBs=%.1f wall_ms=%.4f work_ms=%.4f "
        "host_ms=%.4f\n",
        static_cast<long long>(S), static_cast<long long>(s.Hq), static_cast<long long>(s.Hkv),
        static_cast<long long>(s.D), t.gpu_ms, gbs, t.wall_ms, t.work_ms, t.host_ms);
    std::fflush(stdout);
    if (window < 0) continue;
    // The token at position S - 1 after S - 1 cached ones sees those at S - 1 - W .. S - 2.
    const Timing w = DecodeMs(one, s, S, S - 1, reps, window);
    const double seen = static_cast<double>(std::min(window, S - 1));
    std::printf(
        "impl=stria_cuda decode_window S=%lld W=%lld Hq=%lld Hkv=%lld D=%lld ms=%.4f kv_GBs=%.1f wall_ms=%.4f "
        "work_ms=%.4f\n",
        static_cast<long long>(S), static_cast<long long>(window), static_cast<long long>(s.Hq),
        static_cast<long long>(s.Hkv), static_cast<long long>(s.D), w.gpu_ms,
        2.0 * seen * static_cast<double>(s.Hkv * s.D) * 2.0 / (w.gpu_ms * 1e6), w.wall_ms, w.work_ms);
    std::fflush(stdout);
  }
  // Prefill on one GPU: P new tokens against S cached ones, causal among themselves (FLOPs as
  // flash-attention counts them: 4 * P * (S + P / 2) * Hq * D).
  for (int64_t P : prefill)
    for (int64_t S : lens) {
      if (S > (int64_t{1} << 17)) continue;  // a prefill's chunk against up to 128k cached tokens
      const double ms = PrefillMs(one[0], s, S, P, std::min(reps, 5));
      const double flops = 4.0 * static_cast<double>(P) * (static_cast<double>(S) + static_cast<double>(P) / 2.0) *
                           static_cast<double>(s.Hq * s.D);
      std::printf("impl=stria_cuda prefill S=%lld P=%lld Hq=%lld Hkv=%lld D=%lld ms=%.4f tflops=%.1f\n",
                  static_cast<long long>(S), static_cast<long long>(P), static_cast<long long>(s.Hq),
                  static_cast<long long>(s.Hkv), static_cast<long long>(s.D), ms, flops / (ms * 1e9));
      std::fflush(stdout);
    }
  // The call's fixed cost on one GPU: one cached token (validation, the tables' upload, the
  // launches, the result written on the device).
  const Timing fixed_one = DecodeMs(one, s, 1, 1, reps);
  std::printf("impl=stria_cuda decode_fixed N=1 ms=%.4f wall_ms=%.4f work_ms=%.4f host_ms=%.4f\n", fixed_one.gpu_ms,
              fixed_one.wall_ms, fixed_one.work_ms, fixed_one.host_ms);
  std::fflush(stdout);
  // A call over N ranks: one rank's call on its share (measured as a world of one, its own fixed
  // cost included) plus what N ranks add to a call, the merge: the agreement, the records'
  // exchange and the merge kernel, measured as N ranks' call against one rank's at one cached
  // token.
  for (int64_t n : worlds) {
    std::vector<stria_context_t> group = Group(static_cast<int>(n));
    const double fixed = DecodeMs(group, s, 1, 1, reps).wall_ms;
    const double merge = std::max(0.0, fixed - fixed_one.wall_ms);
    Destroy(&group);
    // The merge on the GPU: the records' all-gather (modelled: B T Hq (D + 1) floats from each rank)
    // and the merge kernel (measured).
    const double merge_kernel = MergeKernelMs(s, static_cast<int>(n), reps);
    const double record_bytes = static_cast<double>(s.Hq * (s.D + 1)) * 4.0;
    const double gather = gather_us / 1e3 + record_bytes * static_cast<double>(n - 1) / (link_gbs * 1e6);
    std::printf(
        "impl=stria_cuda decode_merge N=%lld kernel_ms=%.4f gather_ms=%.4f (modelled: %.0f us + %.0f bytes "
        "a rank at %.0f GB/s)\n",
        static_cast<long long>(n), merge_kernel, gather, gather_us, record_bytes, link_gbs);
    for (size_t i = 0; i < lens.size(); ++i) {
      const int64_t share = (lens[i] + n - 1) / n;
      const Timing rank = DecodeMs(one, s, share, share, reps);
      const double modelled = rank.gpu_ms + merge, ideal = whole[i] / static_cast<double>(n);
      const double work_merge = merge_kernel + gather, work_modelled = rank.work_ms + work_merge;
      const double work_ideal = whole_work[i] / static_cast<double>(n);
      const bool work_ok = rank.work_ms > 0 && merge_kernel > 0 && whole_work[i] > 0;
      std::printf(
          "impl=stria_cuda decode_sharded S=%lld N=%lld rank_ms=%.4f fixed_ms=%.4f merge_ms=%.4f modelled_ms=%.4f "
          "ideal_ms=%.4f of_ideal=%.3f merge_share=%.3f",
          static_cast<long long>(lens[i]), static_cast<long long>(n), rank.gpu_ms, fixed, merge, modelled, ideal,
          ideal / modelled, merge / modelled);
      if (work_ok)
        std::printf(
            " work_rank_ms=%.4f work_merge_ms=%.4f work_modelled_ms=%.4f work_ideal_ms=%.4f "
            "work_of_ideal=%.3f work_merge_share=%.3f",
            rank.work_ms, work_merge, work_modelled, work_ideal, work_ideal / work_modelled,
            work_merge / work_modelled);
      std::printf("\n");
      std::fflush(stdout);
    }
  }
  Destroy(&one);
  return 0;
}
