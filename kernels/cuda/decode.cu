// Launchers of the decode kernels (decode.cuh).
#include <cuda_runtime.h>

#include "cuda/decode.cuh"
#include "cuda/decode_launch.h"
#include "cuda/launch.h"
#include "cuda/smem_optin.cuh"

namespace stria {
namespace cuda {

static_assert(kDecodeMaxHeadDim >= kMaxHeadDim && kDecodeMaxHeadDim % 32 == 0, "the merge's registers");

namespace {

// Blocks of 256 threads, a warp per row, at most 4096 blocks (the kernels loop over the rest).
dim3 WarpRowGrid(int64_t rows) {
  const int64_t blocks = (rows + 7) / 8;
  return dim3(static_cast<unsigned>(blocks < 4096 ? (blocks < 1 ? 1 : blocks) : 4096));
}

// The decode kernel's build for head dims up to kMaxD; above 256 its tiles take more than the
// 48 KB of shared memory a launch gets without asking.
template <typename T, int kMaxD>
cudaError_t LaunchDecodeAt(const DecodeArgs& a, dim3 grid, int smem, cudaStream_t s) {
  void (*kernel)(DecodeArgs) = DecodeKernel<T, kMaxD>;
  const cudaError_t e = AllowSmem(kernel, smem);
  if (e != cudaSuccess) return e;
  return STRIA_LAUNCH(kernel, grid, kDecodeThreads, static_cast<size_t>(smem), s)(a);
}

}  // namespace

cudaError_t LaunchDecode(Elem e, const DecodeArgs& a, int64_t items, cudaStream_t s) {
  if (items == 0) return cudaSuccess;
  const int rows = a.T * (a.Hq / a.Hkv);
  if (a.D < 1 || a.D > kMaxHeadDim || items > 0x7fffffff || a.Hkv > 65535 ||
      (rows + kDecodeRows - 1) / kDecodeRows > 65535)
    return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(items), static_cast<unsigned>(a.Hkv),
                  static_cast<unsigned>((rows + kDecodeRows - 1) / kDecodeRows));
  const int smem = DecodeSmemBytes(a.D);
  switch (e) {
    case Elem::kF32:
      return a.D <= kNarrowHeadDim ? LaunchDecodeAt<Float, kNarrowHeadDim>(a, grid, smem, s)
                                   : LaunchDecodeAt<Float, kDecodeMaxHeadDim>(a, grid, smem, s);
    case Elem::kF16:
      return a.D <= kNarrowHeadDim ? LaunchDecodeAt<Half, kNarrowHeadDim>(a, grid, smem, s)
                                   : LaunchDecodeAt<Half, kDecodeMaxHeadDim>(a, grid, smem, s);
    case Elem::kBF16:
      return a.D <= kNarrowHeadDim ? LaunchDecodeAt<BFloat, kNarrowHeadDim>(a, grid, smem, s)
                                   : LaunchDecodeAt<BFloat, kDecodeMaxHeadDim>(a, grid, smem, s);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchDecodeMerge(const DecodeMergeArgs& a, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.T * a.Hq;
  if (rows == 0) return cudaSuccess;
  return STRIA_LAUNCH(DecodeMergeKernel, WarpRowGrid(rows), 256, 0, s)(a);
}

cudaError_t LaunchDecodeMergeFinish(Elem e, const DecodeMergeArgs& a, const DecodeFinishArgs& f, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.T * a.Hq;
  if (rows == 0) return cudaSuccess;
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(DecodeMergeFinishKernel<Float>, WarpRowGrid(rows), 256, 0, s)(a, f);
    case Elem::kF16:
      return STRIA_LAUNCH(DecodeMergeFinishKernel<Half>, WarpRowGrid(rows), 256, 0, s)(a, f);
    case Elem::kBF16:
      return STRIA_LAUNCH(DecodeMergeFinishKernel<BFloat>, WarpRowGrid(rows), 256, 0, s)(a, f);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchDecodeFinish(Elem e, const DecodeFinishArgs& a, cudaStream_t s) {
  const int64_t rows = static_cast<int64_t>(a.B) * a.T * a.Hq;
  if (a.world < 1 || a.D < 1 || a.D > kDecodeMaxHeadDim) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  switch (e) {
    case Elem::kF32:
      return STRIA_LAUNCH(DecodeFinishKernel<Float>, WarpRowGrid(rows), 256, 0, s)(a);
    case Elem::kF16:
      return STRIA_LAUNCH(DecodeFinishKernel<Half>, WarpRowGrid(rows), 256, 0, s)(a);
    case Elem::kBF16:
      return STRIA_LAUNCH(DecodeFinishKernel<BFloat>, WarpRowGrid(rows), 256, 0, s)(a);
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchStoreTokens(int elem_bytes, const TokenCopy* copies, int64_t n, int Hkv, int D, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  const dim3 g = WarpRowGrid(n * Hkv * 2);
  if (elem_bytes == 4) return STRIA_LAUNCH(StoreTokensKernel<4>, g, 256, 0, s)(copies, n, Hkv, D);
  return STRIA_LAUNCH(StoreTokensKernel<2>, g, 256, 0, s)(copies, n, Hkv, D);
}

}  // namespace cuda
}  // namespace stria
