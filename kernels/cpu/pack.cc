// Packing moves of the CPU backend, compiled per instruction set like the kernels (the backend
// itself is built for baseline x86-64): the per-tile transposes of K and V, and the conversion
// of the caller's rows to float32. They run once per ring step on every key and value, so their
// cost is a fixed part of every step (more of a half-masked striped step than of a dense one).
#include <cstdint>
#include <cstring>

#include "core/dtype.h"
#include "cpu/attention_kernels.h"
#include "cpu/simd.h"
#include "cpu/transpose.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {

// src [kBlockK][ld] -> dst [ld][kBlockK] (32-bit elements, moved as they are: floats or pairs of
// bf16). (An AVX-512 in-register transpose measured 2.5x faster on its own but no faster in the
// unpack, which is bound by memory.)
void TransposeTile32(const uint32_t* src, int64_t ld, uint32_t* dst) {
  BlockedTranspose(src, ld, dst);
}

// dst[0..n) = src[0..n) * mul, converted from the storage dtype to float32.
void LoadRowF32(const void* src, int dtype, int64_t n, float mul, float* __restrict dst) {
  switch (static_cast<DType>(dtype)) {
    case DType::kF32: {
      const float* s = static_cast<const float*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = s[i] * mul;
      break;
    }
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if defined(__F16C__)  // the AVX2 and AVX-512 builds: VCVTPH2PS, exact like F16ToF32
      const __m256 m = _mm256_set1_ps(mul);
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))), m));
#endif
      for (; i < n; ++i) dst[i] = F16ToF32(s[i]) * mul;
      break;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]) * mul;
      break;
    }
  }
}

// dst[0..n) = src[0..n) * mul, converted from float32 to the storage dtype: round to nearest
// even, NaN stays NaN (what F32ToBF16 / F32ToF16 do, element by element).
void StoreRowF32(const float* __restrict src, int64_t n, float mul, int dtype, void* dst) {
  switch (static_cast<DType>(dtype)) {
    case DType::kF32: {
      float* d = static_cast<float*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = src[i] * mul;
      break;
    }
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      int64_t i = 0;
#if defined(__F16C__)  // VCVTPS2PH, round to nearest even
      const __m256 m = _mm256_set1_ps(mul);
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_mul_ps(_mm256_loadu_ps(src + i), m), _MM_FROUND_TO_NEAREST_INT));
#endif
      for (; i < n; ++i) d[i] = F32ToF16(src[i] * mul);
      break;
    }
    case DType::kBF16: {
      // F32ToBF16 written branch-free, so that it vectorizes.
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) {
        const float f = src[i] * mul;
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
        const uint32_t nan = (bits >> 16) | 0x40u;
        d[i] = static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
      }
      break;
    }
  }
}

// out[2d] = a[d], out[2d + 1] = b[d] for d < n (16-bit elements; a NULL row reads as zeros):
// two rows paired for a B operand of the AMX tile products.
void PairRows16(const uint16_t* __restrict a, const uint16_t* __restrict b, int64_t n, uint16_t* __restrict out) {
  uint32_t* o = reinterpret_cast<uint32_t*>(out);
  if (a != nullptr && b != nullptr) {
    for (int64_t d = 0; d < n; ++d) o[d] = uint32_t{a[d]} | uint32_t{b[d]} << 16;
  } else if (a != nullptr) {
    for (int64_t d = 0; d < n; ++d) o[d] = a[d];
  } else {
    std::memset(out, 0, static_cast<size_t>(n) * 4);
  }
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
