// The deterministic backward in one pass: each query tile's dQ added in the order of the key tiles.
//
// A backward CTA owns one key tile and adds its share of every query tile's dQ into dq_acc. Where
// several CTAs add into one query tile at once, the order of the float additions, and so the bits
// of dQ, change from run to run. The two-pass deterministic backward avoids that by computing dQ in
// a pass of its own over the query tiles, which recomputes S and dP: seven products where five do.
// The ordered dQ keeps the one pass and puts the adds into each query tile in the order of the key
// tiles (FlashAttention-3's deterministic mode does the like), in a form the ring's block masks
// (causal offsets, documents, windows, key_begin) and any grid fit:
//  - A CTA takes its key tile by a ticket, the order in which CTAs start (take_ticket), not by
//    blockIdx, and waits only for CTAs with smaller tickets. Those have started and, by induction
//    from the smallest, finish, so the waits cannot deadlock whatever order the hardware starts
//    CTAs in and however few fit at once.
//  - Key tile t and query tile m are linked when t holds keys m's rows may see (KeyRange, from
//    key_begin; LinkedPlace). The key tiles linked to m are consecutive; a count per (batch
//    row, K/V head, query tile) holds how many of them have passed m. Tile t waits until the count
//    equals its place in that run, adds its dQ of every query head of its GQA group into m, waits
//    until the adds are complete and releases the count.
//  - Every query tile a CTA walks (QueryTilesOf) is linked to its key tile (both ranges are
//    conservative in ways that keep this true; tests/cuda_emu holds them to it on random masks).
//    A linked tile without work (the conservative part) is passed with the wait and the release
//    alone, and a CTA without any work still passes its linked tiles.
//  - CTAs walk their query tiles from the last, the heads of a tile together, so the CTAs of one
//    K/V head all start at the same last tile and each trails the one before by the latency of one
//    tile's adds rather than by a tile's work (the causal diagonal's CTAs then keep pace).
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/tile_mask.cuh"
#include "cuda/tma_api.cuh"

namespace stria {
namespace cuda {

// The place of key tile `tile` (of a launch whose tiles of kN keys start at key_begin) among the
// key tiles linked to the query tile of rows [i0, i0 + rows): how many linked tiles come before
// it. -1 when it is not linked. The linked tiles are those holding the keys the rows may see
// (KeyRange), and where that range is empty but the tile has rows of the block, the tile holding
// its start: rows whose document bounds are empty (a plan's padding) but lie inside a key tile are
// walked by that tile's CTA all the same (QueryRange is conservative so), so they must be linked
// to it.
template <bool kDocs>
STRIA_HD int LinkedPlace(const MaskArgs& m, int64_t i0, int rows, int64_t key_begin, int kN, int64_t tile) {
  int64_t lo, hi;
  KeyRange<kDocs>(m, i0, i0 + rows, &lo, &hi);
  if (hi <= lo && MaxI(i0, m.q_begin) < MinI(i0 + rows, m.q_end)) hi = lo + 1;
  const TileRun run = TilesCovering(lo, hi, kN);
  const int64_t first = MaxI(run.first, key_begin), end = run.first + static_cast<int64_t>(run.count) * kN;
  const int64_t j0 = key_begin + tile * kN;
  if (j0 < first || j0 >= end) return -1;
  return static_cast<int>((j0 - first) / kN);
}

#if STRIA_HAS_WGMMA
// The walk of one warp over the query tiles of kM rows linked to key tile `tile` of K/V head slot
// `slot` (batch row times K/V head), from the last: for each, wait for the linked tiles before
// this one, add(m) (the caller's adds into query tile m, if it has any there, complete when add
// returns), then release. Every lane of the warp calls it; lane 0 waits, adds and releases.
template <bool kDocs, typename Add>
STRIA_DEVICE void PassLinkedTiles(const BwdParams& p, const MaskArgs& mask, int kM, int kN, unsigned tile,
                                  unsigned slot, Add add) {
  const int64_t m_tiles = (p.dims.L + kM - 1) / kM;
  int* counts = p.dq_order + 1 + static_cast<int64_t>(slot) * m_tiles;
  const int lane = lane_id();
  for (int64_t top = m_tiles - 1; top >= 0; top -= 32) {
    // 32 query tiles at a time, one a lane, then lane 0 takes the linked ones in order.
    const int64_t mine = top - lane;
    const int place = mine >= 0 ? LinkedPlace<kDocs>(mask, mine * kM, kM, p.key_begin, kN, tile) : -1;
    for (int l = 0; l < 32 && top - l >= 0; ++l) {
      const int want = static_cast<int>(shfl(static_cast<float>(place), l));  // exact: places are small
      if (want < 0 || lane != 0) continue;
      int* count = counts + (top - l);
      wait_count(count, want);
      fence_proxy_async_global();  // the earlier tiles' adds, seen by this thread's bulk reductions
      add(top - l);
      fence_proxy_async_global();  // this tile's completed adds, published by the release
      release_count(count);
    }
  }
}
#endif

}  // namespace cuda
}  // namespace stria
