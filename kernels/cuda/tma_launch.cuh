// The TMA family's launchers (sm_90a), for its translation units tma_*.cu.
#pragma once

// launch_tiles.cuh first: it includes the CUDA runtime's header before the device API, whose
// emulated build defines threadIdx and the like as macros that the runtime's header must not see.
#include <strings.h>

#include <cstdlib>

#include "cuda/launch_tiles.cuh"
#include "cuda/tma_backward.cuh"
#include "cuda/tma_backward_persistent.cuh"
#include "cuda/tma_forward.cuh"
#include "cuda/tma_forward_persistent.cuh"
#include "cuda/tma_schedule.h"
#include "cuda/wgmma_launch.cuh"

namespace stria {
namespace cuda {

// The current device's SMs: the persistent grid's size (one CTA per SM: a CTA's threads after
// their setmaxnreg fill an SM's register file). 1 where the runtime cannot say (the grid is only
// smaller).
inline unsigned SmCount() {
  const int sms = CurrentDeviceAttribute(cudaDevAttrMultiProcessorCount, 1);
  return sms > 0 ? static_cast<unsigned>(sms) : 1u;
}

// sm_90a only, like the wgmma forward. TMA needs what EncodeRowsMap checks (16-byte aligned
// strides); a view it cannot describe takes the wgmma kernel that loads with cp.async instead.
template <typename T, int D, int kConsumers>
cudaError_t LaunchTmaForwardOf(const FwdParams& p, bool persistent, cudaStream_t s) {
  using Tile = TmaFwdTile<D, kConsumers>;
  TmaFwdParams tp{};
  tp.p = p;
  const Dims& d = p.dims;
  const bool mapped =
      EncodeViewMap(&tp.q_map, p.q, d, d.Hq, Tile::kM) && EncodeBlockMaps(&tp.k_map, &tp.v_map, p.k, p.v, d, Tile::kN);
  if (!mapped) return LaunchWgmmaForward<T, D>(p, s);
  if (!QueryTileHeadGroup(d, 2, &tp.p.head_group)) return cudaErrorInvalidValue;  // head_groups.cuh
  const bool docs = p.mask.doc_lo != nullptr;
  // A busy-tile list is made for Tile::kM (ForwardTileRows): QueryTileCount takes it.
  const unsigned tiles = QueryTileCount(p.mask, Tile::kM), heads = static_cast<unsigned>(d.B * d.Hq);
  if (persistent) {
    using Persistent = TmaPersistentFwdTile<D, kConsumers>;
    void (*kernel)(TmaFwdParams) = docs ? WgmmaTmaPersistentForwardKernel<T, D, true, kConsumers>
                                        : WgmmaTmaPersistentForwardKernel<T, D, false, kConsumers>;
    const cudaError_t allowed = AllowSmem(kernel, Persistent::kSmemBytes);
    if (allowed != cudaSuccess) return allowed;
    const unsigned items = ForwardItems{tiles, heads, tp.p.head_group}.count(), sms = SmCount();
    const dim3 grid(items < sms ? items : sms);
    return STRIA_LAUNCH(kernel, grid, Persistent::kThreads, Persistent::kSmemBytes, s)(tp);
  }
  void (*kernel)(TmaFwdParams) =
      docs ? WgmmaTmaForwardKernel<T, D, true, kConsumers> : WgmmaTmaForwardKernel<T, D, false, kConsumers>;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(tiles, heads);
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(tp);
}
// The query tile the environment chooses (tma_schedule.h): three consumer warpgroups at D 64 where
// it says 192.
template <typename T, int D>
cudaError_t LaunchTmaForward(const FwdParams& p, cudaStream_t s) {
  bool persistent = false;
  int rows = kForwardTileRows;
  if (!TmaPersistent(&persistent) || !TmaForwardRows(D, &rows)) return cudaErrorInvalidValue;
  if constexpr (D == 64) {
    if (rows == 192) return LaunchTmaForwardOf<T, D, 3>(p, persistent, s);
  }
  return LaunchTmaForwardOf<T, D, 2>(p, persistent, s);
}

// How the TMA backward adds dQ (tma_backward.cuh): STRIA_CUDA_TMA_DQ unset or "bulk" (the dQ
// warp's bulk reductions) or "atomic" (the consumers' atomics), read at every launch (a getenv
// beside a kernel of milliseconds). False for any other value: a misspelt choice must not quietly
// measure the default.
inline bool TmaBulkDq(bool* bulk) {
  const char* env = std::getenv("STRIA_CUDA_TMA_DQ");
  *bulk = env == nullptr || *env == '\0' || strcasecmp(env, "bulk") == 0;
  return *bulk || strcasecmp(env, "atomic") == 0;
}

// The persistent TMA backward on the kernel the plain launch below picked, in a grid of at most
// one CTA per SM.
template <typename T, int D, bool kDq>
cudaError_t LaunchTmaPersistentBackward(const TmaBwdParams& tp, bool bulk, cudaStream_t s) {
  const BwdParams& p = tp.p;
  const bool docs = p.mask.doc_lo != nullptr;
  void (*kernel)(TmaBwdParams) =
      docs ? WgmmaTmaPersistentBackwardKernel<T, D, true, kDq> : WgmmaTmaPersistentBackwardKernel<T, D, false, kDq>;
  int smem = TmaPersistentBwdTile<D>::kSmemBytes;
  if constexpr (kDq) {
    if (bulk) {
      kernel = docs ? WgmmaTmaPersistentBackwardKernel<T, D, true, true, true>
                    : WgmmaTmaPersistentBackwardKernel<T, D, false, true, true>;
      smem = TmaPersistentBwdTile<D, true>::kSmemBytes;
    }
  }
  const cudaError_t allowed = AllowSmem(kernel, smem);
  if (allowed != cudaSuccess) return allowed;
  const unsigned items =
      BackwardItems{KeyTileCount(p, TmaBwdTile<D>::kN), static_cast<unsigned>(p.dims.B * p.dims.Hkv), 0u}.count();
  if (items == 0) return cudaSuccess;
  const unsigned sms = SmCount();
  const dim3 grid(items < sms ? items : sms);
  return STRIA_LAUNCH(kernel, grid, TmaBwdTile<D>::kThreads, smem, s)(tp);
}

// sm_90a only; like the TMA forward, a view TMA cannot describe takes the cp.async wgmma kernel.
template <typename T, int D, bool kDq>
cudaError_t LaunchTmaTileBackward(const BwdParams& p, cudaStream_t s) {
  using Tile = TmaBwdTile<D>;
  bool bulk = false, persistent = false;
  if (kDq && !TmaBulkDq(&bulk)) return cudaErrorInvalidValue;
  if (!TmaPersistent(&persistent)) return cudaErrorInvalidValue;
  TmaBwdParams tp{};
  tp.p = p;
  const Dims& d = p.dims;
  const bool mapped = EncodeViewMap(&tp.q_map, p.q, d, d.Hq, Tile::kM) &&
                      EncodeViewMap(&tp.do_map, p.dout, d, d.Hq, Tile::kM) &&
                      EncodeBlockMaps(&tp.k_map, &tp.v_map, p.k, p.v, d, Tile::kN);
  if (!mapped) return LaunchWgmmaBackward<T, D, kDq>(p, s);
  if (!KeyTileHeadGroup(d, 2, &tp.p.head_group)) return cudaErrorInvalidValue;  // head_groups.cuh
  if (persistent) return LaunchTmaPersistentBackward<T, D, kDq>(tp, bulk, s);
  const bool docs = p.mask.doc_lo != nullptr;
  void (*kernel)(TmaBwdParams) =
      docs ? WgmmaTmaBackwardKernel<T, D, true, kDq> : WgmmaTmaBackwardKernel<T, D, false, kDq>;
  int smem = TmaBwdTile<D>::kSmemBytes;
  if constexpr (kDq) {
    if (bulk) {
      kernel = docs ? WgmmaTmaBackwardKernel<T, D, true, true, true> : WgmmaTmaBackwardKernel<T, D, false, true, true>;
      smem = TmaBwdTile<D, true>::kSmemBytes;
    }
  }
  const cudaError_t allowed = AllowSmem(kernel, smem);
  if (allowed != cudaSuccess) return allowed;
  const dim3 grid(KeyTileCount(p, Tile::kN), static_cast<unsigned>(d.B * d.Hkv));
  if (grid.x == 0) return cudaSuccess;
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, smem, s)(tp);
}
// Head dim 256 takes the wgmma family's kernel for it (wgmma_backward_wide.cuh): the TMA
// backward's 128-key CTAs fit neither registers nor shared memory there.
template <typename T, int D, bool kDq = true>
cudaError_t LaunchTmaBackward(const BwdParams& p, cudaStream_t s) {
  if constexpr (D > 128) {
    return LaunchWgmmaBackward<T, D, kDq>(p, s);
  } else {
    return LaunchTmaTileBackward<T, D, kDq>(p, s);
  }
}
template <typename T, int D>
cudaError_t LaunchTmaBackwardKv(const BwdParams& p, cudaStream_t s) {
  return LaunchTmaBackward<T, D, false>(p, s);
}

// The deterministic backward (kernel_matrix.def's BackwardOrdered; ordered_dq.cuh): one pass whose
// dQ adds come in the order of the key tiles, where that kernel runs (head dims 64 and 128, the
// CTA-per-tile schedule, the bulk dQ, views TMA can describe, and counters to order them by in
// p.dq_order); elsewhere the two passes, this family's dK/dV pass and then the wgmma family's dQ
// pass. Either gives the same bits every run.
template <typename T, int D>
cudaError_t LaunchTmaBackwardOrdered(const BwdParams& p, cudaStream_t s) {
  if constexpr (D <= 128) {
    using Tile = TmaBwdTile<D, true, true>;
    bool bulk = false, persistent = false;
    if (!TmaBulkDq(&bulk) || !TmaPersistent(&persistent)) return cudaErrorInvalidValue;
    TmaBwdParams tp{};
    tp.p = p;
    const Dims& d = p.dims;
    const bool ordered = bulk && !persistent && p.dq_order != nullptr &&
                         EncodeViewMap(&tp.q_map, p.q, d, d.Hq, Tile::kM) &&
                         EncodeViewMap(&tp.do_map, p.dout, d, d.Hq, Tile::kM) &&
                         EncodeBlockMaps(&tp.k_map, &tp.v_map, p.k, p.v, d, Tile::kN);
    if (ordered) {
      if (!KeyTileHeadGroup(d, 2, &tp.p.head_group)) return cudaErrorInvalidValue;  // head_groups.cuh
      const dim3 grid(KeyTileCount(p, Tile::kN), static_cast<unsigned>(d.B * d.Hkv));
      if (grid.x == 0) return cudaSuccess;
      void (*kernel)(TmaBwdParams) = p.mask.doc_lo != nullptr ? WgmmaTmaBackwardKernel<T, D, true, true, true, true>
                                                              : WgmmaTmaBackwardKernel<T, D, false, true, true, true>;
      cudaError_t e = AllowSmem(kernel, Tile::kSmemBytes);
      if (e == cudaSuccess) e = cudaMemsetAsync(p.dq_order, 0, static_cast<size_t>(OrderedDqInts(d)) * 4, s);
      if (e != cudaSuccess) return e;
      return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(tp);
    }
  }
  const cudaError_t e = LaunchTmaBackward<T, D, false>(p, s);
  return e != cudaSuccess ? e : LaunchWgmmaBackwardDq<T, D>(p, s);
}

}  // namespace cuda
}  // namespace stria
