// float8_e4m3fn (the OCP FP8 E4M3 format PyTorch and CUDA call e4m3fn): 1 sign bit, 4 exponent bits
// of bias 7, 3 mantissa bits; no infinities, and S.1111.111 is NaN, so the largest finite magnitude
// is 448. Every value is exact in float32 (and in bfloat16 and float16). Written once for the host
// (the CPU backend) and the CUDA kernels (nvcc compiles it for both sides), with the rounding from
// float32 that FP8 products' operands take.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define STRIA_F8_FN __host__ __device__ inline
#else
#define STRIA_F8_FN inline
#endif

namespace stria {

STRIA_F8_FN float Float8E4M3ToF32(uint8_t x) {
  const uint32_t sign = static_cast<uint32_t>(x & 0x80u) << 24;
  const uint32_t exp = (x >> 3) & 0xFu, mant = x & 0x7u;
  uint32_t bits;
  if (exp == 0xFu && mant == 0x7u) {
    bits = sign | 0x7fc00000u;  // NaN
  } else if (exp == 0) {
    // Subnormal: mant * 2^-9, exact in float32; its bits by the float's own arithmetic.
    float f = static_cast<float>(mant) * 0.001953125f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  } else {
    bits = sign | ((exp + 127u - 7u) << 23) | (mant << 20);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The nearest float8_e4m3fn code to f, ties to the even code, saturating: magnitudes that round
// past 448 (and infinities) give +-448, NaN gives NaN (PTX cvt.rn.satfinite.e4m3x2.f32, which the
// GPU's kernels use; this is the emulator's and the tests' own).
STRIA_F8_FN uint8_t F32ToFloat8E4M3(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);   // NaN
  if (abs >= 0x43e80000u) return static_cast<uint8_t>(sign | 0x7eu);  // >= 464: past 448's rounding range
  if (abs < 0x3c800000u) {
    // Below 2^-6, the subnormals: multiples of 2^-9, so the code is the magnitude in units of 2^-9
    // rounded to the nearest integer, ties to even (8 is the smallest normal's code, 0x08).
    float a;
    std::memcpy(&a, &abs, 4);
    const float q = a * 512.f;  // exact: a power of two
    uint32_t n = static_cast<uint32_t>(q);
    const float rest = q - static_cast<float>(n);
    if (rest > 0.5f || (rest == 0.5f && (n & 1u) != 0)) ++n;
    return static_cast<uint8_t>(sign | n);
  }
  // Normal: the float's exponent and top 3 mantissa bits, rounded to nearest even at bit 20; a carry
  // into the exponent is the next binade, as it should be.
  const uint32_t rounded = abs + 0x7ffffu + ((abs >> 20) & 1u);
  const uint32_t exp = (rounded >> 23) - 127u + 7u, mant = (rounded >> 20) & 7u;
  return static_cast<uint8_t>(sign | (exp << 3) | mant);
}

}  // namespace stria
