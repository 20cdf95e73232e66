// Dispatch from run-time (dtype, head dim, path) to the kernel instantiations, grid sizes, and the
// SIMT and elementwise kernels (instantiated here).
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/elementwise.cuh"
#include "cuda/launch.h"
#include "cuda/smem_optin.cuh"

namespace stria {
namespace cuda {

cudaError_t MmaForwardF16(int D, const FwdParams& p, cudaStream_t s);
cudaError_t MmaForwardBF16(int D, const FwdParams& p, cudaStream_t s);
cudaError_t MmaBackwardF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t MmaBackwardBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t MmaBackwardKvF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t MmaBackwardKvBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t MmaBackwardDqF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t MmaBackwardDqBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaForwardF16(int D, const FwdParams& p, cudaStream_t s);
cudaError_t WgmmaForwardBF16(int D, const FwdParams& p, cudaStream_t s);
cudaError_t TmaForwardF16(int D, const FwdParams& p, cudaStream_t s);
cudaError_t TmaForwardBF16(int D, const FwdParams& p, cudaStream_t s);
cudaError_t TmaBackwardF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t TmaBackwardBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaBackwardF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaBackwardBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaBackwardKvF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaBackwardKvBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaBackwardDqF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t WgmmaBackwardDqBF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t TmaBackwardKvF16(int D, const BwdParams& p, cudaStream_t s);
cudaError_t TmaBackwardKvBF16(int D, const BwdParams& p, cudaStream_t s);

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

bool TensorCoreHeadDim(int D) {
  return D == 64 || D == 128;
}

namespace {

// Grids of the elementwise kernels: enough blocks to fill the GPU, grid-stride beyond that.
dim3 ElementGrid(int64_t n) {
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 8192);
  return dim3(static_cast<unsigned>(std::max<int64_t>(blocks, 1)));
}
// Grids of the row kernels (STRIA_FOR_EACH_ROW): blocks of 256 threads, a warp per row.
dim3 RowGrid(int64_t rows) {
  return dim3(static_cast<unsigned>(std::max<int64_t>(std::min<int64_t>((rows + 7) / 8, 8192), 1)));
}

// Each kernel in two builds, with the document clamp and without it (mma_launch.cuh).
template <typename T>
cudaError_t SimtForward(const FwdParams& p, cudaStream_t s) {
  const int bytes = SimtForwardSmemFloats(p.dims.D) * 4;
  void (*kernel)(FwdParams) = p.mask.doc_lo != nullptr ? SimtForwardKernel<T, true> : SimtForwardKernel<T, false>;
  cudaError_t e = AllowSmem(kernel, bytes);
  if (e != cudaSuccess) return e;
  const dim3 grid(QueryTileCount(p.mask, kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, 128, bytes, s)(p);
}

template <typename T>
cudaError_t SimtBackward(const BwdParams& p, cudaStream_t s) {
  const bool docs = p.mask.doc_lo != nullptr;
  void (*dq_kernel)(BwdParams) = docs ? SimtBackwardDqKernel<T, true> : SimtBackwardDqKernel<T, false>;
  void (*dkv_kernel)(BwdParams) = docs ? SimtBackwardDkvKernel<T, true> : SimtBackwardDkvKernel<T, false>;
  const int dq_bytes = SimtDqSmemFloats(p.dims.D) * 4, dkv_bytes = SimtDkvSmemFloats(p.dims.D) * 4;
  cudaError_t e = AllowSmem(dq_kernel, dq_bytes);
  if (e == cudaSuccess) e = AllowSmem(dkv_kernel, dkv_bytes);
  if (e != cudaSuccess) return e;
  const dim3 dq_grid(QueryTileCount(p.mask, kSimtRows), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  e = STRIA_LAUNCH(dq_kernel, dq_grid, 128, dq_bytes, s)(p);
  if (e != cudaSuccess) return e;
  const dim3 dkv_grid(static_cast<unsigned>((p.dims.L + kSimtRows - 1) / kSimtRows),
                      static_cast<unsigned>(p.dims.B * p.dims.Hkv));
  return STRIA_LAUNCH(dkv_kernel, dkv_grid, 128, dkv_bytes, s)(p);
}

}  // namespace

cudaError_t LaunchForwardBlock(Elem e, Kernels k, const FwdParams& p, cudaStream_t s) {
  if (k == Kernels::kTma && e == Elem::kF16) return TmaForwardF16(p.dims.D, p, s);
  if (k == Kernels::kTma && e == Elem::kBF16) return TmaForwardBF16(p.dims.D, p, s);
  if (k == Kernels::kWgmma && e == Elem::kF16) return WgmmaForwardF16(p.dims.D, p, s);
  if (k == Kernels::kWgmma && e == Elem::kBF16) return WgmmaForwardBF16(p.dims.D, p, s);
  if (k == Kernels::kMma && e == Elem::kF16) return MmaForwardF16(p.dims.D, p, s);
  if (k == Kernels::kMma && e == Elem::kBF16) return MmaForwardBF16(p.dims.D, p, s);
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

namespace {

// The deterministic backward of a tensor-core family: its dK/dV pass without dQ, then a dQ pass
// over the query tiles: the Hopper families' on wgmma (wgmma_backward_dq.cuh), mma.sync's
// elsewhere (mma_backward_dq.cuh).
cudaError_t DeterministicBackward(bool f16, Kernels k, const BwdParams& p, cudaStream_t s) {
  const int D = p.dims.D;
  cudaError_t e = k == Kernels::kTma     ? (f16 ? TmaBackwardKvF16 : TmaBackwardKvBF16)(D, p, s)
                  : k == Kernels::kWgmma ? (f16 ? WgmmaBackwardKvF16 : WgmmaBackwardKvBF16)(D, p, s)
                                         : (f16 ? MmaBackwardKvF16 : MmaBackwardKvBF16)(D, p, s);
  if (e != cudaSuccess) return e;
  if (k == Kernels::kTma || k == Kernels::kWgmma) return (f16 ? WgmmaBackwardDqF16 : WgmmaBackwardDqBF16)(D, p, s);
  return (f16 ? MmaBackwardDqF16 : MmaBackwardDqBF16)(D, p, s);
}

}  // namespace

cudaError_t LaunchBackwardBlock(Elem e, Kernels k, bool deterministic, const BwdParams& p, cudaStream_t s) {
  if (deterministic && k != Kernels::kSimt && e != Elem::kF32) return DeterministicBackward(e == Elem::kF16, k, p, s);
  if (k == Kernels::kTma && e == Elem::kF16) return TmaBackwardF16(p.dims.D, p, s);
  if (k == Kernels::kTma && e == Elem::kBF16) return TmaBackwardBF16(p.dims.D, p, s);
  if (k == Kernels::kWgmma && e == Elem::kF16) return WgmmaBackwardF16(p.dims.D, p, s);
  if (k == Kernels::kWgmma && e == Elem::kBF16) return WgmmaBackwardBF16(p.dims.D, p, s);
  if (k == Kernels::kMma && e == Elem::kF16) return MmaBackwardF16(p.dims.D, p, s);
  if (k == Kernels::kMma && e == Elem::kBF16) return MmaBackwardBF16(p.dims.D, p, s);
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
