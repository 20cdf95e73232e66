// Launch helpers of the tensor-core kernels, included by one translation unit per dtype and
// direction (mma_{fwd,bwd}_{f16,bf16}.cu) so the slow template instantiations build in parallel.
#pragma once

#include <cuda_runtime.h>

#include "cuda/mma_backward.cuh"
#include "cuda/mma_backward_dq.cuh"
#include "cuda/mma_forward.cuh"
#include "cuda/smem_optin.cuh"
#include "cuda/tma_backward.cuh"
#include "cuda/tma_forward.cuh"
#include "cuda/wgmma_backward.cuh"
#include "cuda/wgmma_forward.cuh"

namespace stria {
namespace cuda {

// A forward tile kernel over the query tiles of the block's rows (Tile: kM, kThreads, kSmemBytes).
template <typename Tile>
cudaError_t LaunchForwardTiles(void (*kernel)(FwdParams), const FwdParams& p, cudaStream_t s) {
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(p);
}

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

// sm_90a only: the caller checks the device (the kernel is empty in the other builds).
template <typename T, int D>
cudaError_t LaunchWgmmaForward(const FwdParams& p, cudaStream_t s) {
  return LaunchForwardTiles<WgmmaFwdTile<D>>(
      p.mask.doc_lo != nullptr ? WgmmaForwardKernel<T, D, true> : WgmmaForwardKernel<T, D, false>, p, s);
}

// sm_90a only, like the wgmma forward. TMA needs what EncodeRowsMap checks (16-byte aligned
// strides); a view it cannot describe takes the wgmma kernel that loads with cp.async instead.
template <typename T, int D>
cudaError_t LaunchTmaForward(const FwdParams& p, cudaStream_t s) {
  using Tile = TmaFwdTile<D>;
  TmaFwdParams tp{};
  tp.p = p;
  const Dims& d = p.dims;
  const bool mapped =
      EncodeViewMap(&tp.q_map, p.q, d, d.Hq, Tile::kM) && EncodeBlockMaps(&tp.k_map, &tp.v_map, p.k, p.v, d, Tile::kN);
  if (!mapped) return LaunchWgmmaForward<T, D>(p, s);
  void (*kernel)(TmaFwdParams) =
      p.mask.doc_lo != nullptr ? WgmmaTmaForwardKernel<T, D, true> : WgmmaTmaForwardKernel<T, D, false>;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(d.B * d.Hq));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(tp);
}

// A backward tile kernel over the key tiles of the block (Tile: kN, kThreads, kSmemBytes), one
// grid row per (batch, K/V head).
template <typename Tile>
cudaError_t LaunchKeyTiles(void (*kernel)(BwdParams), const BwdParams& p, cudaStream_t s) {
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(static_cast<unsigned>((p.dims.L + Tile::kN - 1) / Tile::kN),
                  static_cast<unsigned>(p.dims.B * p.dims.Hkv));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(p);
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
  using Tile = BwdDqTile<D>;
  void (*kernel)(BwdParams) =
      p.mask.doc_lo != nullptr ? MmaBackwardDqKernel<T, D, true> : MmaBackwardDqKernel<T, D, false>;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(p);
}

// sm_90a only, like the wgmma forward. kDq false: the deterministic backward's dK/dV pass.
template <typename T, int D, bool kDq = true>
cudaError_t LaunchWgmmaBackward(const BwdParams& p, cudaStream_t s) {
  return LaunchKeyTiles<WgmmaBwdTile<D>>(
      p.mask.doc_lo != nullptr ? WgmmaBackwardKernel<T, D, true, kDq> : WgmmaBackwardKernel<T, D, false, kDq>, p, s);
}
template <typename T, int D>
cudaError_t LaunchWgmmaBackwardKv(const BwdParams& p, cudaStream_t s) {
  return LaunchWgmmaBackward<T, D, false>(p, s);
}

// sm_90a only; like the TMA forward, a view TMA cannot describe takes the cp.async wgmma kernel.
template <typename T, int D, bool kDq = true>
cudaError_t LaunchTmaBackward(const BwdParams& p, cudaStream_t s) {
  using Tile = TmaBwdTile<D>;
  TmaBwdParams tp{};
  tp.p = p;
  const Dims& d = p.dims;
  const bool mapped = EncodeViewMap(&tp.q_map, p.q, d, d.Hq, Tile::kM) &&
                      EncodeViewMap(&tp.do_map, p.dout, d, d.Hq, Tile::kM) &&
                      EncodeBlockMaps(&tp.k_map, &tp.v_map, p.k, p.v, d, Tile::kN);
  if (!mapped) return LaunchWgmmaBackward<T, D, kDq>(p, s);
  void (*kernel)(TmaBwdParams) =
      p.mask.doc_lo != nullptr ? WgmmaTmaBackwardKernel<T, D, true, kDq> : WgmmaTmaBackwardKernel<T, D, false, kDq>;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(static_cast<unsigned>((d.L + Tile::kN - 1) / Tile::kN), static_cast<unsigned>(d.B * d.Hkv));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(tp);
}
template <typename T, int D>
cudaError_t LaunchTmaBackwardKv(const BwdParams& p, cudaStream_t s) {
  return LaunchTmaBackward<T, D, false>(p, s);
}

}  // namespace cuda
}  // namespace stria

// One translation unit's entry points: <Name>(D, params, stream) for the head dims we build.
#define STRIA_MMA_ENTRY(Name, Launch, T, Params)             \
  namespace stria {                                          \
  namespace cuda {                                           \
  cudaError_t Name(int D, const Params& p, cudaStream_t s) { \
    switch (D) {                                             \
      case 64:                                               \
        return Launch<T, 64>(p, s);                          \
      case 128:                                              \
        return Launch<T, 128>(p, s);                         \
      default:                                               \
        return cudaErrorInvalidValue;                        \
    }                                                        \
  }                                                          \
  }                                                          \
  }
