// The bf16 forward tile on AMX (Intel Sapphire Rapids and later), part of the "amx" kernel build.
//
// Both products run on the tile unit, S = Q·Kᵀ and O += P·V, each TDPBF16PS a 16 x 16 x 32
// product into float32; the online softmax between them is the float32 one of the other
// forward kernels (online_softmax.h), and P is rounded to bf16 for its product with V, as GPU
// flash kernels do. Q and K stay exactly the caller's bf16 values: the scale is applied to the
// float32 scores inside the softmax, not to Q before rounding.
//
// Eight tile registers, each 16 rows x 64 bytes: 0-3 accumulate a 32 x 32 float32 block, 4-5
// hold two 16-row A operands and 6-7 two 16-column B operands, so every A and B load feeds two
// tile products. B operands are stored pre-paired (the VNNI layout TDPBF16PS reads, see
// FwdTileArgsBf16), so a B tile is one strided load.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/attention_kernels.h"
#include "cpu/online_softmax.h"
#include "cpu/simd.h"
#include "cpu/tile_mask.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

static_assert(kBlockQ % 32 == 0 && kBlockK % 32 == 0, "tiles are whole 32 x 32 tile blocks");

// The layout LDTILECFG reads (palette 1).
struct alignas(64) TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

void ConfigureTiles() {
  TileConfig cfg;
  std::memset(&cfg, 0, sizeof(cfg));
  cfg.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  _tile_loadconfig(&cfg);
}

// The four accumulator tiles to a 32 x 32 float32 block at c (row stride ldc floats), or back.
inline void LoadBlock(const float* c, int64_t ldc) {
  _tile_loadd(0, c, ldc * 4);
  _tile_loadd(1, c + 16, ldc * 4);
  _tile_loadd(2, c + 16 * ldc, ldc * 4);
  _tile_loadd(3, c + 16 * ldc + 16, ldc * 4);
}
inline void StoreBlock(float* c, int64_t ldc) {
  _tile_stored(0, c, ldc * 4);
  _tile_stored(1, c + 16, ldc * 4);
  _tile_stored(2, c + 16 * ldc, ldc * 4);
  _tile_stored(3, c + 16 * ldc + 16, ldc * 4);
}
// Blocks += A[32 x 32] · B[32 x 32]: a0/a1 the two 16-row halves of A (row stride lda bytes),
// b0/b1 the two 16-column halves of B, pre-paired (pair-row stride ldb bytes).
inline void MultiplyBlock(const void* a0, const void* a1, int64_t lda, const void* b0, const void* b1, int64_t ldb) {
  _tile_loadd(4, a0, lda);
  _tile_loadd(5, a1, lda);
  _tile_loadd(6, b0, ldb);
  _tile_loadd(7, b1, ldb);
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// s [kBlockQ][kBlockK] = Q tile · K tileᵀ, float32.
void TileScoresAmx(const uint16_t* q, const uint16_t* kt, int64_t Dp, float* s) {
  for (int64_t bi = 0; bi < kBlockQ; bi += 32)
    for (int64_t bj = 0; bj < kBlockK; bj += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t d = 0; d < Dp; d += 32) {
        const uint16_t* b = kt + (d / 2) * kBlockK * 2;  // pair rows d/2 .. d/2 + 15
        MultiplyBlock(q + bi * Dp + d, q + (bi + 16) * Dp + d, Dp * 2, b + bj * 2, b + (bj + 16) * 2,
                      kBlockK * 4);
      }
      StoreBlock(s + bi * kBlockK + bj, kBlockK);
    }
}

// acc [kBlockQ][Dp] += P · V tile, P [kBlockQ][kBlockK] bf16.
void AccumulatePV(const uint16_t* p, const uint16_t* v, int64_t Dp, float* acc) {
  for (int64_t bi = 0; bi < kBlockQ; bi += 32)
    for (int64_t bd = 0; bd < Dp; bd += 32) {
      LoadBlock(acc + bi * Dp + bd, Dp);
      for (int64_t kk = 0; kk < kBlockK; kk += 32) {
        const uint16_t* b = v + (kk / 2) * Dp * 2;  // key pairs kk/2 .. kk/2 + 15
        MultiplyBlock(p + bi * kBlockK + kk, p + (bi + 16) * kBlockK + kk, kBlockK * 2, b + bd * 2,
                      b + (bd + 16) * 2, Dp * 4);
      }
      StoreBlock(acc + bi * Dp + bd, Dp);
    }
}

// Probabilities to bf16, round to nearest even (VCVTNE2PS2BF16).
void RoundProbabilities(const float* s, uint16_t* p) {
  for (int64_t i = 0; i < kBlockQ * kBlockK; i += 32) {
    const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + i + 16), _mm512_loadu_ps(s + i));
    _mm512_storeu_si512(p + i, (__m512i)two);
  }
}

}  // namespace

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
  ConfigureTiles();
  for (int64_t kt = item_lo / kBlockK; kt * kBlockK < item_hi; ++kt) {
    const int64_t j0 = kt * kBlockK;
    for (int g = 0; g < kBf16QueryTiles; ++g) {
      if (j0 + kBlockK <= k_lo[g] || j0 >= k_hi[g]) continue;
      const int64_t i0 = a.q0 + g * kBlockQ;
      float* acc = a.acc + i0 * Dp;
      TileScoresAmx(a.q + i0 * Dp, a.kt + kt * Dp * kBlockK, Dp, s);
      if (!TileFull(mk, i0, j0)) ApplyMask(mk, i0, j0, s);
      SoftmaxTile(s, cols, kBlockQ, a.scale, a.m + i0, a.l + i0, lsum[g], acc, Dp);
      RoundProbabilities(s, p);
      AccumulatePV(p, a.v + kt * Dp * kBlockK, Dp, acc);
    }
  }
  _tile_release();  // the thread's tile state back to init: no AMX context to save on a switch
  for (int g = 0; g < a.q_tiles; ++g)
    for (int64_t r = 0; r < kBlockQ; ++r) a.l[a.q0 + g * kBlockQ + r] += HSum(lsum[g][r]);
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
