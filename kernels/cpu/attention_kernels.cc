// Flash-style attention tiles for the CPU, written once with GCC vector extensions and compiled
// per instruction set (kernels/CMakeLists.txt): the same source gives 4-, 8- and 16-float vectors.
//
// The hot loops are small register-blocked GEMMs, C[MR x NV*VL] (+)= A·B, with A read as
// broadcast scalars through two strides (so Aᵀ costs nothing) and B as contiguous vectors. Every
// product of attention is one of those once K (and V for the backward) is stored transposed per
// tile: S = Q·Kᵀ, O += P·V, dV += Pᵀ·dO, dP = dO·Vᵀ, dQ += dS·K, dK += dSᵀ·Q.
// Softmax runs in the log2 domain (Q is pre-scaled by log2 e) so each exponential is one exp2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/attention_kernels.h"
#include "cpu/gemm.h"
#include "cpu/online_softmax.h"
#include "cpu/simd.h"
#include "cpu/softcap.h"
#include "cpu/tile_mask.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// The key columns [0, n) of tile (i0, j0) that rows r0 .. r0 + MR - 1 may see, n rounded up to
// whole vectors: on a tile the diagonal crosses, a micro-tile row group computes only these
// (about half the tile), instead of the whole tile and then masking it.
inline int64_t GroupCols(const BlockMask& m, int64_t i0, int64_t r0, int64_t j0) {
  int64_t hi = 0;
  for (int64_t r = r0; r < r0 + MR; ++r) {
    int64_t lo, h;
    RowRange(m, i0 + r, &lo, &h);
    if (h > lo) hi = std::max(hi, h - j0);
  }
  hi = std::min<int64_t>(hi, kBlockK);
  return (hi + VL - 1) / VL * VL;
}

// S = Q·Kᵀ for a tile: whole, or on a masked tile per row group over its GroupCols (the columns
// left out are set to -inf by ApplyMask, which follows). cols[g] gets group g's width.
void TileScores(const BlockMask& mk, bool full, int64_t i0, int64_t j0, int64_t D, const float* q, int64_t Dp,
                const float* kt_tile, float* s, int64_t* cols, const float* pf = nullptr, int64_t pf_floats = 0) {
  if (full) {
    Gemm<false>(kBlockQ, kBlockK, D, q, Dp, 1, kt_tile, kBlockK, s, kBlockK, pf, pf_floats);
    for (int64_t g = 0; g < kBlockQ / MR; ++g) cols[g] = kBlockK;
    return;
  }
  for (int64_t g = 0; g < kBlockQ / MR; ++g) {
    cols[g] = GroupCols(mk, i0, g * MR, j0);
    if (cols[g] > 0)
      Gemm<false>(MR, cols[g], D, q + g * MR * Dp, Dp, 1, kt_tile, kBlockK, s + g * MR * kBlockK, kBlockK);
  }
  ApplyMask(mk, i0, j0, s);
}

void ForwardTile(const FwdTileArgs& a) {
  const PackedShape& sh = *a.shape;
  const BlockMask& mk = *a.mask;
  const int64_t Dp = sh.Dp, D = sh.D;
  const int64_t i0 = a.q0;
  // The keys any row of this tile may see.
  const int64_t row_lo = std::max(i0, mk.q_begin), row_hi = std::min(i0 + kBlockQ, mk.q_end);
  if (row_lo >= row_hi) return;
  int64_t k_lo = mk.k_begin, k_hi = mk.k_end;
  if (mk.diagonal) k_hi = std::min(k_hi, row_hi - 1 + mk.offset + 1);
  DocumentKeyRange(mk, row_lo, row_hi, &k_lo, &k_hi);
  if (k_hi <= k_lo) return;

  const float* q = a.q + i0 * Dp;
  float* acc = a.acc + i0 * Dp;
  float* m = a.m + i0;
  float* l = a.l + i0;
  float* s = a.scratch;
  int64_t cols[kBlockQ / MR];
  vf lsum[kBlockQ] = {};  // per-lane partial row sums, added into l at the end
  for (int64_t kt = k_lo / kBlockK; kt * kBlockK < k_hi; ++kt) {
    const int64_t j0 = kt * kBlockK;
    const bool full = TileFull(mk, i0, j0);
    // Each block of K and V comes from L3 or memory once per query tile: while the FMA units
    // work on one operand, the next is prefetched into L2, V during S = Q·Kᵀ and the next Kᵀ
    // tile during O += P·V (about +5% once a head's K and V outgrow L2).
    const float* next_kt = (kt + 1) * kBlockK < k_hi ? a.kt + (kt + 1) * Dp * kBlockK : nullptr;
    TileScores(mk, full, i0, j0, D, q, Dp, a.kt + kt * Dp * kBlockK, s, cols, a.v + j0 * Dp, Dp * kBlockK);
    if (a.softcap2 > 0.f)
      for (int64_t r = 0; r < kBlockQ; ++r) SoftcapRow(s + r * kBlockK, cols[r / MR], 1.0f, a.softcap2);
    SoftmaxTile(s, cols, MR, 1.0f, m, l, lsum, acc, Dp);
    // O += P·V, on a masked tile per row group over the columns it computed.
    if (full) {
      Gemm<true>(kBlockQ, Dp, kBlockK, s, kBlockK, 1, a.v + j0 * Dp, Dp, acc, Dp, next_kt, Dp * kBlockK);
      continue;
    }
    for (int64_t g = 0; g < kBlockQ / MR; ++g)
      if (cols[g] > 0)
        Gemm<true>(MR, Dp, cols[g], s + g * MR * kBlockK, kBlockK, 1, a.v + j0 * Dp, Dp, acc + g * MR * Dp, Dp);
  }
  for (int64_t r = 0; r < kBlockQ; ++r) l[r] += HSum(lsum[r]);
}

void BackwardItem(const BwdItemArgs& a) {
  const PackedShape& sh = *a.shape;
  const BlockMask& mk = *a.mask;
  const int64_t Dp = sh.Dp, D = sh.D;
  float* s = a.scratch;                    // scores, then P
  float* dp = s + kBlockQ * kBlockK;       // dP, then dS
  float* dk_acc = dp + kBlockQ * kBlockK;  // [kBlockK][Dp]
  float* dv_acc = dk_acc + kBlockK * Dp;   // [kBlockK][Dp]
  float* slope = dv_acc + kBlockK * Dp;    // softcapping's dS factor 1 - tanh², [kBlockQ][kBlockK]
  const bool softcap = a.softcap2 > 0.f;
  int64_t cols[kBlockQ / MR];
  for (int64_t kt = a.kt0; kt < a.kt_end; kt += a.kt_stride) {
    const int64_t j0 = kt * kBlockK;
    int64_t i_lo, i_hi;
    if (!QueriesOfKeyTile(mk, j0, &i_lo, &i_hi)) continue;
    std::memset(dk_acc, 0, sizeof(float) * 2 * kBlockK * Dp);
    const float* kt_tile = a.kt + kt * Dp * kBlockK;
    const float* vt_tile = a.vt + kt * Dp * kBlockK;
    const float* k_rows = a.k + j0 * Dp;
    for (int g = 0; g < a.group; ++g) {
      const float* q = a.q + g * a.head_stride;
      const float* dout = a.dout + g * a.head_stride;
      float* dq = a.dq + g * a.head_stride;
      const float* lse2 = a.lse2 + g * a.row_head_stride;
      const float* delta = a.delta + g * a.row_head_stride;
      for (int64_t i0 = (i_lo / kBlockQ) * kBlockQ; i0 < i_hi; i0 += kBlockQ) {
        const float* qt = q + i0 * Dp;
        const float* dot = dout + i0 * Dp;
        // S, dP, dS and dQ run per row group over the columns it may see (GroupCols) on a
        // masked tile; P and dS are zeroed past them for the key-row products dV and dK.
        const bool full = TileFull(mk, i0, j0);
        TileScores(mk, full, i0, j0, D, qt, Dp, kt_tile, s, cols);
        for (int64_t r = 0; r < kBlockQ; ++r) {
          float* row = s + r * kBlockK;
          const int64_t n = cols[r / MR];
          const float lse = lse2[i0 + r];
          if (lse == kNegInf) {  // a row that saw no key anywhere has no gradient
            std::memset(row, 0, sizeof(float) * kBlockK);
            // Its slope too: dS multiplies by it below, and 0 times a stale NaN or inf is NaN.
            if (softcap) std::memset(slope + r * kBlockK, 0, sizeof(float) * kBlockK);
            continue;
          }
          if (softcap) SoftcapRow(row, n, 1.0f, a.softcap2, slope + r * kBlockK);
          const vf lv = Splat(lse);
          for (int64_t c = 0; c < n; c += VL) Store(row + c, Exp2(Load(row + c) - lv));
          std::memset(row + n, 0, sizeof(float) * (kBlockK - n));
        }
        // dV += Pᵀ·dO
        Gemm<true>(kBlockK, Dp, kBlockQ, s, 1, kBlockK, dot, Dp, dv_acc, Dp);
        // dP = dO·Vᵀ, then dS = P ∘ (dP − delta)
        for (int64_t g = 0; g < kBlockQ / MR; ++g)
          if (cols[g] > 0)
            Gemm<false>(MR, cols[g], D, dot + g * MR * Dp, Dp, 1, vt_tile, kBlockK, dp + g * MR * kBlockK, kBlockK);
        for (int64_t r = 0; r < kBlockQ; ++r) {
          const int64_t n = cols[r / MR];
          const vf dl = Splat(delta[i0 + r]);
          float* prow = s + r * kBlockK;
          float* drow = dp + r * kBlockK;
          for (int64_t c = 0; c < n; c += VL) Store(drow + c, Load(prow + c) * (Load(drow + c) - dl));
          // Through the softcap: ds/dx = 1 - tanh² for the uncapped score x.
          if (softcap)
            for (int64_t c = 0; c < n; c += VL) Store(drow + c, Load(drow + c) * Load(slope + r * kBlockK + c));
          std::memset(drow + n, 0, sizeof(float) * (kBlockK - n));
        }
        // dQ += dS·K ; dK += dSᵀ·Q
        for (int64_t g = 0; g < kBlockQ / MR; ++g)
          if (cols[g] > 0)
            Gemm<true>(MR, Dp, cols[g], dp + g * MR * kBlockK, kBlockK, 1, k_rows, Dp, dq + (i0 + g * MR) * Dp, Dp);
        Gemm<true>(kBlockK, Dp, kBlockQ, dp, 1, kBlockK, qt, Dp, dk_acc, Dp);
      }
    }
    // Q was pre-scaled by scale·log2(e); dK wants scale·dSᵀ·Q, hence the ln 2.
    const int64_t rows = std::min(kBlockK, sh.Lk - j0);
    for (int64_t r = 0; r < rows; ++r) {
      float* dkr = a.dk + (j0 + r) * a.dkv_row_stride;
      float* dvr = a.dv + (j0 + r) * a.dkv_row_stride;
      const float* ka = dk_acc + r * Dp;
      const float* va = dv_acc + r * Dp;
      for (int64_t d = 0; d < D; ++d) {
        dkr[d] += ka[d] * kLn2;
        dvr[d] += va[d];
      }
    }
  }
}

}  // namespace

#define STRIA_STR2(x) #x
#define STRIA_STR(x) STRIA_STR2(x)
#if defined(STRIA_ISA_amx) || defined(STRIA_ISA_avx512bf16)
void ForwardTileBf16(const FwdTileArgsBf16& a);   // bf16_forward.cc
void BackwardItemBf16(const BwdItemArgsBf16& a);  // bf16_backward.cc
#define STRIA_FORWARD_BF16 ForwardTileBf16
#define STRIA_BACKWARD_BF16 BackwardItemBf16
#else
#define STRIA_FORWARD_BF16 nullptr
#define STRIA_BACKWARD_BF16 nullptr
#endif
void TransposeTile32(const uint32_t* src, int64_t ld, uint32_t* dst);             // pack.cc
void LoadRowF32(const void* src, int dtype, int64_t n, float mul, float* dst);    // pack.cc
void StoreRowF32(const float* src, int64_t n, float mul, int dtype, void* dst);   // pack.cc
void PairRows16(const uint16_t* a, const uint16_t* b, int64_t n, uint16_t* out);  // pack.cc
void DecodeChunk(const DecodeChunkArgs& a);                                       // decode.cc
extern const KernelTable kTable;
const KernelTable kTable = {
    STRIA_STR(STRIA_ISA_NAME), VL,         ForwardTile, BackwardItem, STRIA_FORWARD_BF16, STRIA_BACKWARD_BF16,
    TransposeTile32,           LoadRowF32, StoreRowF32, PairRows16,   DecodeChunk,
};

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
