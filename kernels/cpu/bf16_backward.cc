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
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/attention_kernels.h"
#include "cpu/bf16_tiles.h"
#include "cpu/simd.h"
#include "cpu/softcap.h"
#include "cpu/tile_mask.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {

namespace {

// t[i] = row i of a 16 x 16 matrix in, t[j] = its column j out. (The zero-masking forms with every
// lane kept are the plain instructions; they avoid GCC 12's false -Wmaybe-uninitialized on the
// unmasked intrinsics.)
inline void Transpose16x16(__m512 t[16]) {
  constexpr __mmask16 kAll = 0xFFFF;
  __m512 u[16];
  for (int i = 0; i < 16; i += 2) {  // per 128-bit lane: a0 b0 a1 b1 and a2 b2 a3 b3
    u[i] = _mm512_maskz_unpacklo_ps(kAll, t[i], t[i + 1]);
    u[i + 1] = _mm512_maskz_unpackhi_ps(kAll, t[i], t[i + 1]);
  }
  for (int g = 0; g < 16; g += 4) {  // rows 4g'..4g'+3: lane L of t[g + k] holds their column 4L + k
    t[g] = _mm512_maskz_shuffle_ps(kAll, u[g], u[g + 2], 0x44);
    t[g + 1] = _mm512_maskz_shuffle_ps(kAll, u[g], u[g + 2], 0xEE);
    t[g + 2] = _mm512_maskz_shuffle_ps(kAll, u[g + 1], u[g + 3], 0x44);
    t[g + 3] = _mm512_maskz_shuffle_ps(kAll, u[g + 1], u[g + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {  // gather lane L of the four row groups: column 4L + k
    const __m512 x = _mm512_maskz_shuffle_f32x4(kAll, t[k], t[4 + k], 0x88),
                 y = _mm512_maskz_shuffle_f32x4(kAll, t[k], t[4 + k], 0xDD);
    const __m512 z = _mm512_maskz_shuffle_f32x4(kAll, t[8 + k], t[12 + k], 0x88),
                 w = _mm512_maskz_shuffle_f32x4(kAll, t[8 + k], t[12 + k], 0xDD);
    u[k] = _mm512_maskz_shuffle_f32x4(kAll, x, z, 0x88);
    u[8 + k] = _mm512_maskz_shuffle_f32x4(kAll, x, z, 0xDD);
    u[4 + k] = _mm512_maskz_shuffle_f32x4(kAll, y, w, 0x88);
    u[12 + k] = _mm512_maskz_shuffle_f32x4(kAll, y, w, 0xDD);
  }
  for (int i = 0; i < 16; ++i) t[i] = u[i];
}

// dst[j * ld + d] += mul * src[d * kBlockK + j] for j < rows, d < D: a key tile's dKᵀ or dVᵀ
// added to its rows of the ring's dK/dV message, 16 x 16 blocks transposed in registers. The
// message rows are Hkv·D floats apart, often a multiple of 4 KiB, so a column-wise scalar walk
// met the same few L1 sets on every row and took half a short block's backward.
void AddTransposed(const float* src, int64_t D, int64_t rows, float mul, float* dst, int64_t ld) {
  const __m512 m = _mm512_set1_ps(mul);
  for (int64_t j0 = 0; j0 < rows; j0 += 16) {
    const int64_t nj = std::min<int64_t>(16, rows - j0);
    for (int64_t d0 = 0; d0 < D; d0 += 16) {
      const int64_t nd = std::min<int64_t>(16, D - d0);
      const __mmask16 dmask = static_cast<__mmask16>((1u << nd) - 1);
      __m512 t[16];
      for (int i = 0; i < 16; ++i) t[i] = i < nd ? _mm512_loadu_ps(src + (d0 + i) * kBlockK + j0) : _mm512_setzero_ps();
      Transpose16x16(t);
      for (int64_t j = 0; j < nj; ++j) {
        float* row = dst + (j0 + j) * ld + d0;
        _mm512_mask_storeu_ps(row, dmask, _mm512_fmadd_ps(t[j], m, _mm512_maskz_loadu_ps(dmask, row)));
      }
    }
  }
}

}  // namespace

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
  float* slope = dvt + Dp * kBlockK;                       // softcapping's 1 - tanh² [kBlockQ][kBlockK]
  const bool softcap = a.softcap2 > 0.f;
  const vf sv = Splat(softcap ? 1.0f : a.scale);  // capped scores are scaled already
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
          if (softcap) {
            float* srow = slope + r * kBlockK;
            SoftcapRow<true>(prow, kBlockK, a.scale, a.softcap2, srow);
            for (int64_t c = 0; c < kBlockK; c += VL) {
              const vf pv = Exp2(Load(prow + c) - lv);
              Store(prow + c, pv);
              Store(drow + c, pv * (Load(drow + c) - dl) * Load(srow + c));
            }
            continue;
          }
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
    AddTransposed(dkt, sh.D, rows, a.dk_scale, a.dk + j0 * a.dkv_row_stride, a.dkv_row_stride);
    AddTransposed(dvt, sh.D, rows, 1.f, a.dv + j0 * a.dkv_row_stride, a.dkv_row_stride);
  }
  EndTileProducts();
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
