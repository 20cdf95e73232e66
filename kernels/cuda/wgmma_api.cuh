// Hopper (sm_90a) warpgroup primitives: wgmma.mma_async and its fences, behind the same two-way
// scheme as device_api.cuh (inline PTX for nvcc; the warp emulator of tests/cuda_emu when
// STRIA_CUDA_EMULATE is defined). Only sm_90a has these instructions: device code using them must
// sit under STRIA_HAS_WGMMA, which is true for the sm_90a pass of nvcc and in the emulator.
//
// Shared-memory operands are described by 64-bit matrix descriptors (PTX ISA, "matrix descriptor
// format"): start address, leading and stride byte offsets (each >> 4, 14 bits), swizzle mode in
// bits 62-63. Our kernels use one layout only, the 128-byte swizzle: a tile of R rows and C
// 16-bit columns is stored as C/64 column blocks of R rows x 128 bytes, and within every 1024-byte
// group of 8 rows the 16-byte chunk c of row r sits at chunk c ^ (r % 8). SwizzledOffset below is
// that map; the descriptors then read
//  - K-major (A = Q, B = K): rows are M or N, SBO = 1024 (8 rows to the next 8), LBO unused;
//  - MN-major (B = V, the transposed-B form): rows are K, LBO = the column block size (the next
//    64 columns of N), SBO = 1024 (the next 8 rows of K).
#pragma once

#include <cstdint>

#include "cuda/device_api.cuh"
#include "cuda/tile_mask.cuh"  // STRIA_HD

#if defined(STRIA_CUDA_EMULATE) || (defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define STRIA_HAS_WGMMA 1
#else
#define STRIA_HAS_WGMMA 0
#endif

namespace stria {
namespace cuda {

constexpr int kSwizzleBytes = 128;       // one swizzled row: 64 16-bit values
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows: the repeating pattern, its alignment

// Byte offset of 16-bit element (row, col) in a 128B-swizzled tile of `rows` rows whose base is
// 1024-byte aligned.
STRIA_HD int SwizzledOffset(int rows, int row, int col) {
  const int block = col >> 6, chunk = (col & 63) >> 3;
  return block * rows * kSwizzleBytes + row * kSwizzleBytes + ((chunk ^ (row & 7)) << 4) + ((col & 7) << 1);
}

// Rows [r0, r0 + rows) of a [B, L, H, D] tensor for fixed (b, h) into the swizzled tile at `dst`
// (rows past `limit` zero-filled), by all kThreads threads with cp.async.
template <int D, int kThreads>
STRIA_DEVICE void LoadSwizzled(unsigned char* dst, const uint16_t* base, int64_t row_stride, int64_t r0, int rows,
                               int64_t limit) {
  constexpr int kChunks = D / 8;
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r0 + r < limit;
    const uint16_t* src = base + (valid ? (r0 + r) : r0) * row_stride + col;
    cp_async_16(dst + SwizzledOffset(rows, r, col), src, valid);
  }
}

// A descriptor of the 128B-swizzled layout; `smem_addr` is a shared-window address (smem_addr()).
STRIA_HD uint64_t SwizzledDesc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4) |
         (static_cast<uint64_t>((lbo_bytes & 0x3FFFFu) >> 4) << 16) |
         (static_cast<uint64_t>((sbo_bytes & 0x3FFFFu) >> 4) << 32) | (uint64_t{1} << 62);
}
// The descriptor of an operand `bytes` (a multiple of 16) further on in shared memory than
// `desc`'s, with the same strides: its start-address field (bits 0-13, the address over 16) plus
// bytes / 16, which cannot carry out of the field since shared memory ends below 2^18 bytes. A
// product's loop over its k steps builds the first descriptor once and adds a constant per step:
// SwizzledDesc per step cost about six instructions a descriptor, two descriptors a wgmma, which
// in the backward was a fifth of a step's instructions (sm_90a SASS, D 128).
STRIA_HD uint64_t DescPlus(uint64_t desc, uint32_t bytes) {
  const uint32_t lo = static_cast<uint32_t>(desc) + (bytes >> 4);
  return (desc & ~uint64_t{0xFFFFFFFFu}) | lo;
}

}  // namespace cuda
}  // namespace stria

#if !defined(STRIA_CUDA_EMULATE) && STRIA_HAS_WGMMA

// Accumulator operand lists for the asm statements: N/2 floats "+f"(d[i]).
#define STRIA_F8(d, i)                                                                                        \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define STRIA_F16(d) STRIA_F8(d, 0), STRIA_F8(d, 8)
#define STRIA_F32(d) STRIA_F8(d, 0), STRIA_F8(d, 8), STRIA_F8(d, 16), STRIA_F8(d, 24)
#define STRIA_F64(d) STRIA_F32(d), STRIA_F8(d, 32), STRIA_F8(d, 40), STRIA_F8(d, 48), STRIA_F8(d, 56)
#define STRIA_R16 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}"
#define STRIA_R32                                                                                           \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27," \
  "%28,%29,%30,%31}"
#define STRIA_R64                                                                                            \
  "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,"  \
  "%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53," \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}"

namespace stria {
namespace cuda {

// The shared-window address of a shared-memory pointer (what descriptors hold).
STRIA_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// `x`, as a value the compiler cannot see through: what is computed from it is computed where the
// call is, not hoisted out of the loop around it and held in registers across the loop (a
// descriptor is two registers; where a kernel has none to spare, ptxas spills such values).
STRIA_DEVICE uint32_t Opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}
// Orders this thread's earlier register and shared-memory writes before later wgmma reads.
STRIA_DEVICE void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
STRIA_DEVICE void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
STRIA_DEVICE void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Pins register array `r` at this point of the program. wgmma_fence and wgmma_wait order the
// warpgroup's MMAs against memory only: their asm names no register, so without a pin the
// compiler could move arithmetic on an accumulator (or an A fragment) across them, reading it
// before the MMA that writes it has completed, or writing it after the fence that orders it
// before the MMA reads it. Every kernel pins what it touches right after each wait and right
// before each fence; an empty asm that reads and writes the registers costs no instruction.
template <int N>
STRIA_DEVICE void wgmma_fence_operand(float (&r)[N]) {
  STRIA_UNROLL
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N, int M>
STRIA_DEVICE void wgmma_fence_operand(uint32_t (&r)[N][M]) {
  STRIA_UNROLL
  for (int i = 0; i < N; ++i) {
    STRIA_UNROLL
    for (int j = 0; j < M; ++j) asm volatile("" : "+r"(r[i][j])::"memory");
  }
}
// Makes this thread's generic-proxy shared-memory writes (st.shared, cp.async) visible to the
// async proxy that wgmma reads shared memory through.
STRIA_DEVICE void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D (64 x N, f32) (+)= A (64 x 16) B (16 x N): A and B K-major in shared memory (descriptors).
// `accumulate` false: D = A B, the old D ignored.
template <typename T, int N>
STRIA_DEVICE void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);
// The same with A in registers (the m16n8k16 A fragment layout, per warp: rows 16 * (warp % 4)
// of the 64) and B N-major in shared memory (the transposed-B form).
template <typename T, int N>
STRIA_DEVICE void wgmma_rs_tb(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, bool accumulate);
// The same with both operands MN-major in shared memory (transposed A and B): A is stored with
// its K index as rows (dS^T for dQ = dS K), B with its K index as rows too (K for the same).
template <typename T, int N>
STRIA_DEVICE void wgmma_ss_tt(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);
// The same with A K-major and B MN-major in shared memory (dV += P^T dO with P^T stored).
template <typename T, int N>
STRIA_DEVICE void wgmma_ss_tb(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate);

// One specialisation per (dtype, N): N/2 accumulator operands come first, so the operand numbers
// of the descriptors and the predicate depend on N (IA: A, IB: desc B, IP: accumulate). NAME and
// TRANS: the shared-shared forms differ only in their transpose immediates (A, B).
#define STRIA_WGMMA_SS(NAME, TRANS, TYPE, TNAME, N, REGS, FLIST, IA, IB, IP)                                  \
  template <>                                                                                                 \
  STRIA_DEVICE void NAME<TYPE, N>(float(&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP                                                      \
                 ", 0;\n"                                                                                     \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TNAME "." TNAME " " REGS ", %" IA ", %" IB \
                 ", p, 1, 1, " TRANS ";\n}\n"                                                                 \
                 : FLIST(d)                                                                                   \
                 : "l"(desc_a), "l"(desc_b), "r"(static_cast<int>(accumulate))                                \
                 : "memory");                                                                                 \
  }
#define STRIA_WGMMA_RS_TB(TYPE, TNAME, N, REGS, FLIST, IA, IB, IP)                                                  \
  template <>                                                                                                       \
  STRIA_DEVICE void wgmma_rs_tb<TYPE, N>(float(&d)[N / 2], const uint32_t a[4], uint64_t desc_b, bool accumulate) { \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" IP                                                            \
                 ", 0;\n"                                                                                           \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TNAME "." TNAME " " REGS ", " IA ", %" IB        \
                 ", p, 1, 1, 1;\n}\n"                                                                               \
                 : FLIST(d)                                                                                         \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(static_cast<int>(accumulate))       \
                 : "memory");                                                                                       \
  }
STRIA_WGMMA_SS(wgmma_ss, "0, 0", Half, "f16", 32, STRIA_R16, STRIA_F16, "16", "17", "18")
STRIA_WGMMA_SS(wgmma_ss, "0, 0", BFloat, "bf16", 32, STRIA_R16, STRIA_F16, "16", "17", "18")
STRIA_WGMMA_SS(wgmma_ss, "0, 0", Half, "f16", 64, STRIA_R32, STRIA_F32, "32", "33", "34")
STRIA_WGMMA_SS(wgmma_ss, "0, 0", BFloat, "bf16", 64, STRIA_R32, STRIA_F32, "32", "33", "34")
STRIA_WGMMA_SS(wgmma_ss, "0, 0", Half, "f16", 128, STRIA_R64, STRIA_F64, "64", "65", "66")
STRIA_WGMMA_SS(wgmma_ss, "0, 0", BFloat, "bf16", 128, STRIA_R64, STRIA_F64, "64", "65", "66")
STRIA_WGMMA_SS(wgmma_ss_tt, "1, 1", Half, "f16", 64, STRIA_R32, STRIA_F32, "32", "33", "34")
STRIA_WGMMA_SS(wgmma_ss_tt, "1, 1", BFloat, "bf16", 64, STRIA_R32, STRIA_F32, "32", "33", "34")
STRIA_WGMMA_SS(wgmma_ss_tb, "0, 1", Half, "f16", 128, STRIA_R64, STRIA_F64, "64", "65", "66")
STRIA_WGMMA_SS(wgmma_ss_tb, "0, 1", BFloat, "bf16", 128, STRIA_R64, STRIA_F64, "64", "65", "66")
STRIA_WGMMA_RS_TB(Half, "f16", 64, STRIA_R32, STRIA_F32, "{%32,%33,%34,%35}", "36", "37")
STRIA_WGMMA_RS_TB(BFloat, "bf16", 64, STRIA_R32, STRIA_F32, "{%32,%33,%34,%35}", "36", "37")
STRIA_WGMMA_RS_TB(Half, "f16", 128, STRIA_R64, STRIA_F64, "{%64,%65,%66,%67}", "68", "69")
STRIA_WGMMA_RS_TB(BFloat, "bf16", 128, STRIA_R64, STRIA_F64, "{%64,%65,%66,%67}", "68", "69")
#undef STRIA_WGMMA_SS
#undef STRIA_WGMMA_RS_TB

}  // namespace cuda
}  // namespace stria
#endif

#if STRIA_HAS_WGMMA
namespace stria {
namespace cuda {

// The first 1024-byte aligned shared-window address at or after `raw`, where swizzled tiles must
// start (the dynamic shared memory's own start need not be aligned so far).
STRIA_DEVICE unsigned char* AlignToSwizzleAtom(unsigned char* raw) {
  const uint32_t a = smem_addr(raw);
  return raw + (kSwizzleAtomBytes - a % kSwizzleAtomBytes) % kSwizzleAtomBytes;
}

}  // namespace cuda
}  // namespace stria
#endif
