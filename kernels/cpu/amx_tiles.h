// The bf16 products of the "amx" kernel build (bf16_tiles.h has their contract): 32 x 32 float32
// blocks accumulated from bf16 operands by TDPBF16PS, each a 16 x 16 x 32 product.
//
// Eight tile registers, each 16 rows x 64 bytes: 0-3 accumulate a 32 x 32 float32 block, 4-5
// hold two 16-row A operands and 6-7 two 16-column B operands, so every A and B load feeds two
// tile products. B operands are stored pre-paired (the VNNI layout TDPBF16PS reads: rows of
// the B matrix two at a time, their elements side by side), so a B tile is one strided load.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/attention_kernels.h"

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

// Before a work item's products: the tile registers' shapes (LDTILECFG).
inline void BeginTileProducts() {
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

// After them: the thread's tile state back to init, so no AMX context is saved on a switch.
inline void EndTileProducts() {
  _tile_release();
}

inline void TileGemm(const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int64_t M,
                     int64_t N, int64_t K, bool accumulate) {
  for (int64_t bi = 0; bi < M; bi += 32)
    for (int64_t bj = 0; bj < N; bj += 32) {
      if (accumulate) {
        LoadBlock(C + bi * ldc + bj, ldc);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t k = 0; k < K; k += 32) {
        const uint16_t* b = B + (k / 2) * ldb;  // pair rows k/2 .. k/2 + 15
        MultiplyBlock(A + bi * lda + k, A + (bi + 16) * lda + k, lda * 2, b + bj * 2, b + (bj + 16) * 2, ldb * 2);
      }
      StoreBlock(C + bi * ldc + bj, ldc);
    }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
