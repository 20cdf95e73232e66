// What the entries of kernel_matrix.def mean in code: the head dims each is built for, an entry
// point's name and signature, and the macros that declare one (launch.cu) and define one (its
// translation unit, after its family's launcher header).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cuda/launch.h"
#include "cuda/params.h"

// The head dims of every tensor-core entry; other head dims (and float32) take the SIMT kernels.
#define STRIA_KERNEL_HEAD_DIMS(X) X(64) X(128)

// <family><pass><dtype>(int D, const Params& p, cudaStream_t s), in stria::cuda: the parameters of
// its pass, the element type of its dtype.
#define STRIA_KERNEL_NAME(family, pass, dtype) family##pass##dtype
#define STRIA_KERNEL_PARAMS_Forward FwdParams
#define STRIA_KERNEL_PARAMS_Backward BwdParams
#define STRIA_KERNEL_PARAMS_BackwardKv BwdParams
#define STRIA_KERNEL_PARAMS_BackwardDq BwdParams
#define STRIA_KERNEL_ELEM_F16 Half
#define STRIA_KERNEL_ELEM_BF16 BFloat

#define STRIA_KERNEL_DECLARE(family, pass, dtype) \
  cudaError_t STRIA_KERNEL_NAME(family, pass, dtype)(int D, const STRIA_KERNEL_PARAMS_##pass& p, cudaStream_t s);

namespace stria {
namespace cuda {

// The passes of kernel_matrix.def.
enum class Pass { kForward, kBackward, kBackwardKv, kBackwardDq };

// Head dim 256 (Gemma's) is built where a family's pass has it (HasWideHeadDim): every forward
// (shorter K/V tiles there: shared memory; mma.sync with a warp per 16 rows), every backward
// (mma.sync's with two warps per 16 keys; the Hopper families' kernels of their own:
// wgmma_backward_wide.cuh for dK/dV, with or without dQ) and the Hopper families' deterministic
// passes (the wgmma dQ pass with one warpgroup a CTA). mma.sync's deterministic passes take the
// SIMT kernels at that head dim: launch.cu's dispatch asks EntryHasHeadDim.
constexpr int kWideHeadDim = 256;
constexpr bool HasWideHeadDim(Kernels family, Pass pass) {
  return pass == Pass::kForward || pass == Pass::kBackward || family == Kernels::kWgmma || family == Kernels::kTma;
}
constexpr bool EntryHasHeadDim(Kernels family, Pass pass, int D) {
#define STRIA_KERNEL_IS_HEAD_DIM(d) || D == d
  return (false STRIA_KERNEL_HEAD_DIMS(STRIA_KERNEL_IS_HEAD_DIM)) ||
         (D == kWideHeadDim && HasWideHeadDim(family, pass));
#undef STRIA_KERNEL_IS_HEAD_DIM
}

// f(std::integral_constant<int, D>{}) for a head dim the entry is built for (kWide: its
// HasWideHeadDim); otherwise cudaErrorInvalidValue.
template <bool kWide, typename F>
cudaError_t ForKernelHeadDim(int D, F f) {
#define STRIA_KERNEL_HEAD_DIM_CASE(d) \
  if (D == d) return f(std::integral_constant<int, d>{});
  STRIA_KERNEL_HEAD_DIMS(STRIA_KERNEL_HEAD_DIM_CASE)
#undef STRIA_KERNEL_HEAD_DIM_CASE
  if constexpr (kWide) {
    if (D == kWideHeadDim) return f(std::integral_constant<int, kWideHeadDim>{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace stria

// The entry point: its family's launcher of its pass (Launch<family><pass><T, D>(p, s), in
// <family>_launch.cuh) at each head dim it is built for.
#define STRIA_KERNEL_DEFINE(family, pass, dtype)                                                                   \
  namespace stria {                                                                                                \
  namespace cuda {                                                                                                 \
  cudaError_t STRIA_KERNEL_NAME(family, pass, dtype)(int D, const STRIA_KERNEL_PARAMS_##pass& p, cudaStream_t s) { \
    return ForKernelHeadDim<HasWideHeadDim(Kernels::k##family, Pass::k##pass)>(                                    \
        D, [&](auto d) { return Launch##family##pass<STRIA_KERNEL_ELEM_##dtype, decltype(d)::value>(p, s); });     \
  }                                                                                                                \
  }                                                                                                                \
  }
