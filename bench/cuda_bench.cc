// GPU benchmark (needs a GPU; bench/gpu_run.sh runs it beside PyTorch's SDPA).
//
//   stria-cuda-bench kernels [--dims 64,128] [--lens 1024,...,32768] [--reps 10] [--deterministic 1]
//     Forward and backward through the public API on one CUDA rank (no transfers), bf16,
//     B*S = 16k tokens and H*D = 2048 as in flash-attention's own benchmarks; prints one
//     key=value line per (direction, D, causal, S): median ms and TFLOP/s; at D = 128 and 256 also
//     the deterministic backward (stria_context_set_deterministic), as impl=stria_<family>_deterministic
//     (on the TMA family at D = 128 also with its dQ in a pass of its own, _deterministic_passes);
//     at D = 128 (STRIA_CUDA_KERNELS unset or tma) the forward on float8_e4m3fn inputs (impl=stria_fp8);
//     and at causal D = 128, with STRIA_CUDA_KERNELS naming a family, one `split` line per direction:
//     the call alone, per call of calls queued back to back, and the block kernel alone (Split).
//   stria-cuda-bench ring [--seq 262144] [--world 8] [--heads 16] [--dim 128]
//     The ring latency of N virtual ranks modelled from measured per-block kernel times: every
//     (rank, step) block mask of each layout is timed on this GPU (identical masks once), the
//     ring takes the sum over steps of the slowest rank; beside it the ideal (one GPU running the
//     whole sequence, divided by N) and the analytical ratios of stria_analyze_balance.
//   stria-cuda-bench docs [--seq 32768] [--world 8] [--heads 16] [--dim 128] [--dist lognormal] [--seed 1]
//     Packed documents: the ring latency of a document plan and of each fixed layout on the same
//     documents, modelled from measured per-block kernel times as in ring (every (rank, step)
//     block with its document bounds), against the ideal: one GPU running the packed sequence
//     with its document mask, divided by N. Distributions as stria-plan-bench's (lognormal:
//     median 1k tokens, capped at 15k; fewlong; uniform; single). Per step (docs_step): the
//     slowest and the mean rank's kernel times and the slowest forward's tiles; per block length
//     (docs_idle): a block in which nothing is visible, what a step costs without work. Every
//     forward launches over its query tiles with work only, as the backend's (busy_tiles.h);
//     plan_all_tiles is the plan with a CTA for every query tile, what that list saves.
//   stria-cuda-bench hide [--lens 1024,...,32768] [--heads 16] [--dim 128] [--kernels mma|wgmma|tma]
//                         [--nvlink-gbs 450] [--ib-gbs 50]
//     When does a ring step's transfer hide behind its compute? Times the block kernels of one
//     step (a striped causal step, about half a block, and a dense step) per block length and
//     sets them against the bytes the step moves (forward: K and V in bf16; backward: K and V
//     plus the fp32 dK/dV partial travelling one hop behind) at the nominal one-way bandwidth of
//     H100 NVLink (450 GB/s) and of 400 Gb/s InfiniBand (50 GB/s); prints the smallest measured
//     length that hides on each.
//
// FLOP convention (flash-attention's): forward 4*B*H*S^2*D, halved when causal; backward 2.5x.
#include <cuda_runtime.h>
#include <stria/stria.h>
#include <strings.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/busy_tiles.h"
#include "backend/cuda/mask_args.h"
#include "bench_util.h"
#include "cuda/launch.h"
#include "document_lengths.h"
#include "layout/layout.h"
#include "layout/plan.h"

namespace {

using bench::Median;
using bench::ParseList;

// A tensor-core family by its name (mma, wgmma, tma: KernelsName's), as --kernels and
// STRIA_CUDA_KERNELS spell it.
bool TensorCoreFamily(const char* name, stria::cuda::Kernels* out) {
  for (stria::cuda::Kernels k : {stria::cuda::Kernels::kMma, stria::cuda::Kernels::kWgmma, stria::cuda::Kernels::kTma})
    if (std::strcmp(name, stria::cuda::KernelsName(k)) == 0) {
      *out = k;
      return true;
    }
  return false;
}

// The TMA kernels' schedule when one is named (STRIA_CUDA_TMA_SCHEDULE, kernels/cuda/tma_launch.cuh):
// "_persistent", or "" for the default (a CTA per tile).
std::string TmaScheduleSuffix() {
  const char* schedule = std::getenv("STRIA_CUDA_TMA_SCHEDULE");
  return schedule != nullptr && *schedule != '\0' && strcasecmp(schedule, "tiles") != 0 ? std::string("_") + schedule
                                                                                        : std::string();
}
// The TMA forward's query tile when it is not the default (STRIA_CUDA_TMA_FORWARD_ROWS,
// kernels/cuda/tma_schedule.h): "_rows192", or "".
std::string TmaRowsSuffix() {
  const char* rows = std::getenv("STRIA_CUDA_TMA_FORWARD_ROWS");
  return rows != nullptr && *rows != '\0' && std::strcmp(rows, "128") != 0 ? std::string("_rows") + rows
                                                                           : std::string();
}
// The head groups' budget when one is named (STRIA_CUDA_HEAD_GROUP_BYTES, kernels/cuda/head_groups.cuh):
// "_headgroup0" without groups, "_headgroup<bytes>", or "" for the default (half the L2).
std::string HeadGroupSuffix() {
  const char* bytes = std::getenv("STRIA_CUDA_HEAD_GROUP_BYTES");
  return bytes != nullptr && *bytes != '\0' ? std::string("_headgroup") + bytes : std::string();
}
// A family as the ring, docs and hide lines name it: tma_persistent for the TMA family on its
// persistent kernels, tma_rows192 with three consumer warpgroups in its forward at head dim 64;
// _headgroup0 on any family with its heads all at once.
std::string FamilyLabel(stria::cuda::Kernels k) {
  return stria::cuda::KernelsName(k) +
         (k == stria::cuda::Kernels::kTma ? TmaScheduleSuffix() + TmaRowsSuffix() : std::string()) + HeadGroupSuffix();
}

// Median milliseconds of `fn` (queued on `stream`) over `reps` runs after one warm-up.
template <typename Fn>
double TimeMs(cudaStream_t stream, int reps, Fn fn) {
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  fn();
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    CHECK_CUDA(cudaEventRecord(a, stream));
    fn();
    CHECK_CUDA(cudaEventRecord(b, stream));
    CHECK_CUDA(cudaEventSynchronize(b));
    float t = 0;
    CHECK_CUDA(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return Median(ms);
}

struct Dev {
  void* p = nullptr;
  // random: small bf16 values of either sign (the bits of a bf16 in [-2, 2) are enough for
  // timing), drawn for the first 4 MiB and repeated on the device: a 256k-token block is GiBs,
  // and drawing all of it on the host cost seconds of a GPU lease per buffer. Else zeros.
  explicit Dev(size_t bytes, bool random = true) {
    CHECK_CUDA(cudaMalloc(&p, bytes));
    if (!random) {
      CHECK_CUDA(cudaMemset(p, 0, bytes));
      return;
    }
    std::vector<uint16_t> h(std::min<size_t>(bytes, size_t{4} << 20) / 2);
    uint32_t x = 12345;
    for (auto& e : h) {
      x = x * 1664525u + 1013904223u;
      e = static_cast<uint16_t>(0x3c00u | ((x >> 16) & 0x007fu) | ((x >> 8) & 0x8000u));
    }
    const size_t seed = h.size() * 2, even = bytes & ~size_t{1};          // seed <= even
    if (seed == 0 || even != bytes) CHECK_CUDA(cudaMemset(p, 0, bytes));  // a 1-byte buffer, an odd last byte
    if (seed == 0) return;
    CHECK_CUDA(cudaMemcpy(p, h.data(), seed, cudaMemcpyHostToDevice));
    auto* base = static_cast<char*>(p);
    for (size_t done = seed; done < even; done *= 2)
      CHECK_CUDA(cudaMemcpy(base + done, base, std::min(done, even - done), cudaMemcpyDeviceToDevice));
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
};

// `bytes` of float8_e4m3fn codes of magnitudes 1/8 .. 4, either sign (never NaN), as Dev draws:
// the first 4 MiB on the host, repeated on the device.
void FillE4m3(void* p, size_t bytes) {
  std::vector<uint8_t> h(std::min<size_t>(bytes, size_t{4} << 20));
  uint32_t x = 777;
  for (auto& e : h) {
    x = x * 1664525u + 1013904223u;
    e = static_cast<uint8_t>(((x >> 31) << 7) | ((4u + (x >> 8) % 5u) << 3) | ((x >> 4) & 7u));
  }
  if (h.empty()) return;
  CHECK_CUDA(cudaMemcpy(p, h.data(), h.size(), cudaMemcpyHostToDevice));
  auto* base = static_cast<char*>(p);
  for (size_t done = h.size(); done < bytes; done *= 2)
    CHECK_CUDA(cudaMemcpy(base + done, base, std::min(done, bytes - done), cudaMemcpyDeviceToDevice));
}

DLTensor View(void* p, int64_t* shape, int ndim, DLDataType t) {
  DLTensor d{};
  d.data = p;
  d.device = DLDevice{kDLCUDA, 0};
  d.ndim = ndim;
  d.dtype = t;
  d.shape = shape;
  return d;
}

// Times one forward (or backward) block kernel of `mask` over L tokens per rank (B rows of them):
// the kernel alone, as a ring step between the first and the last runs it (the running state
// read and written, no packing, no finishing pass).
struct BlockTimer {
  int64_t L, H, D;
  int reps;
  int64_t B;
  cudaStream_t stream;
  Dev q, k, v, dout, acc, m, l, dq, dkv;
  BlockTimer(int64_t L_, int64_t H_, int64_t D_, int reps_, int64_t B_ = 1)
      : L(L_),
        H(H_),
        D(D_),
        reps(reps_),
        B(B_),
        stream(nullptr),
        q(Bytes(2)),
        k(Bytes(2)),
        v(Bytes(2)),
        dout(Bytes(2)),
        acc(Bytes(4), false),
        m(static_cast<size_t>(B * H * L) * 4, false),
        l(static_cast<size_t>(B * H * L) * 4, false),
        dq(Bytes(4), false),
        dkv(2 * Bytes(4), false) {
    CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  ~BlockTimer() {
    cudaStreamDestroy(stream);
    for (cudaStream_t st : {hi, lo})
      if (st != nullptr) cudaStreamDestroy(st);
  }
  BlockTimer(const BlockTimer&) = delete;
  BlockTimer& operator=(const BlockTimer&) = delete;
  size_t Bytes(int es) const { return static_cast<size_t>(B * L * H * D) * es; }
  stria::cuda::Dims Dims() const {
    return stria::cuda::Dims{static_cast<int>(B), static_cast<int>(L), static_cast<int>(H), static_cast<int>(H),
                             static_cast<int>(D)};
  }
  // A [B, L, H, D] bf16 buffer's rows, compact.
  stria::cuda::RowsArg Rows(const Dev& t) const { return stria::cuda::RowsArg{t.p, L * H * D, H * D, D}; }

  // A block mask with document bounds (host arrays, [B][L] each): the device copy its kernels read,
  // in `*store` (made on first use; `bounds` by default). busy_tiles: with the forward's list of
  // query tiles with work, as the backend launches a block in the middle of its call
  // (busy_tiles.h); false: a CTA for every query tile.
  stria::cuda::MaskArgs Mask(const stria::BlockMask& bm, bool busy_tiles = false,
                             std::unique_ptr<Dev>* store = nullptr) {
    stria::cuda::MaskArgs a = stria::MaskOf(bm);
    if (bm.doc_lo == nullptr) return a;
    if (store == nullptr) store = &bounds;
    const size_t n = static_cast<size_t>(B * L);
    // Room for the longest list: tiles of kForwardTileRows, the smallest forward tile.
    const size_t list = static_cast<size_t>((L + stria::cuda::kForwardTileRows - 1) / stria::cuda::kForwardTileRows);
    if (*store == nullptr) *store = std::make_unique<Dev>(2 * n * sizeof(int64_t) + list * 4, false);
    auto* dev = static_cast<int64_t*>((*store)->p);
    CHECK_CUDA(cudaMemcpy(dev, bm.doc_lo, n * sizeof(int64_t), cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dev + n, bm.doc_hi, n * sizeof(int64_t), cudaMemcpyHostToDevice));
    a.doc_lo = dev;
    a.doc_hi = dev + n;
    a.doc_stride = bm.doc_batch_stride;
    if (busy_tiles) {
      std::vector<int32_t> tiles;
      stria::BusyQueryTiles(bm, B, L, forward_rows, &tiles);
      auto* dev_tiles = reinterpret_cast<int32_t*>(dev + 2 * n);
      if (!tiles.empty()) CHECK_CUDA(cudaMemcpy(dev_tiles, tiles.data(), tiles.size() * 4, cudaMemcpyHostToDevice));
      a.tiles = dev_tiles;
      a.tile_count = static_cast<int32_t>(tiles.size());
      a.tile_rows = forward_rows;
    }
    return a;
  }
  std::unique_ptr<Dev> bounds;                       // Mask's device copy of the document bounds and the tile list
  bool busy_tiles = true;                            // Forward's launches: as the backend's (Mask)
  int forward_rows = stria::cuda::kForwardTileRows;  // the query tile of the forward that Forward launches

  // A forward block in the middle of its call (the state read and written), its bounds in *store.
  stria::cuda::FwdParams ForwardParams(const stria::BlockMask& bm, std::unique_ptr<Dev>* store = nullptr) {
    stria::cuda::FwdParams p{};
    p.dims = Dims();
    p.q = Rows(q);
    p.k = k.p;
    p.v = v.p;
    p.acc = static_cast<float*>(acc.p);
    p.m = static_cast<float*>(m.p);
    p.l = static_cast<float*>(l.p);
    p.scale_log2 = stria::cuda::kLog2e / std::sqrt(static_cast<float>(D));
    p.mask = Mask(bm, busy_tiles, store);
    return p;
  }
  // key_rows: BwdParams::key_rows, the rows of a trimmed partial that the engine reads (0: all);
  // key_begin: BwdParams::key_begin (a home part's keys).
  stria::cuda::BwdParams BackwardParams(const stria::BlockMask& bm, int64_t key_rows, int64_t key_begin = 0,
                                        std::unique_ptr<Dev>* store = nullptr) {
    stria::cuda::BwdParams p{};
    p.dims = Dims();
    p.q = Rows(q);
    p.dout = Rows(dout);
    p.k = k.p;
    p.v = v.p;
    p.lse2 = static_cast<float*>(m.p);
    p.delta = static_cast<float*>(l.p);
    p.dq_acc = static_cast<float*>(dq.p);
    p.dk = static_cast<float*>(dkv.p);
    p.dv = static_cast<float*>(dkv.p) + B * L * H * D;
    p.scale = 1.f / std::sqrt(static_cast<float>(D));
    p.scale_log2 = p.scale * stria::cuda::kLog2e;
    p.mask = Mask(bm, false, store);
    p.key_rows = key_rows;
    p.key_begin = key_begin;
    return p;
  }

  double Forward(const stria::BlockMask& bm, stria::cuda::Kernels kernels = stria::cuda::Kernels::kMma) {
    if (bm.empty()) return 0.0;
    forward_rows = stria::cuda::ForwardTileRows(kernels, static_cast<int>(D));
    const stria::cuda::FwdParams p = ForwardParams(bm);
    if (p.mask.tiles != nullptr && p.mask.tile_count == 0) return 0.0;  // the backend launches nothing
    return TimeMs(stream, reps,
                  [&] { CHECK_CUDA(stria::cuda::LaunchForwardBlock(stria::cuda::Elem::kBF16, kernels, p, stream)); });
  }
  double Backward(const stria::BlockMask& bm, stria::cuda::Kernels kernels = stria::cuda::Kernels::kMma,
                  int64_t key_rows = 0, int64_t key_begin = 0) {
    if (bm.empty()) return 0.0;
    const stria::cuda::BwdParams p = BackwardParams(bm, key_rows, key_begin);
    return TimeMs(stream, reps, [&] {
      CHECK_CUDA(stria::cuda::LaunchBackwardBlock(stria::cuda::Elem::kBF16, kernels, false, p, stream));
    });
  }

  // A rank's call with a home part, as the backend queues it (src/backend/cuda, DetachesHome): the
  // ring's launches one after another on a stream of the device's greatest priority, the home
  // part's on one of its least, both from one start; the time until both are done (median of
  // reps). Without the transfers: each ring block's launch follows the previous one at once.
  template <typename Ring, typename Home>
  double Overlapped(Ring ring, Home home) {
    if (hi == nullptr) {
      int least = 0, greatest = 0;
      CHECK_CUDA(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      CHECK_CUDA(cudaStreamCreateWithPriority(&hi, cudaStreamNonBlocking, greatest));
      CHECK_CUDA(cudaStreamCreateWithPriority(&lo, cudaStreamNonBlocking, least));
    }
    cudaEvent_t start, lo_done, end;
    CHECK_CUDA(cudaEventCreate(&start));
    CHECK_CUDA(cudaEventCreate(&lo_done));
    CHECK_CUDA(cudaEventCreate(&end));
    std::vector<double> ms;
    for (int i = 0; i <= reps; ++i) {  // the first run warms up
      CHECK_CUDA(cudaEventRecord(start, hi));
      CHECK_CUDA(cudaStreamWaitEvent(lo, start, 0));
      ring(hi);
      home(lo);
      CHECK_CUDA(cudaEventRecord(lo_done, lo));
      CHECK_CUDA(cudaStreamWaitEvent(hi, lo_done, 0));
      CHECK_CUDA(cudaEventRecord(end, hi));
      CHECK_CUDA(cudaEventSynchronize(end));
      float t = 0;
      CHECK_CUDA(cudaEventElapsedTime(&t, start, end));
      if (i > 0) ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(lo_done);
    cudaEventDestroy(end);
    return Median(ms);
  }
  cudaStream_t hi = nullptr, lo = nullptr;  // Overlapped's streams
};

// Where a call's time goes, at the shapes of the kernel targets (causal, D 128): `call_ms`, a call
// alone between two events as the table times it (the host's work before its first kernel
// included); `loop_ms`, per call of kLoop calls queued back to back (the host's work hidden
// behind the previous call's kernels, as in a training step); `block_ms`, the family's block
// kernel alone on the whole causal block, as a ring step between the first and the last runs it.
// call - loop is the host's latency; loop - block is what the call adds to its kernel (or, where
// negative, what its first and last blocks save over a middle one). Only for a family named in
// STRIA_CUDA_KERNELS: the bench does not restate the library's default.
template <typename Fwd, typename Bwd>
void Split(const std::string& impl, int64_t S, int64_t B, int64_t H, int64_t D, int reps, double fwd_ms, double bwd_ms,
           Fwd forward, Bwd backward, cudaStream_t stream) {
  const char* env = std::getenv("STRIA_CUDA_KERNELS");
  stria::cuda::Kernels kernels;
  if (env == nullptr || !TensorCoreFamily(env, &kernels)) return;
  constexpr int kLoop = 4;
  BlockTimer block(S, H, D, reps, B);
  stria::BlockMask all;
  all.q_end = all.k_end = S;
  all.diagonal = true;
  for (int dir = 0; dir < 2; ++dir) {
    const double loop_ms = TimeMs(stream, reps,
                                  [&] {
                                    for (int i = 0; i < kLoop; ++i) dir == 0 ? forward() : backward();
                                  }) /
                           kLoop;
    const double block_ms = dir == 0 ? block.Forward(all, kernels) : block.Backward(all, kernels);
    std::printf(
        "split impl=%s dir=%s dim=%lld causal=1 len=%lld batch=%lld heads=%lld call_ms=%.4f loop_ms=%.4f "
        "block_ms=%.4f\n",
        impl.c_str(), dir == 0 ? "fwd" : "bwd", (long long)D, (long long)S, (long long)B, (long long)H,
        dir == 0 ? fwd_ms : bwd_ms, loop_ms, block_ms);
  }
}

int Kernels(const std::vector<int64_t>& dims, const std::vector<int64_t>& lens, int reps, bool deterministic) {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.device = DLDevice{kDLCUDA, 0};
  stria_context_t ctx;
  CHECK_STRIA(stria_context_create(&cfg, &ctx));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const DLDataType bf16{kDLBfloat, 16, 1}, f32{kDLFloat, 32, 1};
  // Every shape has H*D = 2048 and B*S = max(16k, S) tokens: one set of buffers for the largest.
  int64_t tokens = 0;
  for (int64_t S : lens) tokens = std::max(tokens, std::max<int64_t>(1, 16384 / S) * S);
  const size_t n = static_cast<size_t>(tokens) * 2048 * 2;
  Dev q(n), k(n), v(n), o(n, false), dout(n), dq(n, false), dk(n, false), dv(n, false);
  int64_t heads = 1;
  for (int64_t D : dims) heads = std::max(heads, 2048 / D);
  Dev lse(static_cast<size_t>(tokens * heads) * 4, false);                                   // B*H*S floats
  Dev sinks(static_cast<size_t>(heads) * 4), dsinks(static_cast<size_t>(heads) * 4, false);  // [H] floats
  // FP8 inputs (float8_e4m3fn q, k, v with descales) for the e4m3 forward, timed at D 128 where the
  // library takes them as they are: one byte per value.
  const char* family = std::getenv("STRIA_CUDA_KERNELS");
  const bool fp8 = std::find(dims.begin(), dims.end(), int64_t{128}) != dims.end() &&
                   (family == nullptr || *family == '\0' || std::string(family) == "tma");
  const size_t n8 = fp8 ? n / 2 : 1;
  Dev q8(n8, false), k8(n8, false), v8(n8, false), descales(static_cast<size_t>(heads + 2) * 4, false);
  if (fp8) {
    for (Dev* t : {&q8, &k8, &v8}) FillE4m3(t->p, n8);
    const std::vector<float> ds(static_cast<size_t>(heads + 2), 0.0625f);  // q's per head, then k's, v's
    CHECK_CUDA(cudaMemcpy(descales.p, ds.data(), ds.size() * 4, cudaMemcpyHostToDevice));
  }
  for (int64_t D : dims)
    for (int64_t S : lens)
      for (int causal : {0, 1}) {
        const int64_t B = std::max<int64_t>(1, 16384 / S), H = 2048 / D;
        int64_t shape[4] = {B, S, H, D}, lshape[3] = {B, H, S};
        DLTensor tq = View(q.p, shape, 4, bf16), tk = View(k.p, shape, 4, bf16), tv = View(v.p, shape, 4, bf16);
        DLTensor to = View(o.p, shape, 4, bf16), tdo = View(dout.p, shape, 4, bf16);
        DLTensor tdq = View(dq.p, shape, 4, bf16), tdk = View(dk.p, shape, 4, bf16), tdv = View(dv.p, shape, 4, bf16);
        DLTensor tl = View(lse.p, lshape, 3, f32);
        stria_attention_params_t p;
        stria_attention_params_init(&p);
        p.causal = causal;
        auto forward = [&] { CHECK_STRIA(stria_attention_forward(ctx, &p, &tq, &tk, &tv, &to, &tl, stream)); };
        auto backward = [&] {
          CHECK_STRIA(stria_attention_backward(ctx, &p, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv, stream));
        };
        const double fwd_ms = TimeMs(stream, reps, forward);
        const double bwd_ms = TimeMs(stream, reps, backward);
        const double flops = 4.0 * B * H * static_cast<double>(S) * S * D * (causal ? 0.5 : 1.0);
        // The kernel family: STRIA_CUDA_KERNELS, or "default" when unset (the library's choice for
        // this device, cuda_backend.cc; gpu_run.sh names each family it times), and the TMA
        // backward's dQ path when one is named (STRIA_CUDA_TMA_DQ: stria_tma_atomicdq), and the
        // TMA kernels' schedule (STRIA_CUDA_TMA_SCHEDULE: stria_tma_persistent), and the TMA
        // forward's query tile (STRIA_CUDA_TMA_FORWARD_ROWS: stria_tma_rows192), and the head groups'
        // budget (STRIA_CUDA_HEAD_GROUP_BYTES: stria_tma_headgroup0 without groups).
        const char* env = std::getenv("STRIA_CUDA_KERNELS");
        const char* dq = std::getenv("STRIA_CUDA_TMA_DQ");
        const std::string impl = std::string("stria_") + (env != nullptr && *env != '\0' ? env : "default") +
                                 (dq != nullptr && *dq != '\0' ? std::string("_") + dq + "dq" : "") +
                                 TmaScheduleSuffix() + TmaRowsSuffix() + HeadGroupSuffix();
        std::printf("impl=%s dir=fwd dim=%lld causal=%d len=%lld batch=%lld heads=%lld ms=%.4f tflops=%.1f\n",
                    impl.c_str(), (long long)D, causal, (long long)S, (long long)B, (long long)H, fwd_ms,
                    flops / fwd_ms * 1e-9);
        std::printf("impl=%s dir=bwd dim=%lld causal=%d len=%lld batch=%lld heads=%lld ms=%.4f tflops=%.1f\n",
                    impl.c_str(), (long long)D, causal, (long long)S, (long long)B, (long long)H, bwd_ms,
                    2.5 * flops / bwd_ms * 1e-9);
        if (D == 128 && causal && S >= 4096) Split(impl, S, B, H, D, reps, fwd_ms, bwd_ms, forward, backward, stream);
        if (fp8 && D == 128) {
          // The same forward on float8_e4m3fn q, k and v (per-head descales for q, one each for k
          // and v), out in bf16: the e4m3 TMA kernel (tma_forward_fp8.cuh).
          const DLDataType e4m3{STRIA_DL_FLOAT8_E4M3FN, 8, 1};
          DLTensor tq8 = View(q8.p, shape, 4, e4m3), tk8 = View(k8.p, shape, 4, e4m3), tv8 = View(v8.p, shape, 4, e4m3);
          int64_t qs_shape[1] = {H}, one[1] = {1};
          auto* ds = static_cast<float*>(descales.p);
          DLTensor tqs = View(ds, qs_shape, 1, f32), tks = View(ds + H, one, 1, f32),
                   tvs = View(ds + H + 1, one, 1, f32);
          stria_attention_params_t p8 = p;
          p8.q_descale = &tqs;
          p8.k_descale = &tks;
          p8.v_descale = &tvs;
          const double f8_ms = TimeMs(stream, reps, [&] {
            CHECK_STRIA(stria_attention_forward(ctx, &p8, &tq8, &tk8, &tv8, &to, &tl, stream));
          });
          std::printf("impl=stria_fp8 dir=fwd dim=%lld causal=%d len=%lld batch=%lld heads=%lld ms=%.4f tflops=%.1f\n",
                      (long long)D, causal, (long long)S, (long long)B, (long long)H, f8_ms, flops / f8_ms * 1e-9);
        }
        if (D == 128 && causal) {
          // Gemma 2's softcap (30) and gpt-oss's sinks (one logit per head, their gradient too),
          // each beside the plain call above: what the score modifications cost on this family.
          int64_t hshape[1] = {H};
          DLTensor tsinks = View(sinks.p, hshape, 1, f32), tdsinks = View(dsinks.p, hshape, 1, f32);
          for (int variant = 0; variant < 2; ++variant) {
            stria_attention_params_t m = p;
            if (variant == 0) {
              m.softcap = 30.f;
            } else {
              m.sinks = &tsinks;
              m.dsinks = &tdsinks;
            }
            const double f_ms = TimeMs(
                stream, reps, [&] { CHECK_STRIA(stria_attention_forward(ctx, &m, &tq, &tk, &tv, &to, &tl, stream)); });
            const double b_ms = TimeMs(stream, reps, [&] {
              CHECK_STRIA(stria_attention_backward(ctx, &m, &tq, &tk, &tv, &to, &tl, &tdo, &tdq, &tdk, &tdv, stream));
            });
            const char* name = variant == 0 ? "softcap30" : "sinks";
            std::printf("impl=%s_%s dir=fwd dim=%lld causal=%d len=%lld batch=%lld heads=%lld ms=%.4f tflops=%.1f\n",
                        impl.c_str(), name, (long long)D, causal, (long long)S, (long long)B, (long long)H, f_ms,
                        flops / f_ms * 1e-9);
            std::printf("impl=%s_%s dir=bwd dim=%lld causal=%d len=%lld batch=%lld heads=%lld ms=%.4f tflops=%.1f\n",
                        impl.c_str(), name, (long long)D, causal, (long long)S, (long long)B, (long long)H, b_ms,
                        2.5 * flops / b_ms * 1e-9);
          }
        }
        if (deterministic && (D == 128 || D == 256)) {
          // The deterministic backward, at the head dim of the bars and at Gemma's: what
          // reproducible dQ costs beside the default backward. As the library runs it (the TMA
          // family's one pass with ordered dQ adds, kernels/cuda/ordered_dq.cuh; elsewhere the
          // family's dK/dV pass, then a dQ pass), and on the TMA family at D 128 also with the dQ
          // pass (STRIA_CUDA_DETERMINISTIC_DQ=passes, _deterministic_passes) for comparison.
          // STRIA_CUDA_DETERMINISTIC_DQ=passes: only the dQ pass, labelled as such.
          const char* chosen = std::getenv("STRIA_CUDA_DETERMINISTIC_DQ");
          const bool passes_chosen = chosen != nullptr && strcasecmp(chosen, "passes") == 0;
          const bool two_ways = D == 128 && (env == nullptr || *env == '\0' || std::string(env) == "tma");
          auto time_deterministic = [&](const char* suffix) {
            const double det_ms = TimeMs(stream, reps, backward);
            std::printf(
                "impl=%s_deterministic%s dir=bwd dim=%lld causal=%d len=%lld batch=%lld heads=%lld ms=%.4f "
                "tflops=%.1f\n",
                impl.c_str(), suffix, (long long)D, causal, (long long)S, (long long)B, (long long)H, det_ms,
                2.5 * flops / det_ms * 1e-9);
          };
          CHECK_STRIA(stria_context_set_deterministic(ctx, 1));
          if (!(two_ways && passes_chosen)) time_deterministic("");
          if (two_ways && passes_chosen) time_deterministic("_passes");
          if (two_ways && (chosen == nullptr || *chosen == '\0')) {
            setenv("STRIA_CUDA_DETERMINISTIC_DQ", "passes", 1);
            time_deterministic("_passes");
            unsetenv("STRIA_CUDA_DETERMINISTIC_DQ");
          }
          CHECK_STRIA(stria_context_set_deterministic(ctx, 0));
        }
        std::fflush(stdout);
      }
  cudaStreamDestroy(stream);
  stria_context_destroy(ctx);
  return 0;
}

int Ring(int64_t S, int N, int64_t H, int64_t D, int reps, stria::cuda::Kernels kernels) {
  const int64_t L = S / N;
  const stria_layout_t layouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG};
  double latency[2][3] = {};
  {
    BlockTimer t(L, H, D, reps);
    for (int dir = 0; dir < 2; ++dir)
      for (int li = 0; li < 3; ++li) {
        std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int64_t>, double> seen;
        for (int step = 0; step < N; ++step) {
          double slowest = 0;
          for (int r = 0; r < N; ++r) {
            const stria::BlockMask bm = stria::ClassifyBlock(layouts[li], true, N, L, r, (r - step + N) % N);
            const auto key = std::make_tuple(bm.q_begin, bm.q_end, bm.k_begin, bm.k_end, bm.diagonal, bm.offset);
            auto it = seen.find(key);
            if (it == seen.end())
              it = seen.emplace(key, dir == 0 ? t.Forward(bm, kernels) : t.Backward(bm, kernels)).first;
            slowest = std::max(slowest, it->second);
          }
          latency[dir][li] += slowest;
        }
      }
  }
  // The ideal: one GPU running the whole causal sequence, divided by N.
  double single[2];
  {
    // One timed run after the warm-up: at 256k tokens (a causal forward is 2.8e14 FLOPs at H 16,
    // D 128) each run takes seconds, and three of each cost about 20 s of the GPU run per family.
    BlockTimer whole(S, H, D, 1);
    stria::BlockMask all;
    all.q_end = all.k_end = S;
    all.diagonal = true;
    single[0] = whole.Forward(all, kernels);
    single[1] = whole.Backward(all, kernels);
  }
  for (int dir = 0; dir < 2; ++dir)
    for (int li = 0; li < 3; ++li) {
      stria_balance_t bal;
      bal.struct_size = sizeof bal;
      CHECK_STRIA(stria_analyze_balance(layouts[li], 1, S, N, 64, &bal));
      stria_balance_t cont;
      cont.struct_size = sizeof cont;
      CHECK_STRIA(stria_analyze_balance(STRIA_LAYOUT_CONTIGUOUS, 1, S, N, 64, &cont));
      const double ideal = single[dir] / N;
      std::printf(
          "ring kernels=%s dir=%s layout=%s seq=%lld world=%d heads=%lld dim=%lld latency_ms=%.3f ideal_ms=%.3f "
          "of_ideal=%.3f vs_contiguous=%.3f analytic_vs_contiguous=%.3f single_gpu_ms=%.3f\n",
          FamilyLabel(kernels).c_str(), dir == 0 ? "fwd" : "bwd", stria::LayoutName(layouts[li]), (long long)S, N,
          (long long)H, (long long)D, latency[dir][li], ideal, ideal / latency[dir][li],
          latency[dir][0] / latency[dir][li], cont.ring_latency / bal.ring_latency, single[dir]);
    }
  return 0;
}

void CheckPlan(const stria::Status& st) {
  if (st.ok()) return;
  std::fprintf(stderr, "plan: %s\n", st.message().c_str());
  std::exit(1);
}

// A forward block's tiles (per head), as the kernels walk them at head dim 128: each query tile of
// kForwardTileRows rows takes the key tiles (of as many keys: the TMA forward's) from its first
// row's lowest visible key to its last row's highest (KeyTilesOf).
struct ForwardTiles {
  int64_t tiles = 0, busy_ctas = 0, longest = 0;
};
ForwardTiles CountForwardTiles(const std::vector<int64_t>& lo, const std::vector<int64_t>& hi) {
  constexpr int64_t kTile = stria::cuda::kForwardTileRows;
  const int64_t L = static_cast<int64_t>(lo.size());
  ForwardTiles t;
  for (int64_t i0 = 0; i0 < L; i0 += kTile) {
    const int64_t i1 = std::min(L, i0 + kTile), k_lo = lo[static_cast<size_t>(i0)],
                  k_hi = hi[static_cast<size_t>(i1 - 1)];
    if (k_hi <= k_lo) continue;
    const int64_t n = (k_hi - (k_lo / kTile) * kTile + kTile - 1) / kTile;
    t.tiles += n;
    t.busy_ctas += 1;
    t.longest = std::max(t.longest, n);
  }
  return t;
}

// The plan's ring with each rank's home part (its kept documents) apart from the ring, as the CUDA
// backend runs it (DetachesHome): the ring's blocks, their rows and keys below the rank's
// HomeBegin, chain across ranks step by step (the slowest rank's block at each step, as in Docs);
// each rank's home part runs beside its own blocks on a lower-priority stream. The modelled
// latency is the longer of the chain and the slowest rank's own blocks and home part overlapped
// (BlockTimer::Overlapped); both are lower bounds of the call's time, so the model leans
// optimistic where they are close.
void DocsHome(const stria::Plan& plan, int64_t H, int64_t D, int reps, stria::cuda::Kernels kernels,
              const std::string& dist, const double single[2]) {
  const int N = plan.world_size();
  const int64_t L = plan.local_len(), S = plan.seq_len();
  stria::MaskSpec causal;
  BlockTimer t(L, H, D, reps);
  t.forward_rows = stria::cuda::ForwardTileRows(kernels, static_cast<int>(D));  // its ForwardParams below
  std::vector<int64_t> lo(static_cast<size_t>(L)), hi(static_cast<size_t>(L));
  std::vector<int64_t> home(static_cast<size_t>(N));
  for (int r = 0; r < N; ++r) home[static_cast<size_t>(r)] = plan.HomeBegin(r, stria::kRowsKeyTile);
  // The ring's block of rank r at `step` (its rows below the home part's; at step 0 its keys too),
  // and its backward's key rows; false when nothing of it is visible.
  auto ring_block = [&](int r, int step, stria::BlockMask* bm, int64_t* key_rows) {
    const int holder = (r - step + N) % N;
    const int64_t h = home[static_cast<size_t>(r)];
    if (!plan.Bounds(0, r, holder, causal, lo.data(), hi.data())) return false;
    *bm = stria::BlockMask();
    bm->q_end = h;
    bm->k_end = step == 0 ? h : L;
    bm->doc_lo = lo.data();
    bm->doc_hi = hi.data();
    bm->doc_batch_stride = L;
    *key_rows = 0;
    if (step == 0) *key_rows = h;
    if (step > 0) plan.RowsStillNeeded(holder, 0, causal, key_rows);
    bool any = false;
    for (int64_t i = 0; i < h && !any; ++i) any = hi[static_cast<size_t>(i)] > lo[static_cast<size_t>(i)];
    return any;
  };
  double chain[2] = {0, 0}, slowest_rank[2] = {0, 0};
  for (int step = 0; step < N; ++step) {
    double slowest[2] = {0, 0};
    for (int r = 0; r < N; ++r) {
      stria::BlockMask bm;
      int64_t key_rows = 0;
      if (!ring_block(r, step, &bm, &key_rows)) continue;
      slowest[0] = std::max(slowest[0], t.Forward(bm, kernels));
      slowest[1] = std::max(slowest[1], t.Backward(bm, kernels, key_rows));
    }
    chain[0] += slowest[0];
    chain[1] += slowest[1];
  }
  for (int r = 0; r < N; ++r) {
    const int64_t h = home[static_cast<size_t>(r)];
    std::vector<stria::cuda::FwdParams> fwd;
    std::vector<stria::cuda::BwdParams> bwd;
    std::vector<std::unique_ptr<Dev>> stores(static_cast<size_t>(2 * N + 2));
    for (int step = 0; step < N; ++step) {
      stria::BlockMask bm;
      int64_t key_rows = 0;
      if (!ring_block(r, step, &bm, &key_rows)) continue;
      fwd.push_back(t.ForwardParams(bm, &stores[static_cast<size_t>(2 * step)]));
      if (fwd.back().mask.tiles != nullptr && fwd.back().mask.tile_count == 0) fwd.pop_back();
      bwd.push_back(t.BackwardParams(bm, key_rows, 0, &stores[static_cast<size_t>(2 * step + 1)]));
    }
    bool has_home = false;
    stria::cuda::FwdParams home_fwd{};
    stria::cuda::BwdParams home_bwd{};
    if (h < L && plan.Bounds(0, r, r, causal, lo.data(), hi.data())) {
      stria::BlockMask bm;
      bm.q_begin = bm.k_begin = h;
      bm.q_end = bm.k_end = L;
      bm.doc_lo = lo.data();
      bm.doc_hi = hi.data();
      bm.doc_batch_stride = L;
      home_fwd = t.ForwardParams(bm, &stores[static_cast<size_t>(2 * N)]);
      home_bwd = t.BackwardParams(bm, 0, h, &stores[static_cast<size_t>(2 * N + 1)]);
      has_home = true;
    }
    double rank_ms[2];
    for (int dir = 0; dir < 2; ++dir) {
      rank_ms[dir] = t.Overlapped(
          [&](cudaStream_t st) {
            if (dir == 0)
              for (const auto& p : fwd)
                CHECK_CUDA(stria::cuda::LaunchForwardBlock(stria::cuda::Elem::kBF16, kernels, p, st));
            else
              for (const auto& p : bwd)
                CHECK_CUDA(stria::cuda::LaunchBackwardBlock(stria::cuda::Elem::kBF16, kernels, false, p, st));
          },
          [&](cudaStream_t st) {
            if (!has_home) return;
            if (dir == 0)
              CHECK_CUDA(stria::cuda::LaunchForwardBlock(stria::cuda::Elem::kBF16, kernels, home_fwd, st));
            else
              CHECK_CUDA(stria::cuda::LaunchBackwardBlock(stria::cuda::Elem::kBF16, kernels, false, home_bwd, st));
          });
      slowest_rank[dir] = std::max(slowest_rank[dir], rank_ms[dir]);
    }
    std::printf(
        "docs_home kernels=%s dist=%s seq=%lld world=%d rank=%d home_begin=%lld local_len=%lld fwd_ms=%.4f "
        "bwd_ms=%.4f\n",
        FamilyLabel(kernels).c_str(), dist.c_str(), (long long)S, N, r, (long long)h, (long long)L, rank_ms[0],
        rank_ms[1]);
  }
  for (int dir = 0; dir < 2; ++dir) {
    const double latency = std::max(chain[dir], slowest_rank[dir]);
    std::printf(
        "docs kernels=%s dir=%s who=plan_home dist=%s seq=%lld world=%d heads=%lld dim=%lld local_len=%lld "
        "latency_ms=%.3f ideal_ms=%.3f of_ideal=%.3f chain_ms=%.3f slowest_rank_ms=%.3f single_gpu_ms=%.3f\n",
        FamilyLabel(kernels).c_str(), dir == 0 ? "fwd" : "bwd", dist.c_str(), (long long)S, N, (long long)H,
        (long long)D, (long long)L, latency, single[dir] / N, single[dir] / N / latency, chain[dir], slowest_rank[dir],
        single[dir]);
  }
}

// The modelled ring of a plan and of each fixed layout on one row of packed documents.
int Docs(int64_t S, int N, int64_t H, int64_t D, int reps, stria::cuda::Kernels kernels, const std::string& dist,
         uint64_t seed) {
  const std::vector<int64_t> cu = stria_bench::DocumentBoundaries(dist, S, seed);
  if (cu.size() < 2) {
    std::fprintf(stderr, "--dist %s: use lognormal, fewlong, uniform or single\n", dist.c_str());
    return 2;
  }
  const int64_t docs = static_cast<int64_t>(cu.size()) - 1;
  struct Who {
    const char* name;
    stria::Plan::Strategy strategy;
    stria_layout_t layout;
    bool busy_tiles;  // forward launches over the query tiles with work only, as the backend's
  };
  // plan_all_tiles: the plan's forward with a CTA for every query tile, beside the plan's own.
  const Who who[] = {{"plan", stria::Plan::Strategy::kBalanced, STRIA_LAYOUT_STRIPED, true},
                     {"plan_all_tiles", stria::Plan::Strategy::kBalanced, STRIA_LAYOUT_STRIPED, false},
                     {"striped", stria::Plan::Strategy::kLayout, STRIA_LAYOUT_STRIPED, true},
                     {"zigzag", stria::Plan::Strategy::kLayout, STRIA_LAYOUT_ZIGZAG, true},
                     {"contiguous", stria::Plan::Strategy::kLayout, STRIA_LAYOUT_CONTIGUOUS, true}};
  stria::MaskSpec causal;
  // The ideal: one GPU on the whole packed sequence with its document mask (a plan of one rank
  // keeps every document whole, in order), over N.
  double single[2];
  {
    stria::Plan::Options one;
    one.strategy = stria::Plan::Strategy::kLayout;
    one.layout = STRIA_LAYOUT_CONTIGUOUS;
    std::unique_ptr<stria::Plan> whole;
    CheckPlan(stria::Plan::Create(cu.data(), 1, docs, S, one, &whole));
    std::vector<int64_t> lo(static_cast<size_t>(S)), hi(static_cast<size_t>(S));
    whole->Bounds(0, 0, 0, causal, lo.data(), hi.data());
    stria::BlockMask all;
    all.q_end = all.k_end = S;
    all.doc_lo = lo.data();
    all.doc_hi = hi.data();
    all.doc_batch_stride = S;
    BlockTimer t(S, H, D, 1);
    single[0] = t.Forward(all, kernels);
    single[1] = t.Backward(all, kernels);
  }
  for (const Who& w : who) {
    if (w.strategy == stria::Plan::Strategy::kLayout && S % (2 * N) != 0) continue;
    stria::Plan::Options o;
    o.world_size = N;
    o.strategy = w.strategy;
    o.layout = w.layout;
    std::unique_ptr<stria::Plan> plan;
    CheckPlan(stria::Plan::Create(cu.data(), 1, docs, S, o, &plan));
    const int64_t L = plan->local_len();
    BlockTimer t(L, H, D, reps);
    std::vector<int64_t> lo(static_cast<size_t>(L)), hi(static_cast<size_t>(L));
    // A block in which no query sees a key, launched over every tile: every CTA idles. What a step
    // costs beyond its tiles' work starts here (the launch, and a CTA per query or key tile that
    // finds nothing to do; the backend's forward launches no such block).
    t.busy_tiles = false;
    {
      std::fill(lo.begin(), lo.end(), 0);
      std::fill(hi.begin(), hi.end(), 0);
      stria::BlockMask idle;
      idle.q_end = idle.k_end = L;
      idle.doc_lo = lo.data();
      idle.doc_hi = hi.data();
      idle.doc_batch_stride = L;
      std::printf("docs_idle kernels=%s who=%s seq=%lld world=%d local_len=%lld fwd_ms=%.4f bwd_ms=%.4f\n",
                  FamilyLabel(kernels).c_str(), w.name, (long long)S, N, (long long)L, t.Forward(idle, kernels),
                  t.Backward(idle, kernels));
    }
    t.busy_tiles = w.busy_tiles;
    double latency[2] = {0, 0};
    for (int step = 0; step < N; ++step) {
      double slowest[2] = {0, 0}, sum[2] = {0, 0};
      int ranks = 0;
      ForwardTiles busiest;  // of the rank whose forward is slowest at this step
      for (int r = 0; r < N; ++r) {
        const int holder = (r - step + N) % N;
        if (!plan->Bounds(0, r, holder, causal, lo.data(), hi.data())) continue;
        stria::BlockMask bm;
        bm.q_end = bm.k_end = L;
        bm.doc_lo = lo.data();
        bm.doc_hi = hi.data();
        bm.doc_batch_stride = L;
        // A plan's call trims a block's dK/dV partial after its owner to the rows other ranks see,
        // and launches the backward over their key tiles only (BackwardStep::dkv_rows).
        int64_t key_rows = 0;
        if (w.strategy == stria::Plan::Strategy::kBalanced && step > 0)
          plan->RowsStillNeeded(holder, 0, causal, &key_rows);
        const double f = t.Forward(bm, kernels), b = t.Backward(bm, kernels, key_rows);
        if (f > slowest[0]) busiest = CountForwardTiles(lo, hi);
        slowest[0] = std::max(slowest[0], f);
        slowest[1] = std::max(slowest[1], b);
        sum[0] += f;
        sum[1] += b;
        ++ranks;
      }
      latency[0] += slowest[0];
      latency[1] += slowest[1];
      // Where a step's time goes: its slowest rank against the mean of those with work, and the
      // slowest forward's tiles (per head: all of them, the CTAs that have any, the longest CTA's).
      if (ranks > 0)
        std::printf(
            "docs_step kernels=%s who=%s dist=%s seq=%lld world=%d step=%d ranks=%d fwd_ms=%.4f fwd_mean_ms=%.4f "
            "bwd_ms=%.4f bwd_mean_ms=%.4f tiles=%lld busy_ctas=%lld longest_cta=%lld\n",
            FamilyLabel(kernels).c_str(), w.name, dist.c_str(), (long long)S, N, step, ranks, slowest[0],
            sum[0] / ranks, slowest[1], sum[1] / ranks, (long long)busiest.tiles, (long long)busiest.busy_ctas,
            (long long)busiest.longest);
    }
    for (int dir = 0; dir < 2; ++dir)
      std::printf(
          "docs kernels=%s dir=%s who=%s dist=%s seq=%lld world=%d heads=%lld dim=%lld documents=%lld local_len=%lld "
          "latency_ms=%.3f ideal_ms=%.3f of_ideal=%.3f single_gpu_ms=%.3f\n",
          FamilyLabel(kernels).c_str(), dir == 0 ? "fwd" : "bwd", w.name, dist.c_str(), (long long)S, N, (long long)H,
          (long long)D, (long long)docs, (long long)L, latency[dir], single[dir] / N, single[dir] / N / latency[dir],
          single[dir]);
    // The backend runs a home part apart on every tensor-core schedule but the persistent one (its
    // grid would hold every SM), which keeps the block whole: the plan's lines above.
    const bool persistent = kernels == stria::cuda::Kernels::kTma && !TmaScheduleSuffix().empty();
    if (std::string(w.name) == "plan" && !persistent) DocsHome(*plan, H, D, reps, kernels, dist, single);
  }
  return 0;
}

// Per block length: the step's kernel time against its transfer time on each link.
int Hide(const std::vector<int64_t>& lens, int64_t H, int64_t D, int reps, stria::cuda::Kernels kernels,
         double nvlink_gbs, double ib_gbs) {
  struct Step {
    const char* name;
    stria_layout_t layout;
    int q_rank, k_rank;  // of 8 ranks
  };
  // Rank 0 holding rank 1's block: striped, j <= i - 1 (about half); contiguous, a whole block.
  const Step steps[] = {{"striped", STRIA_LAYOUT_STRIPED, 0, 1}, {"dense", STRIA_LAYOUT_CONTIGUOUS, 1, 0}};
  const double links[2] = {nvlink_gbs * 1e9, ib_gbs * 1e9};
  const char* link_names[2] = {"nvlink", "ib"};
  for (int dir = 0; dir < 2; ++dir)
    for (const Step& st : steps) {
      int64_t smallest[2] = {-1, -1};
      for (int64_t L : lens) {
        BlockTimer t(L, H, D, reps);
        const stria::BlockMask bm = stria::ClassifyBlock(st.layout, true, 8, L, st.q_rank, st.k_rank);
        const double ms = dir == 0 ? t.Forward(bm, kernels) : t.Backward(bm, kernels);
        const double kv = 2.0 * L * H * D * 2, bytes = dir == 0 ? kv : kv + 2.0 * L * H * D * 4;
        double link_ms[2];
        for (int k = 0; k < 2; ++k) {
          link_ms[k] = bytes / links[k] * 1e3;
          if (smallest[k] < 0 && link_ms[k] <= ms) smallest[k] = L;
        }
        std::printf(
            "hide kernels=%s dir=%s step=%s len=%lld heads=%lld dim=%lld compute_ms=%.4f bytes=%.0f nvlink_ms=%.4f "
            "ib_ms=%.4f hides_nvlink=%d hides_ib=%d\n",
            FamilyLabel(kernels).c_str(), dir == 0 ? "fwd" : "bwd", st.name, (long long)L, (long long)H, (long long)D,
            ms, bytes, link_ms[0], link_ms[1], link_ms[0] <= ms ? 1 : 0, link_ms[1] <= ms ? 1 : 0);
      }
      for (int k = 0; k < 2; ++k)
        std::printf("hide_threshold kernels=%s dir=%s step=%s link=%s gbs=%.0f smallest_hiding_len=%lld\n",
                    FamilyLabel(kernels).c_str(), dir == 0 ? "fwd" : "bwd", st.name, link_names[k], links[k] * 1e-9,
                    (long long)smallest[k]);
    }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line into a pipe too: a run that a time limit stops keeps every line it printed whole.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s kernels|ring|docs|hide [options]\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  std::vector<int64_t> dims{64, 128}, lens{1024, 2048, 4096, 8192, 16384, 32768};
  int64_t seq = 262144, heads = 16, dim = 128;
  int world = 8, reps = 10;
  bool deterministic = true;
  double nvlink_gbs = 450, ib_gbs = 50;
  stria::cuda::Kernels kernels = stria::cuda::Kernels::kMma;
  std::string dist = "lognormal";
  uint64_t seed = 1;
  bool seq_given = false;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--dims")
      dims = ParseList(argv[i + 1]);
    else if (k == "--lens")
      lens = ParseList(argv[i + 1]);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (k == "--seq")
      seq = std::atoll(argv[i + 1]), seq_given = true;
    else if (k == "--dist")
      dist = argv[i + 1];
    else if (k == "--seed")
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    else if (k == "--world")
      world = std::atoi(argv[i + 1]);
    else if (k == "--heads")
      heads = std::atoll(argv[i + 1]);
    else if (k == "--dim")
      dim = std::atoll(argv[i + 1]);
    else if (k == "--nvlink-gbs")
      nvlink_gbs = std::atof(argv[i + 1]);
    else if (k == "--ib-gbs")
      ib_gbs = std::atof(argv[i + 1]);
    else if (k == "--deterministic")  // kernels mode: 0 leaves the deterministic backward untimed
      deterministic = std::atoi(argv[i + 1]) != 0;
    else if (k == "--kernels") {  // the ring model's kernel family: mma, or wgmma or tma (sm_90 only)
      if (!TensorCoreFamily(argv[i + 1], &kernels)) {
        std::fprintf(stderr, "--kernels %s: use mma, wgmma or tma\n", argv[i + 1]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  for (int64_t D : dims)
    if (D <= 0 || 2048 % D != 0) {  // the kernels mode keeps H*D = 2048
      std::fprintf(stderr, "--dims: %lld does not divide 2048\n", static_cast<long long>(D));
      return 2;
    }
  if (lens.empty() || dims.empty() || *std::min_element(lens.begin(), lens.end()) <= 0 || reps <= 0) {
    std::fprintf(stderr, "--lens, --dims and --reps take positive numbers\n");
    return 2;
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "stria-cuda-bench: no GPU here\n");
    return 3;
  }
  if (mode == "kernels") return Kernels(dims, lens, reps, deterministic);
  int rc = 2;
  if (mode == "ring") rc = Ring(seq, world, heads, dim, reps, kernels);
  if (mode == "hide") rc = Hide(lens, heads, dim, reps, kernels, nvlink_gbs, ib_gbs);
  if (mode == "docs") rc = Docs(seq_given ? seq : 32768, world, heads, dim, reps, kernels, dist, seed);
  if (mode == "ring" || mode == "hide" || mode == "docs") {
    // Blocks of the TMA family that fell back to cp.async: their times are not TMA's.
    if (kernels == stria::cuda::Kernels::kTma)
      std::printf("tma_map_failures=%llu\n", static_cast<unsigned long long>(stria::cuda::TmaMapFailures()));
    return rc;
  }
  std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
  return 2;
}
