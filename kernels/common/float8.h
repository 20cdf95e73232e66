// float8_e4m3fn (the OCP FP8 E4M3 format PyTorch and CUDA call e4m3fn): 1 sign bit, 4 exponent bits
// of bias 7, 3 mantissa bits; no infinities, and S.1111.111 is NaN, so the largest finite magnitude
// is 448. Every value is exact in float32 (and in bfloat16 and float16). Written once for the host
// (the CPU backend) and the CUDA kernels (nvcc compiles it for both sides).
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

}  // namespace stria
