// What the tensor-core families' launchers share: the grids of a forward kernel over the block's
// query tiles and of a backward kernel over its key tiles. Each family has a header of its own
// (mma_launch.cuh, wgmma_launch.cuh, tma_launch.cuh), included by that family's translation units
// (kernel_matrix.def: one per family, pass group and dtype, so the slow template instantiations
// build in parallel) and by nothing else.
#pragma once

#include <cuda_runtime.h>

#include "cuda/device_api.cuh"
#include "cuda/head_groups.cuh"
#include "cuda/params.h"
#include "cuda/smem_optin.cuh"
#include "cuda/tile_mask.cuh"

namespace stria {
namespace cuda {

// A forward tile kernel over the query tiles of the block's rows (Tile: kM, kThreads, kSmemBytes).
// Its heads in groups that keep their K/V rows in L2 (head_groups.cuh); the same for the key tiles.
template <typename Tile>
cudaError_t LaunchForwardTiles(void (*kernel)(FwdParams), const FwdParams& p, cudaStream_t s) {
  static_assert(Tile::kM == kForwardTileRows, "a forward's busy-tile lists are made for kForwardTileRows");
  FwdParams grouped = p;
  if (!QueryTileHeadGroup(p.dims, 2, &grouped.head_group)) return cudaErrorInvalidValue;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(grouped);
}

// A deterministic backward's dQ pass over the query tiles of the block (Tile: kM, kThreads,
// kSmemBytes), its heads grouped as a forward's: its query tiles read K/V rows.
template <typename Tile>
cudaError_t LaunchDqQueryTiles(void (*kernel)(BwdParams), const BwdParams& p, cudaStream_t s) {
  BwdParams grouped = p;
  if (!QueryTileHeadGroup(p.dims, 2, &grouped.head_group)) return cudaErrorInvalidValue;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(QueryTileCount(p.mask, Tile::kM), static_cast<unsigned>(p.dims.B * p.dims.Hq));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(grouped);
}

// A backward tile kernel over the key tiles of the block (Tile: kN, kThreads, kSmemBytes; those
// the caller reads: KeyTileCount), one grid row per (batch, K/V head).
template <typename Tile>
cudaError_t LaunchKeyTiles(void (*kernel)(BwdParams), const BwdParams& p, cudaStream_t s) {
  BwdParams grouped = p;
  if (!KeyTileHeadGroup(p.dims, 2, &grouped.head_group)) return cudaErrorInvalidValue;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(KeyTileCount(p, Tile::kN), static_cast<unsigned>(p.dims.B * p.dims.Hkv));
  if (grid.x == 0) return cudaSuccess;  // key_begin at or past the last row: no key of this launch
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(grouped);
}

}  // namespace cuda
}  // namespace stria
