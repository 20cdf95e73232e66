// Dispatch from run-time (dtype, head dim, path) to the kernel instantiations, grid sizes, and the
// SIMT and elementwise kernels (instantiated here).
#include <cuda_runtime.h>
#include <strings.h>

#include <algorithm>
#include <cstdlib>

#include "cuda/elementwise.cuh"
#include "cuda/fp8_launch.h"
#include "cuda/kernel_matrix.h"
#include "cuda/launch.h"
#include "cuda/smem_optin.cuh"
#include "cuda/tma_schedule.h"
#include "cuda/widen.h"

namespace stria {
namespace cuda {

#define STRIA_KERNEL(unit, family, pass, dtype) STRIA_KERNEL_DECLARE(family, pass, dtype)
#include "cuda/kernel_matrix.def"
#undef STRIA_KERNEL

const char* KernelsName(Kernels k) {
  switch (k) {
    case Kernels::kSimt:
      return "simt";
    case Kernels::kMma:
      return "mma";
    case Kernels::kWgmma:
      return "wgmma";
    case Kernels::kTma:
      return "tma";
  }
  return "?";
}

int ForwardTileRows(Kernels k, int D) {
  int rows = kForwardTileRows;
  if (k == Kernels::kTma && !TmaForwardRows(D, &rows)) rows = kForwardTileRows;  // the launch will refuse
  return rows;
}

bool TensorCoreHeadDim(int D) {
  return IsKernelHeadDim(D);
}

namespace {

// The tensor-core entry points by (family, pass, dtype): the dispatch table of kernel_matrix.def.
using ForwardEntry = cudaError_t (*)(int, const FwdParams&, cudaStream_t);
using BackwardEntry = cudaError_t (*)(int, const BwdParams&, cudaStream_t);
struct Entry {
  Kernels family;
  Pass pass;
  Elem elem;
  ForwardEntry forward;    // of a Forward entry
  BackwardEntry backward;  // of the others
};
constexpr Entry MakeEntry(Kernels k, Pass p, Elem e, ForwardEntry f) {
  return Entry{k, p, e, f, nullptr};
}
constexpr Entry MakeEntry(Kernels k, Pass p, Elem e, BackwardEntry b) {
  return Entry{k, p, e, nullptr, b};
}
constexpr Entry kMatrix[] = {
#define STRIA_KERNEL(unit, family, pass, dtype) \
  MakeEntry(Kernels::k##family, Pass::k##pass, Elem::k##dtype, &STRIA_KERNEL_NAME(family, pass, dtype)),
#include "cuda/kernel_matrix.def"
#undef STRIA_KERNEL
};
// The entry built for head dim D, or nullptr where the matrix has none (float32, SIMT, a head dim
// the entries lack: the SIMT kernels run those).
const Entry* FindEntry(Kernels k, Pass p, Elem e, int D) {
  if (!IsKernelHeadDim(D)) return nullptr;
  for (const Entry& x : kMatrix)
    if (x.family == k && x.pass == p && x.elem == e) return &x;
  return nullptr;
}

// Grids of the elementwise kernels: enough blocks to fill the GPU, grid-stride beyond that.
dim3 ElementGrid(int64_t n) {
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  return dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1)));
}
// Grids of the row kernels (STRIA_FOR_EACH_ROW): blocks of 256 threads, a warp per row.
dim3 RowGrid(int64_t rows) {
  return dim3(static_cast<unsigned>(std::max<int64_t>(std::min<int64_t>((rows + 7) / 8, 8192), 1)));
}

// Each kernel in two builds, with the document clamp and without it (mma_launch.cuh), and in two
// by the head dims it holds (simt_attention.cuh): the narrow one up to 256, the wide one above.
template <typename T, int kMaxD>
cudaError_t SimtForwardAt(const FwdParams& p, cudaStream_t s) {
  const int bytes = SimtForwardSmemFloats(p.dims.D) * 4;
  void (*kernel)(FwdParams) =
      p.mask.doc_lo != nullptr ? SimtForwardKernel<T, true, kMaxD> : SimtForwardKernel<T, false, kMaxD>;
  cudaError_t e = AllowSmem(kernel, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(QueryTileCount(p.mask, kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, 128, bytes, s)(p);
}

template <typename T>
cudaError_t SimtForward(const FwdParams& p, cudaStream_t s) {
  return p.dims.D <= kSimtNarrowD ? SimtForwardAt<T, kSimtNarrowD>(p, s) : SimtForwardAt<T, kSimtWideD>(p, s);
}

template <typename T, int kMaxD>
cudaError_t SimtBackwardAt(const BwdParams& p, cudaStream_t s) {
  const bool docs = p.mask.doc_lo != nullptr;
  void (*dq_kernel)(BwdParams) = docs ? SimtBackwardDqKernel<T, true, kMaxD> : SimtBackwardDqKernel<T, false, kMaxD>;
  void (*dkv_kernel)(BwdParams) = docs ? SimtBackwardDkvKernel<T, true, kMaxD> : SimtBackwardDkvKernel<T, false, kMaxD>;
  const int dq_bytes = SimtDqSmemFloats(p.dims.D) * 4, dkv_bytes = SimtDkvSmemFloats(p.dims.D) * 4;
  cudaError_t e = AllowSmem(dq_kernel, dq_bytes);
  if (e == cudaSuccess) e = AllowSmem(dkv_kernel, dkv_bytes);
  if (e != cudaSuccess) return e;
  const dim3 dq_grid(QueryTileCount(p.mask, kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  e = STRIA_LAUNCH(dq_kernel, dq_grid, 128, dq_bytes, s)(p);
  if (e != cudaSuccess) return e;
  const dim3 dkv_grid(KeyTileCount(p, kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hkv));
  if (dkv_grid.x == 0) return cudaSuccess;
  return STRIA_LAUNCH(dkv_kernel, dkv_grid, 128, dkv_bytes, s)(p);
}

template <typename T>
cudaError_t SimtBackward(const BwdParams& p, cudaStream_t s) {
  return p.dims.D <= kSimtNarrowD ? SimtBackwardAt<T, kSimtNarrowD>(p, s) : SimtBackwardAt<T, kSimtWideD>(p, s);
}

// How a deterministic backward computes dQ where the family has both ways: STRIA_CUDA_DETERMINISTIC_DQ
// unset, "" or "ordered" (one pass, its adds in the order of the key tiles: ordered_dq.cuh) or
// "passes" (a dQ pass of its own), read at every launch. False for any other value.
bool OrderedDq(bool* ordered) {
  const char* env = std::getenv("STRIA_CUDA_DETERMINISTIC_DQ");
  *ordered = env == nullptr || *env == '\0' || strcasecmp(env, "ordered") == 0;
  return *ordered || strcasecmp(env, "passes") == 0;
}

}  // namespace

static_assert(kSimtWideD == kMaxHeadDim && kSimtNarrowD == kNarrowHeadDim, "launch.h names the SIMT builds' widths");

int SimtSharedMemoryBytes(int D) {
  return SimtSmemBytes(D);
}

cudaError_t LaunchForwardBlock(Elem e, Kernels k, const FwdParams& p, cudaStream_t s) {
  if (const Entry* x = FindEntry(k, Pass::kForward, e, p.dims.D)) return x->forward(p.dims.D, p, s);
  switch (e) {
    case Elem::kF32:
      return SimtForward<Float>(p, s);
    case Elem::kF16:
      return SimtForward<Half>(p, s);
    case Elem::kBF16:
      return SimtForward<BFloat>(p, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBackwardBlock(Elem e, Kernels k, bool deterministic, const BwdParams& p, cudaStream_t s) {
  if (deterministic) {
    // The family's one-pass ordered dQ where it has one and it is chosen (it takes the two passes
    // itself where its kernel cannot run). Otherwise a tensor-core family's dK/dV pass without dQ,
    // then a dQ pass over the query tiles: the Hopper families' on wgmma (wgmma_backward_dq.cuh),
    // mma.sync's elsewhere (mma_backward_dq.cuh). The SIMT kernels give the same bits every run as
    // they are, and run the head dims without those passes (never the family's Backward entry: its
    // dQ atomics add in any order).
    bool ordered = false;
    if (!OrderedDq(&ordered)) return cudaErrorInvalidValue;
    if (const Entry* x = ordered ? FindEntry(k, Pass::kBackwardOrdered, e, p.dims.D) : nullptr)
      return x->backward(p.dims.D, p, s);
    const Entry* kv = FindEntry(k, Pass::kBackwardKv, e, p.dims.D);
    const Entry* dq = FindEntry(k == Kernels::kTma ? Kernels::kWgmma : k, Pass::kBackwardDq, e, p.dims.D);
    if (kv != nullptr && dq != nullptr) {
      const cudaError_t err = kv->backward(p.dims.D, p, s);
      return err != cudaSuccess ? err : dq->backward(p.dims.D, p, s);
    }
  } else if (const Entry* x = FindEntry(k, Pass::kBackward, e, p.dims.D)) {
    return x->backward(p.dims.D, p, s);
  }
  switch (e) {
    case Elem::kF32:
      return SimtBackward<Float>(p, s);
    case Elem::kF16:
      return SimtBackward<Half>(p, s);
    case Elem::kBF16:
      return SimtBackward<BFloat>(p, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchPackRows(int elem_bytes, Dims d, int H, RowsArg src, void* dst, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.L * H, n = rows * d.D;
  if (n == 0) return cudaSuccess;
  // A view already laid out as the message is one copy.
  if (CompactRows(src, d, H))
    return cudaMemcpyAsync(dst, src.data, static_cast<size_t>(n) * elem_bytes, cudaMemcpyDeviceToDevice, s);
  if (elem_bytes == 4) return STRIA_LAUNCH(PackRowsKernel<4>, RowGrid(rows), 256, 0, s)(d, H, src, dst);
  return STRIA_LAUNCH(PackRowsKernel<2>, RowGrid(rows), 256, 0, s)(d, H, src, dst);
}

cudaError_t LaunchFill(float* p, int64_t n, float v, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return STRIA_LAUNCH(FillKernel, ElementGrid(n), 256, 0, s)(p, n, v);
}

cudaError_t LaunchAccumulate(float* dst, const float* src, int64_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  return STRIA_LAUNCH(AccumulateKernel, ElementGrid(n), 256, 0, s)(dst, src, n);
}

cudaError_t LaunchForwardFinish(Elem e, Dims d, const float* acc, const float* m, const float* l, RowsOut out,
                                float* lse, int64_t lb, int64_t lh, int64_t li, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.Hq * d.L;
  if (rows * d.D == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(ForwardFinishKernel<Float>, g, 256, 0, s)(d, acc, m, l, out, lse, lb, lh, li);
    case Elem::kF16:
      return STRIA_LAUNCH(ForwardFinishKernel<Half>, g, 256, 0, s)(d, acc, m, l, out, lse, lb, lh, li);
    case Elem::kBF16:
      return STRIA_LAUNCH(ForwardFinishKernel<BFloat>, g, 256, 0, s)(d, acc, m, l, out, lse, lb, lh, li);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBackwardPrep(Elem e, Dims d, RowsArg out, RowsArg dout, const float* lse, int64_t lb, int64_t lh,
                               int64_t li, float* lse2, float* delta, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.Hq * d.L;
  if (rows == 0) return cudaSuccess;
  const dim3 g(static_cast<unsigned>(std::min<int64_t>((rows + 7) / 8, 8192)));
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(BackwardPrepKernel<Float>, g, 256, 0, s)(d, out, dout, lse, lb, lh, li, lse2, delta);
    case Elem::kF16:
      return STRIA_LAUNCH(BackwardPrepKernel<Half>, g, 256, 0, s)(d, out, dout, lse, lb, lh, li, lse2, delta);
    case Elem::kBF16:
      return STRIA_LAUNCH(BackwardPrepKernel<BFloat>, g, 256, 0, s)(d, out, dout, lse, lb, lh, li, lse2, delta);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSinksForward(Elem e, Dims d, const float* sinks, RowsOut out, float* lse, int64_t lb, int64_t lh,
                               int64_t li, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.Hq * d.L;
  if (rows == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(SinksForwardKernel<Float>, g, 256, 0, s)(d, sinks, out, lse, lb, lh, li);
    case Elem::kF16:
      return STRIA_LAUNCH(SinksForwardKernel<Half>, g, 256, 0, s)(d, sinks, out, lse, lb, lh, li);
    case Elem::kBF16:
      return STRIA_LAUNCH(SinksForwardKernel<BFloat>, g, 256, 0, s)(d, sinks, out, lse, lb, lh, li);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchSinksGrad(Dims d, const float* sinks, const float* lse2, const float* delta, float* dsinks,
                            int64_t ds, cudaStream_t s) {
  if (d.Hq == 0) return cudaSuccess;
  return STRIA_LAUNCH(SinksGradKernel, dim3(static_cast<unsigned>(d.Hq)), 32, 0, s)(d, sinks, lse2, delta, dsinks, ds);
}

cudaError_t LaunchDqFinish(Elem e, Dims d, const float* dq_acc, float scale, RowsOut dq, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.Hq * d.L;
  if (rows * d.D == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(DqFinishKernel<Float>, g, 256, 0, s)(d, dq_acc, scale, dq);
    case Elem::kF16:
      return STRIA_LAUNCH(DqFinishKernel<Half>, g, 256, 0, s)(d, dq_acc, scale, dq);
    case Elem::kBF16:
      return STRIA_LAUNCH(DqFinishKernel<BFloat>, g, 256, 0, s)(d, dq_acc, scale, dq);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchBoxSum(Elem e, const BoxArgs& a, cudaStream_t s) {
  const int64_t rows = a.n0 * a.n1 * a.n2;
  if (rows * a.w == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(BoxSumKernel<Float>, g, 256, 0, s)(a);
    case Elem::kF16:
      return STRIA_LAUNCH(BoxSumKernel<Half>, g, 256, 0, s)(a);
    case Elem::kBF16:
      return STRIA_LAUNCH(BoxSumKernel<BFloat>, g, 256, 0, s)(a);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchWidenFp8(Elem e, const WidenArgs& a, cudaStream_t s) {
  const int64_t rows = a.n0 * a.n1 * a.n2;
  if (rows * a.w == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(WidenFp8Kernel<Float>, g, 256, 0, s)(a);
    case Elem::kF16:
      return STRIA_LAUNCH(WidenFp8Kernel<Half>, g, 256, 0, s)(a);
    case Elem::kBF16:
      return STRIA_LAUNCH(WidenFp8Kernel<BFloat>, g, 256, 0, s)(a);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchScaleRowsByHead(Elem e, const Dims& d, Descale v, RowsOut out, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.L * d.Hq;
  if (v.data == nullptr || rows * d.D == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(ScaleRowsByHeadKernel<Float>, g, 256, 0, s)(d, v.data, v.step, out);
    case Elem::kF16:
      return STRIA_LAUNCH(ScaleRowsByHeadKernel<Half>, g, 256, 0, s)(d, v.data, v.step, out);
    case Elem::kBF16:
      return STRIA_LAUNCH(ScaleRowsByHeadKernel<BFloat>, g, 256, 0, s)(d, v.data, v.step, out);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchKvGradFinish(Elem e, Dims d, const float* src, RowsOut dst, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.L * d.Hkv;
  if (rows * d.D == 0) return cudaSuccess;
  const dim3 g = RowGrid(rows);
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(KvGradFinishKernel<Float>, g, 256, 0, s)(d, src, dst);
    case Elem::kF16:
      return STRIA_LAUNCH(KvGradFinishKernel<Half>, g, 256, 0, s)(d, src, dst);
    case Elem::kBF16:
      return STRIA_LAUNCH(KvGradFinishKernel<BFloat>, g, 256, 0, s)(d, src, dst);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchShard(const ShardArgs& a, cudaStream_t s) {
  int64_t n = 1;
  for (int k = 0; k < a.ndim; ++k) n *= a.shape[k];
  if (n == 0) return cudaSuccess;
  return STRIA_LAUNCH(ShardKernel, ElementGrid(n), 256, 0, s)(a);
}

}  // namespace cuda
}  // namespace stria
