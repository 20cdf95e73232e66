// Hopper (sm_90a) asynchronous loads and the barriers that order them: the tensor memory
// accelerator (TMA: cp.async.bulk.tensor), shared-memory transaction barriers (mbarrier) and
// warpgroup register reallocation (setmaxnreg), behind the two-way scheme of device_api.cuh and
// wgmma_api.cuh (inline PTX for nvcc; the warp emulator of tests/cuda_emu with
// STRIA_CUDA_EMULATE). Device code using them sits under STRIA_HAS_WGMMA.
//
// A TMA load copies a box of a global tensor, described by a 128-byte tensor map that the host
// encodes (EncodeRowsMap), into shared memory, writing it in the 128-byte swizzle that wgmma's
// descriptors read (wgmma_api.cuh), with rows outside the tensor zero-filled. Its completion is
// counted in bytes on an mbarrier: the waiting side announces the bytes (mbar_arrive_expect_tx,
// or mbar_expect_tx and a later arrival), the copy retires them, and the barrier's phase completes when every expected
// arrival came and no byte is outstanding. A waiter names the parity of the phase it waits for; phases alternate, so a
// ring of buffers flips its parity bit each time around.
//
// A bulk reduction (cp.reduce.async.bulk .add.f32) adds a run of floats in shared memory into
// global memory in the L2, whole lines at a time: what the TMA backward's dQ goes out by. Its
// completion is counted per thread in bulk groups: bulk_wait_group_read<N> returns once at most N
// of this thread's groups still read shared memory (the buffer may then be written again),
// bulk_wait_group<N> once their writes are done.
#pragma once

#include <cstdint>

#include "cuda/params.h"
#include "cuda/wgmma_api.cuh"

namespace stria {
namespace cuda {

// CUtensorMap's size and alignment (cuda.h of CUDA 13; the driver needs 64); opaque to the
// kernels. A kernel parameter holding one must be __grid_constant__ (STRIA_GRID_CONSTANT) so that
// TMA reads it from parameter space.
struct alignas(128) TensorMap {
  uint64_t opaque[16];
};

// Host: encodes `map` for TMA loads of boxes of `box_rows` rows x 64 columns of one (b, h) of a
// 16-bit [B, L, H, D] tensor at `base` (strides in elements, the last dimension contiguous),
// 128-byte swizzle, zero fill out of bounds. D is a multiple of 64. False when TMA cannot
// address the tensor (base not 16-byte aligned, a stride not a multiple of 16 bytes or not below
// 2^40 bytes, or the driver refuses): the caller then takes a kernel that loads with cp.async.
bool EncodeRowsMap(TensorMap* map, const void* base, int B, int L, int H, int D, int64_t sb, int64_t sl, int64_t sh,
                   int box_rows);
// The maps the TMA kernels take, as their launchers (and the emulated tests) make them: a
// caller's [B, L, H, D] view, and a ring block's compact K and V ([B, L, Hkv, D]).
inline bool EncodeViewMap(TensorMap* map, const RowsArg& view, const Dims& d, int H, int box_rows) {
  return EncodeRowsMap(map, view.data, d.B, d.L, H, d.D, view.sb, view.sl, view.sh, box_rows);
}
inline bool EncodeBlockMaps(TensorMap* k_map, TensorMap* v_map, const void* k, const void* v, const Dims& d,
                            int box_rows) {
  const int64_t sl = int64_t{d.Hkv} * d.D, sb = sl * d.L;
  return EncodeRowsMap(k_map, k, d.B, d.L, d.Hkv, d.D, sb, sl, d.D, box_rows) &&
         EncodeRowsMap(v_map, v, d.B, d.L, d.Hkv, d.D, sb, sl, d.D, box_rows);
}
// How many EncodeRowsMap calls failed in this process: a benchmark of the TMA family reports it, so
// a silent fallback cannot pass for a TMA measurement.
uint64_t TmaMapFailures();

}  // namespace cuda
}  // namespace stria

#if defined(STRIA_CUDA_EMULATE)
#define STRIA_GRID_CONSTANT
namespace stria {
namespace cuda {

inline void mbar_init(uint64_t* bar, int count) {
  emu::detail::MbarInit(bar, count);
}
inline void fence_barrier_init() {}
inline void mbar_arrive(uint64_t* bar) {
  emu::detail::MbarArrive(bar, 0);
}
inline void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  emu::detail::MbarArrive(bar, bytes);
}
inline void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  emu::detail::MbarExpectTx(bar, bytes);
}
inline void mbar_wait(uint64_t* bar, int parity) {
  emu::detail::MbarWait(bar, parity);
}
inline void tma_load_4d(void* smem_dst, const TensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  emu::detail::TmaLoad4d(smem_dst, map, c0, c1, c2, c3, bar);
}
inline void prefetch_tensor_map(const TensorMap*) {}
template <int kRegs>
inline void setmaxnreg_inc() {}
template <int kRegs>
inline void setmaxnreg_dec() {}
inline void named_barrier_sync(int id, int threads) {
  emu::detail::NamedBarrier(id, threads, true);
}
inline void named_barrier_arrive(int id, int threads) {
  emu::detail::NamedBarrier(id, threads, false);
}
// The emulator adds at issue (blocks run one at a time on one OS thread: the adds are atomic), so
// the group waits have nothing left to wait for; the GPU's alignment rules are checked.
inline void bulk_reduce_add_f32(float* gmem, const void* smem, uint32_t bytes) {
  if (reinterpret_cast<uintptr_t>(gmem) % 16 != 0) emu::detail::Misaligned("bulk reduction (global)", gmem, 16);
  if (reinterpret_cast<uintptr_t>(smem) % 16 != 0) emu::detail::Misaligned("bulk reduction (shared)", smem, 16);
  if (bytes % 16 != 0) emu::detail::Misaligned("bulk reduction (size)", reinterpret_cast<void*>(uintptr_t{bytes}), 16);
  const float* src = static_cast<const float*>(smem);
  for (uint32_t i = 0; i < bytes / 4; ++i) gmem[i] += src[i];
}
inline void bulk_commit_group() {}
template <int N>
inline void bulk_wait_group_read() {}
template <int N>
inline void bulk_wait_group() {}
inline void fence_proxy_async_global() {}

}  // namespace cuda
}  // namespace stria

#elif STRIA_HAS_WGMMA
#define STRIA_GRID_CONSTANT __grid_constant__
namespace stria {
namespace cuda {

// `count` arrivals complete a phase (plus the transaction bytes announced in it).
STRIA_DEVICE void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialisations above visible to the async proxy (TMA) before the block barrier
// that publishes them.
STRIA_DEVICE void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
STRIA_DEVICE void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival that also announces `bytes` of TMA transactions for the current phase.
STRIA_DEVICE void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// Announces `bytes` of TMA transactions for the current phase without arriving: the thread's
// arrival comes later (after stores of its own that the phase publishes too).
STRIA_DEVICE void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
// Returns once the phase of parity `parity` has completed (its writes are then visible).
STRIA_DEVICE void mbar_wait(uint64_t* bar, int parity) {
  const uint32_t a = smem_addr(bar);
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(a), "r"(parity)
                 : "memory");
  } while (done == 0);
}
// The box at coordinates (c0 = column, c1, c2, c3) of `map` into `smem_dst` (1024-byte aligned
// for the swizzle), its bytes retired on `bar`.
STRIA_DEVICE void tma_load_4d(void* smem_dst, const TensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(smem_addr(smem_dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
      : "memory");
}
STRIA_DEVICE void prefetch_tensor_map(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}
// Every thread of the warpgroup: raise (consumers) or lower (the producer) its register limit.
template <int kRegs>
STRIA_DEVICE void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
STRIA_DEVICE void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
// Barrier `id` (1..15; 0 is block_sync's) of `threads` threads (a multiple of 32): sync waits
// until that many have arrived, arrive counts this thread's warp and goes on. What two consumer
// warpgroups take turns with.
STRIA_DEVICE void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
STRIA_DEVICE void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// gmem[0 .. bytes / 4) += smem[...] (floats; both addresses and `bytes` multiples of 16).
STRIA_DEVICE void bulk_reduce_add_f32(float* gmem, const void* smem, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(gmem),
               "r"(smem_addr(smem)), "r"(bytes)
               : "memory");
}
STRIA_DEVICE void bulk_commit_group() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
STRIA_DEVICE void bulk_wait_group_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
STRIA_DEVICE void bulk_wait_group() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}
// Orders this thread's generic-proxy accesses of global memory with its async-proxy ones (the
// bulk reductions): between a wait_count and the reduction it admits, and between a reduction's
// completion and the release_count that publishes it.
STRIA_DEVICE void fence_proxy_async_global() {
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

}  // namespace cuda
}  // namespace stria

#else
#define STRIA_GRID_CONSTANT __grid_constant__
#endif
