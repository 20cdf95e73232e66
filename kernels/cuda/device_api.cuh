// The few device primitives the CUDA kernels use, behind one small API so that the same kernel
// source compiles in two ways:
//  - by nvcc for the GPU (sm_80 and newer): inline PTX and CUDA intrinsics below;
//  - by a host C++ compiler with STRIA_CUDA_EMULATE defined: the warp-level emulator of
//    tests/cuda_emu runs every CUDA thread of a block as a fiber, so the tile indexing, masks,
//    fragment layouts and online softmax are tested on machines without a GPU.
// Kernels use only what is declared here (plus plain C++): thread/block indices, barriers, warp
// shuffles, ldmatrix, mma.sync m16n8k16, cp.async, float atomics, counters that order CTAs and
// 16-bit float conversions.
// 16-bit floats are carried as uint16_t storage everywhere; `Half` and `BFloat` are tags.
#pragma once

#include <cstdint>

namespace stria {
namespace cuda {

struct Half {};    // IEEE binary16
struct BFloat {};  // bfloat16
struct Float {};   // float32 storage (the SIMT path only)

}  // namespace cuda
}  // namespace stria

// A kernel launch: STRIA_LAUNCH(kernel, grid, block, smem_bytes, stream)(arguments...) returns
// the launch's own cudaError_t. Not `<<<>>>`: that reports a failed launch only through
// cudaGetLastError, which also returns (and clears) an error the caller left pending on its thread,
// so a caller's stale error would fail a stria call and vanish from the caller's view. On the
// host it goes to the emulator's stream launcher, which a model of the CUDA runtime provides
// (tests/cuda_host), so the launchers themselves run in tests without a GPU.
#if defined(STRIA_CUDA_EMULATE)
#define STRIA_LAUNCH_BOUNDS(threads)
#define STRIA_UNROLL
#define STRIA_LAUNCH(kernel, grid, block, smem, stream) \
  ::stria::cuda::emu::StreamLaunch<cudaError_t>((kernel), (grid), (block), (smem), (stream))
#include "cuda_emu.h"  // defines everything below for the host
#else
#define STRIA_LAUNCH_BOUNDS(threads) __launch_bounds__(threads)
#define STRIA_UNROLL _Pragma("unroll")
#define STRIA_LAUNCH(kernel, grid, block, smem, stream) \
  ::stria::cuda::KernelLaunchOf((kernel), (grid), (block), (smem), (stream))
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <utility>

namespace stria {
namespace cuda {

// What STRIA_LAUNCH builds: a launch through cudaLaunchKernelEx, whose status is the launch's alone
// (on failure the runtime also records it as the thread's last error; CudaStatus clears that).
template <typename... Params>
struct KernelLaunch {
  void (*kernel)(Params...);
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  template <typename... Args>
  cudaError_t operator()(Args&&... args) const {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  }
};
template <typename... Params>
KernelLaunch<Params...> KernelLaunchOf(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                                       cudaStream_t stream) {
  return KernelLaunch<Params...>{kernel, grid, block, smem, stream};
}

}  // namespace cuda
}  // namespace stria

#define STRIA_DEVICE __device__ __forceinline__
#define STRIA_GLOBAL __global__
// The block's dynamic shared memory, 16-byte aligned.
#define STRIA_DYNAMIC_SMEM(name) extern __shared__ __align__(16) unsigned char name[]

namespace stria {
namespace cuda {

STRIA_DEVICE int lane_id() {
  return static_cast<int>(threadIdx.x) & 31;
}
STRIA_DEVICE int warp_id() {
  return static_cast<int>(threadIdx.x) >> 5;
}
STRIA_DEVICE void block_sync() {
  __syncthreads();
}
STRIA_DEVICE void warp_sync() {
  __syncwarp();
}
STRIA_DEVICE float shfl_xor(float v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}
STRIA_DEVICE float shfl(float v, int src_lane) {
  return __shfl_sync(0xffffffffu, v, src_lane);
}
STRIA_DEVICE void atomic_add(float* p, float v) {
  atomicAdd(p, v);
}
// p[0] += a, p[1] += b, each atomically; p 8-byte aligned. sm_90 has a two-wide float reduction
// (one instruction, one L2 transaction); earlier GPUs take two.
STRIA_DEVICE void atomic_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(a, b));
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}
// Counters in global memory that order work across CTAs (the ordered dQ, ordered_dq.cuh).
// take_ticket: the counter's value before this call's add, every caller a different one.
STRIA_DEVICE int take_ticket(int* counter) {
  return atomicAdd(counter, 1);
}
// Waits until *counter == want, with acquire semantics: what the CTA that made it so wrote before
// its release is visible after. A count that never gets there is a defect; the wait then stops
// the kernel with a trap (a launch error) after some seconds instead of holding the device.
STRIA_DEVICE void wait_count(const int* counter, int want) {
  for (uint32_t n = 0;; ++n) {
    int v;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];\n" : "=r"(v) : "l"(counter) : "memory");
    if (v == want) return;
    if (n == (1u << 24)) __trap();
    __nanosleep(256);
  }
}
// Stops the kernel with an error (a launch failure the stream reports) where going on would hang.
STRIA_DEVICE void trap() {
  __trap();
}
// *counter += 1 with release semantics: this thread's writes before it (and those it has
// observed) are visible to a wait_count that sees the new value.
STRIA_DEVICE void release_count(int* counter) {
  asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(counter) : "memory");
}
// a / b with the special-function unit's reciprocal (__fdividef: within 2 ulp for |b| below
// 2^126), where the / of a build without fast math is a correctly rounded division with a slow path.
STRIA_DEVICE float fast_div(float a, float b) {
  return __fdividef(a, b);
}
// 2^x as the special-function unit gives it, denormal results flushed to 0
// (ex2.approx.ftz.f32: one MUFU.EX2, what --use_fast_math makes of exp2f). exp2f without fast
// math guards results below 2^-126 with a compare, a predicate and two multiplies around each
// exponential: four more instructions beside every score of a softmax, whose issue slots are
// what the tensor cores wait for. A probability below 2^-126 is 0 to every sum the kernels make.
// Relative error about 2^-22; -inf gives 0, NaN stays NaN.
STRIA_DEVICE float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// 16-bit conversions (round to nearest even), storage as uint16_t.
template <typename T>
STRIA_DEVICE float to_float(uint16_t x);
template <>
STRIA_DEVICE float to_float<Half>(uint16_t x) {
  return __half2float(__ushort_as_half(x));
}
template <>
STRIA_DEVICE float to_float<BFloat>(uint16_t x) {
  return __bfloat162float(__ushort_as_bfloat16(x));
}
template <typename T>
STRIA_DEVICE uint16_t from_float(float x);
template <>
STRIA_DEVICE uint16_t from_float<Half>(float x) {
  return __half_as_ushort(__float2half_rn(x));
}
template <>
STRIA_DEVICE uint16_t from_float<BFloat>(float x) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
// Two floats as one 32-bit register of two 16-bit values: `lo` in bits 0..15.
template <typename T>
STRIA_DEVICE uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(from_float<T>(lo)) | (static_cast<uint32_t>(from_float<T>(hi)) << 16);
}

// D (16x8 f32) += A (16x16, row-major fragments) * B (16x8, column-major fragments), per the PTX
// fragment layouts of mma.m16n8k16: lane = 4*g + t holds A rows g, g+8, columns 2t.., 2t+8..;
// B rows 2t.., 2t+8.. of column g; C/D rows g, g+8, columns 2t, 2t+1.
template <typename T>
STRIA_DEVICE void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
template <>
STRIA_DEVICE void mma_16816<Half>(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
STRIA_DEVICE void mma_16816<BFloat>(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ldmatrix .x4: lanes 8i..8i+7 give the row addresses (16 bytes each) of 8x8 matrix i; register i
// of lane 4g+t receives row g, elements 2t and 2t+1 of matrix i (.trans: row 2t and 2t+1,
// element g, i.e. the matrix transposed).
STRIA_DEVICE void ldmatrix_x4(uint32_t r[4], const void* smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
STRIA_DEVICE void ldmatrix_x4_trans(uint32_t r[4], const void* smem_row) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// 16-byte asynchronous global->shared copy; when !valid the 16 shared bytes are zero-filled and
// global memory is not read.
STRIA_DEVICE void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(n));
}
STRIA_DEVICE void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N committed groups of this thread are still in flight.
template <int N>
STRIA_DEVICE void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

}  // namespace cuda
}  // namespace stria
#endif
