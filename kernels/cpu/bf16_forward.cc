// The bf16 forward tile, part of the "amx" kernel build (Intel Sapphire Rapids and later) and
// of the "avx512bf16" one (AMD Zen 4 and 5, Intel Cooper Lake).
//
// Both products, S = Q·Kᵀ and O += P·V, are bf16 products into float32 (bf16_tiles.h: TDPBF16PS
// on AMX tiles, or VDPBF16PS); the online softmax between them is the float32 one of the other
// forward kernels (online_softmax.h), and P is rounded to bf16 for its product with V, as GPU
// flash kernels do. Q and K stay exactly the caller's bf16 values: the scale is applied to the
// float32 scores inside the softmax, not to Q before rounding.
#include <cstdint>

#include "cpu/attention_kernels.h"
#include "cpu/bf16_tiles.h"
#include "cpu/online_softmax.h"
#include "cpu/simd.h"
#include "cpu/softcap.h"
#include "cpu/tile_mask.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {

void ForwardTileBf16(const FwdTileArgsBf16& a) {
  const PackedShape& sh = *a.shape;
  const BlockMask& mk = *a.mask;
  const int64_t Dp = sh.Dp;
  // The key range of each query tile of the item, and of the item: a key tile is read from
  // memory once and used by every query tile that sees it (the point of several per item).
  int64_t k_lo[kBf16QueryTiles], k_hi[kBf16QueryTiles];
  int64_t item_lo = INT64_MAX, item_hi = INT64_MIN;
  for (int g = 0; g < kBf16QueryTiles; ++g) {
    const int64_t i0 = a.q0 + g * kBlockQ;
    const int64_t row_lo = std::max(i0, mk.q_begin), row_hi = std::min(i0 + kBlockQ, mk.q_end);
    k_lo[g] = mk.k_begin;
    k_hi[g] = mk.k_end;
    if (mk.diagonal) k_hi[g] = std::min(k_hi[g], row_hi - 1 + mk.offset + 1);
    if (g < a.q_tiles) DocumentKeyRange(mk, row_lo, row_hi, &k_lo[g], &k_hi[g]);
    if (g >= a.q_tiles || row_lo >= row_hi || k_hi[g] <= k_lo[g]) {
      k_hi[g] = k_lo[g];  // nothing to do for this query tile
      continue;
    }
    item_lo = std::min(item_lo, k_lo[g]);
    item_hi = std::max(item_hi, k_hi[g]);
  }
  if (item_hi <= item_lo) return;

  float* s = a.scratch;
  uint16_t* p = reinterpret_cast<uint16_t*>(s + kBlockQ * kBlockK);
  const int64_t cols[1] = {kBlockK};  // every row: the whole tile, masked pairs set to -inf
  vf lsum[kBf16QueryTiles][kBlockQ] = {};
  BeginTileProducts();
  for (int64_t kt = item_lo / kBlockK; kt * kBlockK < item_hi; ++kt) {
    const int64_t j0 = kt * kBlockK;
    for (int g = 0; g < kBf16QueryTiles; ++g) {
      if (k_hi[g] <= k_lo[g] || j0 + kBlockK <= k_lo[g] || j0 >= k_hi[g]) continue;
      const int64_t i0 = a.q0 + g * kBlockQ;
      float* acc = a.acc + i0 * Dp;
      TileGemm(a.q + i0 * Dp, Dp, a.kt + kt * Dp * kBlockK, 2 * kBlockK, s, kBlockK, kBlockQ, kBlockK, Dp, false);
      if (!TileFull(mk, i0, j0)) ApplyMask(mk, i0, j0, s);
      if (a.softcap2 > 0.f) {
        // Capped in the log2 domain, the scale applied on the way: the softmax then takes them as they are.
        for (int64_t r = 0; r < kBlockQ; ++r) SoftcapRow<true>(s + r * kBlockK, kBlockK, a.scale, a.softcap2);
        SoftmaxTile(s, cols, kBlockQ, 1.0f, a.m + i0, a.l + i0, lsum[g], acc, Dp);
      } else {
        SoftmaxTile(s, cols, kBlockQ, a.scale, a.m + i0, a.l + i0, lsum[g], acc, Dp);
      }
      RoundTile(s, p);
      TileGemm(p, kBlockK, a.v + kt * Dp * kBlockK, 2 * Dp, acc, Dp, kBlockQ, Dp, kBlockK, true);
    }
  }
  EndTileProducts();
  for (int g = 0; g < a.q_tiles; ++g)
    for (int64_t r = 0; r < kBlockQ; ++r) a.l[a.q0 + g * kBlockQ + r] += HSum(lsum[g][r]);
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
