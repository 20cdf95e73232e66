// The mma.sync family's launchers (sm_80 on), for its translation units mma_*.cu.
#pragma once

#include "cuda/launch_tiles.cuh"
#include "cuda/mma_backward.cuh"
#include "cuda/mma_backward_dq.cuh"
#include "cuda/mma_forward.cuh"

namespace stria {
namespace cuda {

// Every kernel has two builds: with the document clamp (a block with document bounds) and
// without it (the others, whose code stays what it was without documents: tile_mask.cuh).
// The mma.sync forward has a second axis: the build for a call's first and last blocks, and the
// one for the blocks between (mma_forward.cuh).
template <typename T, int D>
cudaError_t LaunchMmaForward(const FwdParams& p, cudaStream_t s) {
  const bool docs = p.mask.doc_lo != nullptr, ends = p.first != 0 || p.out.data != nullptr;
  void (*kernel)(FwdParams) = docs
                                  ? (ends ? MmaForwardKernel<T, D, true, true> : MmaForwardKernel<T, D, true, false>)
                                  : (ends ? MmaForwardKernel<T, D, false, true> : MmaForwardKernel<T, D, false, false>);
  return LaunchForwardTiles<FwdTile<D>>(kernel, p, s);
}

template <typename T, int D>
cudaError_t LaunchMmaBackward(const BwdParams& p, cudaStream_t s) {
  return LaunchKeyTiles<BwdTile<D>>(
      p.mask.doc_lo != nullptr ? MmaBackwardKernel<T, D, true> : MmaBackwardKernel<T, D, false>, p, s);
}

// The backward passes of the deterministic backward (mma_backward_dq.cuh): a family's dK/dV over
// the key tiles without dQ (the *Kv launchers, kDq false), then mma.sync's dQ pass over the query
// tiles, one after the other on the stream (launch.cu puts them together).
template <typename T, int D>
cudaError_t LaunchMmaBackwardKv(const BwdParams& p, cudaStream_t s) {
  return LaunchKeyTiles<BwdTile<D>>(
      p.mask.doc_lo != nullptr ? MmaBackwardKernel<T, D, true, false> : MmaBackwardKernel<T, D, false, false>, p, s);
}
template <typename T, int D>
cudaError_t LaunchMmaBackwardDq(const BwdParams& p, cudaStream_t s) {
  return LaunchDqQueryTiles<BwdDqTile<D>>(
      p.mask.doc_lo != nullptr ? MmaBackwardDqKernel<T, D, true> : MmaBackwardDqKernel<T, D, false>, p, s);
}

}  // namespace cuda
}  // namespace stria
