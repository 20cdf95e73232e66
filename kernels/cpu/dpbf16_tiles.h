// The bf16 products of the "avx512bf16" kernel build (bf16_tiles.h has their contract), for CPUs
// with AVX512-BF16 but no AMX (AMD Zen 4 and 5, Intel Cooper Lake): VDPBF16PS adds to each of 16
// float32 lanes the products of one pair of bf16 elements of A with the matching pair of B, so
// one instruction does twice the multiply-adds of a float32 FMA. B's pre-paired layout, made for
// AMX, is exactly what it reads: 16 columns of one pair row are one 64-byte load.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "cpu/attention_kernels.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// No tile state to set up or give back.
inline void BeginTileProducts() {}
inline void EndTileProducts() {}

// Micro-tile: 8 rows x 32 columns (two vectors) of accumulators, 16 of the 32 registers; per
// pair of K steps, 2 loads of B and 8 broadcasts of an A pair feed 16 VDPBF16PS.
constexpr int64_t kDpRows = 8;
static_assert(32 % kDpRows == 0, "M is a multiple of 32");

inline void TileGemm(const uint16_t* A, int64_t lda, const uint16_t* B, int64_t ldb, float* C, int64_t ldc, int64_t M,
                     int64_t N, int64_t K, bool accumulate) {
  for (int64_t i = 0; i < M; i += kDpRows)
    for (int64_t j = 0; j < N; j += 32) {
      __m512 c[kDpRows][2];
      float* crow = C + i * ldc + j;
      for (int64_t r = 0; r < kDpRows; ++r) {
        c[r][0] = accumulate ? _mm512_loadu_ps(crow + r * ldc) : _mm512_setzero_ps();
        c[r][1] = accumulate ? _mm512_loadu_ps(crow + r * ldc + 16) : _mm512_setzero_ps();
      }
      const uint16_t* a = A + i * lda;
      const uint16_t* b = B + 2 * j;  // pair row p: columns j.. of rows 2p and 2p + 1, interleaved
      for (int64_t p = 0; p < K / 2; ++p, b += ldb) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 32);
        for (int64_t r = 0; r < kDpRows; ++r) {
          int32_t pair;
          std::memcpy(&pair, a + r * lda + 2 * p, sizeof pair);
          const __m512bh ar = (__m512bh)_mm512_set1_epi32(pair);
          c[r][0] = _mm512_dpbf16_ps(c[r][0], ar, b0);
          c[r][1] = _mm512_dpbf16_ps(c[r][1], ar, b1);
        }
      }
      for (int64_t r = 0; r < kDpRows; ++r) {
        _mm512_storeu_ps(crow + r * ldc, c[r][0]);
        _mm512_storeu_ps(crow + r * ldc + 16, c[r][1]);
      }
    }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
