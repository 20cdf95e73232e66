// Hopper's FP8 warpgroup products (wgmma.mma_async with .e4m3 operands, sm_90a), the primitives of
// an attention forward on float8_e4m3fn inputs, behind wgmma_api.cuh's two-way scheme (inline PTX
// for nvcc, the warp emulator of tests/cuda_emu when STRIA_CUDA_EMULATE is defined).
//
// FP8 products differ from the 16-bit ones in three ways the kernels must follow:
//  - K is 32 per instruction (one 128-byte swizzled row holds 128 values, so a K-major tile of
//    128 columns is one column block, and the k-th step starts 32 bytes in, as the 16-bit k-th
//    step of 16 columns does);
//  - both shared-memory operands must be K-major (no transposed forms): O += P V needs V with its
//    keys contiguous, i.e. transposed before the product;
//  - a register A fragment holds four values per register, four consecutive K indices (row g,
//    K 4 t .. 4 t + 3 in register 0, row g + 8 in 1, K 16 + 4 t .. in 2 and 3), while the f32
//    accumulator of S = Q K^T gives a thread two consecutive keys per n8 tile. PackPE4m3 packs
//    the probabilities as the accumulator holds them, and the keys of V are permuted to match
//    (E4m3PvKey): the product sums over keys in another order, which changes nothing.
#pragma once

#include <cstdint>

#include "common/float8.h"
#include "cuda/wgmma_api.cuh"

#if defined(STRIA_CUDA_EMULATE)
namespace stria {
namespace cuda {
namespace emu {
namespace detail {
// The emulator's e4m3 wgmma (tests/cuda_emu/cuda_emu.cc): A in registers when `a` is not NULL,
// else by descriptor; both shared-memory operands K-major.
void WgmmaE4m3(int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b, bool accumulate);
}  // namespace detail
}  // namespace emu
}  // namespace cuda
}  // namespace stria
#endif

namespace stria {
namespace cuda {

// The key at position `pos` of P V's K order: within each 16, position 4 t + i holds key
// 2 t + (i & 1) + 8 (i >> 1), the key the accumulator of S gives lane t's i-th value of the
// register PackPE4m3 fills. V's transposed tile stores its keys in this order.
STRIA_HD int E4m3PvKey(int pos) {
  const int t = (pos & 15) >> 2, i = pos & 3;
  return (pos & ~15) + 2 * t + (i & 1) + 8 * (i >> 1);
}

// Four floats as e4m3 codes in one register, x0 in the low byte (round to nearest even, saturating
// at +-448).
STRIA_DEVICE uint32_t PackE4m3x4(float x0, float x1, float x2, float x3) {
#if defined(STRIA_CUDA_EMULATE)
  return static_cast<uint32_t>(F32ToFloat8E4M3(x0)) | static_cast<uint32_t>(F32ToFloat8E4M3(x1)) << 8 |
         static_cast<uint32_t>(F32ToFloat8E4M3(x2)) << 16 | static_cast<uint32_t>(F32ToFloat8E4M3(x3)) << 24;
#else
  uint16_t lo, hi;  // cvt's first source goes to the upper byte
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  return static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
#endif
}

// P, in the accumulator layout of a 64 x kN score tile (element 4 j + c: row 8 (c >> 1), key
// 8 j + 2 t + (c & 1)), as the e4m3 A fragments of kN / 32 products of K 32, keys in E4m3PvKey's
// order.
template <int kN>
STRIA_DEVICE void PackPE4m3(const float (&s)[kN / 2], uint32_t (&pa)[kN / 32][4]) {
  STRIA_UNROLL
  for (int kk = 0; kk < kN / 32; ++kk) {
    const float* c = s + 16 * kk;
    pa[kk][0] = PackE4m3x4(c[0], c[1], c[4], c[5]);
    pa[kk][1] = PackE4m3x4(c[2], c[3], c[6], c[7]);
    pa[kk][2] = PackE4m3x4(c[8], c[9], c[12], c[13]);
    pa[kk][3] = PackE4m3x4(c[10], c[11], c[14], c[15]);
  }
}

#if STRIA_HAS_WGMMA
// D (64 x N, f32) (+)= A (64 x 32) B (32 x N), e4m3 operands; A and B K-major in shared memory.
template <int N>
STRIA_DEVICE void wgmma_ss_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);
// The same with A in registers (the fragment above; per warp rows 16 * (warp % 4) of the 64).
template <int N>
STRIA_DEVICE void wgmma_rs_e4m3(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, bool accumulate);

#if defined(STRIA_CUDA_EMULATE)
template <int N>
inline void wgmma_ss_e4m3(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu::detail::WgmmaE4m3(N, d, nullptr, desc_a, desc_b, accumulate);
}
template <int N>
inline void wgmma_rs_e4m3(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, bool accumulate) {
  emu::detail::WgmmaE4m3(N, d, a, 0, desc_b, accumulate);
}
#else
// As wgmma_api.cuh's: N/2 accumulator operands first, then A, B and the predicate (IA, IB, IP).
#define STRIA_WGMMA_E4M3_SS(N, REGS, FLIST, IA, IB, IP)                                                               \
  template <>                                                                                                         \
  STRIA_DEVICE void wgmma_ss_e4m3<N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP                                                              \
                 ", 0;\n"                                                                                             \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " REGS ", %" IA ", %" IB ", p, 1, 1;\n}\n" \
                 : FLIST(d)                                                                                           \
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))                                        \
                 : "memory");                                                                                         \
  }
#define STRIA_WGMMA_E4M3_RS(N, REGS, FLIST, IA, IB, IP)                                                              \
  template <>                                                                                                        \
  STRIA_DEVICE void wgmma_rs_e4m3<N>(float(&d)[N / 2], const uint32_t a[4], uint64_t desc_b, bool accumulate) {      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP                                                             \
                 ", 0;\n"                                                                                            \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " REGS ", " IA ", %" IB ", p, 1, 1;\n}\n" \
                 : FLIST(d)                                                                                          \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))        \
                 : "memory");                                                                                        \
  }
STRIA_WGMMA_E4M3_SS(64, STRIA_R32, STRIA_F32, "32", "33", "34")
STRIA_WGMMA_E4M3_SS(128, STRIA_R64, STRIA_F64, "64", "65", "66")
STRIA_WGMMA_E4M3_RS(64, STRIA_R32, STRIA_F32, "{%32,%33,%34,%35}", "36", "37")
STRIA_WGMMA_E4M3_RS(128, STRIA_R64, STRIA_F64, "{%64,%65,%66,%67}", "68", "69")
#undef STRIA_WGMMA_E4M3_SS
#undef STRIA_WGMMA_E4M3_RS
#endif
#endif  // STRIA_HAS_WGMMA

}  // namespace cuda
}  // namespace stria
