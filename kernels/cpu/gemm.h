// The register-blocked GEMMs of the CPU kernels (attention_kernels.cc's tiles, decode.cc's key
// blocks): C[MR x NV*VL] (+)= A·B, with A read as broadcast scalars through two strides (so Aᵀ
// costs nothing) and B as contiguous vectors. Compiled per instruction set with its includer.
#pragma once

#include <cstdint>

#include "cpu/simd.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// C[M x NVV*VL] (+)= sum_k A[i*ars + k*acs] * B[k*ldb + j].
template <int M, int NVV, bool kAccumulate>
inline void MicroKernel(int64_t K, const float* __restrict A, int64_t ars, int64_t acs, const float* __restrict B,
                        int64_t ldb, float* __restrict C, int64_t ldc) {
  vf c[M][NVV];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NVV; ++v) c[i][v] = kAccumulate ? Load(C + i * ldc + v * VL) : vf{};
  for (int64_t k = 0; k < K; ++k) {
    vf b[NVV];
    for (int v = 0; v < NVV; ++v) b[v] = Load(B + k * ldb + v * VL);
    const float* a = A + k * acs;
    for (int i = 0; i < M; ++i) {
      vf ai = Splat(a[i * ars]);
      for (int v = 0; v < NVV; ++v) c[i][v] += ai * b[v];
    }
  }
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NVV; ++v) Store(C + i * ldc + v * VL, c[i][v]);
}

// MicroKernel<MR, v> for a run-time v in 1 .. V.
template <int V, bool kAccumulate>
inline void MicroKernelTail(int64_t v, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B, int64_t ldb,
                            float* C, int64_t ldc) {
  if constexpr (V > 1) {
    if (v < V) return MicroKernelTail<V - 1, kAccumulate>(v, K, A, ars, acs, B, ldb, C, ldc);
  }
  MicroKernel<MR, V, kAccumulate>(K, A, ars, acs, B, ldb, C, ldc);
}

// C[M x N] (+)= A[M x K] · B[K x N]; M a multiple of MR, N of VL.
// pf, when given: pf_floats of data the next step needs, prefetched into L2 a slice per row group
// (see ForwardTile).
template <bool kAccumulate>
void Gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B, int64_t ldb,
          float* C, int64_t ldc, const float* pf = nullptr, int64_t pf_floats = 0) {
  const int64_t pf_slice = pf_floats / (M / MR);
  for (int64_t i = 0; i < M; i += MR) {
    if (pf != nullptr)
      for (int64_t f = 0; f < pf_slice; f += 64 / sizeof(float)) __builtin_prefetch(pf + i / MR * pf_slice + f, 0, 1);
    int64_t j = 0;
    for (; j + NV * VL <= N; j += NV * VL)
      MicroKernel<MR, NV, kAccumulate>(K, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc);
    // The last 1 .. NV - 1 vectors in one micro-tile, not one each: a row group of a diagonal
    // tile computes only the columns it may see, and a 1-vector micro-tile is load-bound.
    if (j < N)
      MicroKernelTail<NV - 1, kAccumulate>((N - j) / VL, K, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc);
  }
}

// Gemm for any M: the rows past the last whole micro-tile one at a time (a decode item's rows are
// its new tokens times the query heads of a group, any count).
template <bool kAccumulate>
void GemmAnyRows(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B, int64_t ldb,
                 float* C, int64_t ldc) {
  const int64_t whole = M / MR * MR;
  if (whole > 0) Gemm<kAccumulate>(whole, N, K, A, ars, acs, B, ldb, C, ldc);
  for (int64_t i = whole; i < M; ++i) {
    int64_t j = 0;
    for (; j + NV * VL <= N; j += NV * VL)
      MicroKernel<1, NV, kAccumulate>(K, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc);
    for (; j < N; j += VL) MicroKernel<1, 1, kAccumulate>(K, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc);
  }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
