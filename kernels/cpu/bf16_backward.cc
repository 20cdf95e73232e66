// The bf16 backward, part of the "amx" and "avx512bf16" kernel builds: one work item is a range
// of key tiles of one kv head (as in the float32 BackwardItem), against every query tile of its
// query heads. All five are bf16 products into float32 (bf16_tiles.h):
//
//   S  = Q·Kᵀ, dP = dO·Vᵀ        query rows x keys; B operands Kᵀ and Vᵀ paired along Dp
//   dQ += dS·K                    query rows x Dp; B = K paired along keys
//   dVᵀ += dOᵀ·P, dKᵀ += Qᵀ·dS   Dp x keys; A = the query tile transposed (packed once per
//                                call), B = P or dS paired along the query rows
//
// so P and dS never need transposing per tile: they are rounded to bf16 twice, as rows (dS,
// for dQ) and paired along their rows (P and dS, for dVᵀ and dKᵀ). dKᵀ and dVᵀ are transposed
// once per key tile, when added to the ring's dK/dV message. P and dS are float32 until they
// are rounded, as in GPU flash kernels; Q, K, V and dO are the caller's bf16 values.
#include <cstdint>
#include <cstring>

#include "cpu/attention_kernels.h"
#include "cpu/bf16_tiles.h"
#include "cpu/simd.h"
#include "cpu/tile_mask.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {

void BackwardItemBf16(const BwdItemArgsBf16& a) {
  const PackedShape& sh = *a.shape;
  const BlockMask& mk = *a.mask;
  const int64_t Dp = sh.Dp;
  constexpr int64_t kTile = kBlockQ * kBlockK;
  static_assert(kBlockQ == kBlockK, "query and key tiles swap roles in the key-side products");
  float* s = a.scratch;   // S, then P
  float* dp = s + kTile;  // dP, then dS
  uint16_t* p_pairs = reinterpret_cast<uint16_t*>(dp + kTile);
  uint16_t* ds_pairs = p_pairs + kTile;
  uint16_t* ds_rows = ds_pairs + kTile;
  float* dkt = reinterpret_cast<float*>(ds_rows + kTile);  // dKᵀ [Dp][kBlockK]
  float* dvt = dkt + Dp * kBlockK;                         // dVᵀ [Dp][kBlockK]
  const vf sv = Splat(a.scale);
  BeginTileProducts();
  for (int64_t kt = a.kt0; kt < a.kt_end; kt += a.kt_stride) {
    const int64_t j0 = kt * kBlockK;
    int64_t i_lo, i_hi;
    if (!QueriesOfKeyTile(mk, j0, &i_lo, &i_hi)) continue;
    std::memset(dkt, 0, sizeof(float) * 2 * Dp * kBlockK);
    const uint16_t* k_dp = a.kt + kt * Dp * kBlockK;    // Kᵀ paired along Dp
    const uint16_t* k_keys = a.kv + kt * Dp * kBlockK;  // K paired along keys
    const uint16_t* v_dp = a.vt + kt * Dp * kBlockK;    // Vᵀ paired along Dp
    for (int g = 0; g < a.group; ++g) {
      const uint16_t* q = a.q + g * a.head_stride;
      const uint16_t* qt = a.qt + g * a.head_stride;
      const uint16_t* dout = a.dout + g * a.head_stride;
      const uint16_t* doutt = a.doutt + g * a.head_stride;
      float* dq = a.dq + g * a.head_stride;
      const float* lse2 = a.lse2 + g * a.row_head_stride;
      const float* delta = a.delta + g * a.row_head_stride;
      for (int64_t i0 = (i_lo / kBlockQ) * kBlockQ; i0 < i_hi; i0 += kBlockQ) {
        TileGemm(q + i0 * Dp, Dp, k_dp, 2 * kBlockK, s, kBlockK, kBlockQ, kBlockK, Dp, false);
        if (!TileFull(mk, i0, j0)) ApplyMask(mk, i0, j0, s);
        TileGemm(dout + i0 * Dp, Dp, v_dp, 2 * kBlockK, dp, kBlockK, kBlockQ, kBlockK, Dp, false);
        // P = 2^(scale·S − lse), dS = P ∘ (dP − delta); a row that saw no key has no gradient.
        for (int64_t r = 0; r < kBlockQ; ++r) {
          float* prow = s + r * kBlockK;
          float* drow = dp + r * kBlockK;
          const float lse = lse2[i0 + r];
          if (lse == kNegInf) {
            std::memset(prow, 0, sizeof(float) * kBlockK);
            std::memset(drow, 0, sizeof(float) * kBlockK);
            continue;
          }
          const vf lv = Splat(lse), dl = Splat(delta[i0 + r]);
          for (int64_t c = 0; c < kBlockK; c += VL) {
            const vf pv = Exp2(Load(prow + c) * sv - lv);
            Store(prow + c, pv);
            Store(drow + c, pv * (Load(drow + c) - dl));
          }
        }
        PairRows(s, p_pairs);
        PairRows(dp, ds_pairs);
        RoundTile(dp, ds_rows);
        const int64_t qtile = i0 * Dp;  // the query tile's transposed [Dp][kBlockQ] block
        TileGemm(doutt + qtile, kBlockQ, p_pairs, 2 * kBlockK, dvt, kBlockK, Dp, kBlockK, kBlockQ, true);
        TileGemm(qt + qtile, kBlockQ, ds_pairs, 2 * kBlockK, dkt, kBlockK, Dp, kBlockK, kBlockQ, true);
        TileGemm(ds_rows, kBlockK, k_keys, 2 * Dp, dq + i0 * Dp, Dp, kBlockQ, Dp, kBlockK, true);
      }
    }
    const int64_t rows = std::min(kBlockK, sh.Lk - j0);
    for (int64_t d = 0; d < sh.D; ++d)
      for (int64_t r = 0; r < rows; ++r) {
        a.dk[(j0 + r) * a.dkv_row_stride + d] += dkt[d * kBlockK + r] * a.dk_scale;
        a.dv[(j0 + r) * a.dkv_row_stride + d] += dvt[d * kBlockK + r];
      }
  }
  EndTileProducts();
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
