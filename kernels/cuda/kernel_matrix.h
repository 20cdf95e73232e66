// What the entries of kernel_matrix.def mean in code: the head dims each is built for, an entry
// point's name and signature, and the macros that declare one (launch.cu) and define one (its
// translation unit, after its family's launcher header).
#pragma once

#include <cuda_runtime_api.h>

#include <type_traits>

#include "cuda/launch.h"
#include "cuda/params.h"

// The head dims of every tensor-core entry; other head dims (and float32) take the SIMT kernels.
// At 256 (Gemma's) the kernels change shape where registers or shared memory run short: shorter
// K/V tiles in the forwards, two warps per 16 rows splitting the columns in mma.sync's backward
// and its deterministic dQ pass, the Hopper families' wide backward (wgmma_backward_wide.cuh) and
// one warpgroup a CTA in their dQ pass.
#define STRIA_KERNEL_HEAD_DIMS(X) X(64) X(128) X(256)

#define STRIA_KERNEL_NAME(family, pass, dtype) family##pass##dtype
#define STRIA_KERNEL_PARAMS_Forward FwdParams
#define STRIA_KERNEL_PARAMS_Backward BwdParams
#define STRIA_KERNEL_PARAMS_BackwardKv BwdParams
#define STRIA_KERNEL_PARAMS_BackwardDq BwdParams
#define STRIA_KERNEL_PARAMS_BackwardOrdered BwdParams
#define STRIA_KERNEL_ELEM_F16 Half
#define STRIA_KERNEL_ELEM_BF16 BFloat

#define STRIA_KERNEL_DECLARE(family, pass, dtype) \
  cudaError_t STRIA_KERNEL_NAME(family, pass, dtype)(int D, const STRIA_KERNEL_PARAMS_##pass& p, cudaStream_t s);

namespace stria {
namespace cuda {

// The passes of kernel_matrix.def.
enum class Pass { kForward, kBackward, kBackwardKv, kBackwardDq, kBackwardOrdered };

// Whether the entries are built for head dim D.
constexpr bool IsKernelHeadDim(int D) {
#define STRIA_KERNEL_IS_HEAD_DIM(d) || D == d
  return false STRIA_KERNEL_HEAD_DIMS(STRIA_KERNEL_IS_HEAD_DIM);
#undef STRIA_KERNEL_IS_HEAD_DIM
}

// f(std::integral_constant<int, D>{}) for a head dim the entries are built for; otherwise
// cudaErrorInvalidValue.
template <typename F>
cudaError_t ForKernelHeadDim(int D, F f) {
#define STRIA_KERNEL_HEAD_DIM_CASE(d) \
  if (D == d) return f(std::integral_constant<int, d>{});
  STRIA_KERNEL_HEAD_DIMS(STRIA_KERNEL_HEAD_DIM_CASE)
#undef STRIA_KERNEL_HEAD_DIM_CASE
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
    return ForKernelHeadDim(                                                                                       \
        D, [&](auto d) { return Launch##family##pass<STRIA_KERNEL_ELEM_##dtype, decltype(d)::value>(p, s); });     \
  }                                                                                                                \
  }                                                                                                                \
  }
