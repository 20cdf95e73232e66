// The bf16 tile products of the CPU kernels (bf16_forward.cc, bf16_backward.cc), on whichever
// unit the kernel build has: AMX tiles (amx_tiles.h, the "amx" build) or AVX512-BF16 dot
// products (dpbf16_tiles.h, the "avx512bf16" build). Each provides
//
//   BeginTileProducts(), EndTileProducts()   around a work item's products;
//   TileGemm(A, lda, B, ldb, C, ldc, M, N, K, accumulate)
//       C[M][N] (+)= A[M][K] · B[K][N] in float32, M, N and K multiples of 32. A: bf16 rows, lda
//       elements apart. B: pre-paired along K, pair row p (rows 2p and 2p + 1, element n of
//       each side by side) at B + p * ldb. C: float32 rows, ldc apart, loaded first when
//       `accumulate`.
//         S = Q·Kᵀ:  A = Q rows, B = Kᵀ paired along the head dim ([Dp/2][keys][2], ldb = 2 * keys).
//         O += P·V:  A = P rows, B = V paired along keys ([keys/2][Dp][2], ldb = 2 * Dp).
//
// and this header adds the roundings to bf16 that both share.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "cpu/attention_kernels.h"

#if defined(STRIA_ISA_amx)
#include "cpu/amx_tiles.h"
#elif defined(STRIA_ISA_avx512bf16)
#include "cpu/dpbf16_tiles.h"
#else
#error "bf16 tile products are in the amx and avx512bf16 kernel builds only"
#endif

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// A 64 x 64 float32 tile to bf16, round to nearest even (VCVTNE2PS2BF16).
inline void RoundTile(const float* s, uint16_t* p) {
  for (int64_t i = 0; i < kBlockQ * kBlockK; i += 32) {
    const __m512bh two = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + i + 16), _mm512_loadu_ps(s + i));
    _mm512_storeu_si512(p + i, (__m512i)two);
  }
}

// A 64 x 64 float32 tile to bf16 paired along its rows, [32][64][2] (a B operand whose K runs
// down the tile's rows: P or dS for the key-side products of the backward).
inline void PairRows(const float* s, uint16_t* p) {
  // [a0 .. a15, b0 .. b15] -> [a0, b0, a1, b1, ...]
  alignas(64) static const uint16_t kInterleave[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
                                                       8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (int64_t r = 0; r < kBlockQ; r += 2)
    for (int64_t n = 0; n < kBlockK; n += 16) {
      const __m512bh two =
          _mm512_cvtne2ps_pbh(_mm512_loadu_ps(s + (r + 1) * kBlockK + n), _mm512_loadu_ps(s + r * kBlockK + n));
      _mm512_storeu_si512(p + ((r / 2) * kBlockK + n) * 2, _mm512_permutexvar_epi16(idx, (__m512i)two));
    }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
