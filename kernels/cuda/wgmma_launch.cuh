// The wgmma family's launchers (sm_90a), for its translation units wgmma_*.cu and as the TMA
// family's fallback for views a tensor map cannot describe.
#pragma once

#include "cuda/launch_tiles.cuh"
#include "cuda/wgmma_backward.cuh"
#include "cuda/wgmma_backward_dq.cuh"
#include "cuda/wgmma_backward_wide.cuh"
#include "cuda/wgmma_forward.cuh"

namespace stria {
namespace cuda {

// sm_90a only: the caller checks the device (the kernel is empty in the other builds).
template <typename T, int D>
cudaError_t LaunchWgmmaForward(const FwdParams& p, cudaStream_t s) {
  return LaunchForwardTiles<WgmmaFwdTile<D>>(
      p.mask.doc_lo != nullptr ? WgmmaForwardKernel<T, D, true> : WgmmaForwardKernel<T, D, false>, p, s);
}

// sm_90a only, like the wgmma forward. kDq false: the deterministic backward's dK/dV pass. Head
// dim 256 takes the kernel that splits the columns between its warpgroups (wgmma_backward_wide.cuh).
template <typename T, int D, bool kDq = true>
cudaError_t LaunchWgmmaBackward(const BwdParams& p, cudaStream_t s) {
  const bool docs = p.mask.doc_lo != nullptr;
  if constexpr (D > 128) {
    return LaunchKeyTiles<WgmmaWideBwdTile<D>>(
        docs ? WgmmaWideBackwardKernel<T, D, true, kDq> : WgmmaWideBackwardKernel<T, D, false, kDq>, p, s);
  } else {
    return LaunchKeyTiles<WgmmaBwdTile<D>>(
        docs ? WgmmaBackwardKernel<T, D, true, kDq> : WgmmaBackwardKernel<T, D, false, kDq>, p, s);
  }
}
template <typename T, int D>
cudaError_t LaunchWgmmaBackwardKv(const BwdParams& p, cudaStream_t s) {
  return LaunchWgmmaBackward<T, D, false>(p, s);
}
// The deterministic backward's dQ pass of both Hopper families (wgmma_backward_dq.cuh), over the
// query tiles.
template <typename T, int D>
cudaError_t LaunchWgmmaBackwardDq(const BwdParams& p, cudaStream_t s) {
  return LaunchDqQueryTiles<WgmmaBwdDqTile<D>>(
      p.mask.doc_lo != nullptr ? WgmmaBackwardDqKernel<T, D, true> : WgmmaBackwardDqKernel<T, D, false>, p, s);
}

}  // namespace cuda
}  // namespace stria
