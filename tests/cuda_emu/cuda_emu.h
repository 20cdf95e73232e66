// Host emulation of the device primitives of kernels/cuda/device_api.cuh, so that the CUDA
// kernels compile with a host compiler (STRIA_CUDA_EMULATE) and run on a CPU in the tests.
//
// Use: link the CMake target stria_cuda_emu (it puts kernels/ and tests/cuda_emu on the include
// path and defines STRIA_CUDA_EMULATE), include a kernel header such as "cuda/mma_forward.cuh",
// and run it with emu::Launch(grid, block, smem_bytes, &Kernel<...>, params).
//
// emu::Launch runs the blocks one after another, every CUDA thread of a block as a fiber on the
// calling OS thread. A thread runs until it reaches block_sync or a warp collective (shuffles,
// ldmatrix, mma, warp_sync), then the next thread runs. A warp collective completes when all 32
// lanes have arrived; its results are computed from the inputs of all lanes, per the PTX ISA.
//
// It also checks what compute-sanitizer would, and what otherwise shows only as wrong numbers or
// a hang on the GPU: ldmatrix/cp.async addresses outside the dynamic shared memory or misaligned,
// lanes of a warp at different collectives or exited before one, and block_sync that some threads
// never reach. Launch then throws std::runtime_error naming block, thread and what happened.
// Shared memory starts every block as 0xFF bytes (NaN in f16, bf16 and f32), so reading what no
// thread wrote shows up, and cp.async copies land only at cp_async_wait, so reading before the
// wait does too (TMA copies, likewise, only at an mbarrier wait). Under ASan, plain loads and
// stores past the end of shared memory are caught.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <type_traits>

#if !defined(STRIA_CUDA_EMULATE)
#error "cuda_emu.h is the host side of cuda/device_api.cuh: include that, with STRIA_CUDA_EMULATE defined"
#endif

namespace stria {
namespace cuda {

struct Half;  // tags, defined in device_api.cuh
struct BFloat;
struct TensorMap;  // tma_api.cuh

namespace emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// Runs `body` once per thread of every block of `grid` (each call is one CUDA thread; it calls the
// kernel with its parameters). The threads of a block must be a multiple of 32 (at most 1024);
// dynamic shared memory at most 227 KiB (sm_90). Not reentrant from inside a kernel; separate OS
// threads may launch concurrently. Throws std::invalid_argument for a bad configuration and
// std::runtime_error for what a kernel did wrong (the first error; the launch stops there).
void Launch(Dim3 grid, Dim3 block, size_t dynamic_smem_bytes, const std::function<void()>& body);

// The same, calling `kernel(args...)` in every thread (the arguments are copied per thread, as
// kernel parameters are).
template <typename... Params, typename... Args>
void Launch(Dim3 grid, Dim3 block, size_t dynamic_smem_bytes, void (*kernel)(Params...), Args... args) {
  Launch(grid, block, dynamic_smem_bytes, std::function<void()>([&] { kernel(args...); }));
}

// The order in which the emulator runs the threads of a block, and the blocks of a grid. A thread
// runs until it waits (block_sync, a named barrier, mbar_wait, a warp collective, wgmma_wait) or
// returns; then another takes over. A kernel whose result depends on that order has a race:
// shared or global memory written by one thread and read or written by another with no barrier
// between them. This emulator does not see plain loads and stores (compute-sanitizer's racecheck
// tracks them on the GPU), so it finds races by running a kernel under schedules that put one
// warp far ahead of another.
//   kRoundRobin (the default): threads in index order, each in turn until it waits, so the warps
//   of a block move from collective to collective nearly together, and the blocks in index order.
//   A read of what another warp wrote a collective or more earlier, with no barrier between,
//   passes here.
//   kWarpsAscending: strict priority by warp index. The first warp runs alone until it waits at
//   a barrier (or for the rest of its warpgroup), then the next, and so on: a warp reads shared
//   memory before any higher warp wrote it in the same barrier interval, and overwrites what a
//   higher warp has yet to read. The thread that completes a block_sync, a named barrier or an
//   mbarrier phase by its arrival first lets the waiters before it in the order run. Blocks in
//   index order.
//   kWarpsDescending: the same, warps and blocks in reverse index order. Between them, the two
//   put every pair of warps in both orders.
//   kWarpsShuffled: strict priority in a random order of the warps, drawn from `seed` at the
//   start of a block and again at every block_sync; the blocks in a random order.
enum class Schedule { kRoundRobin, kWarpsAscending, kWarpsDescending, kWarpsShuffled };
// For this OS thread's launches from now on. Without a call, STRIA_EMU_SCHEDULE in the
// environment decides: "round-robin", "warps-ascending", "warps-descending" or
// "warps-shuffled[:seed]" (Launch throws std::invalid_argument for anything else).
void SetSchedule(Schedule schedule, uint64_t seed = 0);
// Back to STRIA_EMU_SCHEDULE's choice.
void ResetSchedule();

// Launches on a stream, for launchers compiled on the host (STRIA_LAUNCH in device_api.cuh).
// LaunchOnStream checks the launch as the runtime does, then queues `body` (one CUDA thread's call
// of the kernel) as a launch on `stream` and returns at once, as the GPU does; it returns the
// launch's cudaError_t as an int (this header does without the CUDA headers). A model of the CUDA
// runtime defines it (tests/cuda_host: only what links that model may launch this way).
int LaunchOnStream(const void* kernel, void* stream, Dim3 grid, Dim3 block, size_t smem_bytes,
                   std::function<void()> body);

template <typename D>
Dim3 ToDim3(const D& d) {
  if constexpr (std::is_integral<D>::value) {
    return Dim3{static_cast<unsigned>(d), 1, 1};
  } else {
    return Dim3{d.x, d.y, d.z};
  }
}

// STRIA_LAUNCH(kernel, grid, block, smem, stream)(args...): the arguments are copied, as kernel
// parameters are; the call returns the launch's status as a Result (cudaError_t).
template <typename Result, typename... Params>
struct StreamLauncher {
  void (*kernel)(Params...);
  Dim3 grid, block;
  size_t smem;
  void* stream;
  template <typename... Args>
  Result operator()(Args... args) const {
    auto k = kernel;
    return static_cast<Result>(
        LaunchOnStream(reinterpret_cast<const void*>(k), stream, grid, block, smem, [k, args...] { k(args...); }));
  }
};
template <typename Result, typename... Params, typename G, typename B, typename S>
StreamLauncher<Result, Params...> StreamLaunch(void (*kernel)(Params...), const G& grid, const B& block, size_t smem,
                                               S* stream) {
  return StreamLauncher<Result, Params...>{kernel, ToDim3(grid), ToDim3(block), smem, static_cast<void*>(stream)};
}

// 16-bit float conversions, round to nearest even; NaN in, NaN out (0x7fff, as the GPU's cvt).
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return BitsFloat(sign | 0x7f800000u | (m << 13));  // inf, NaN (payload kept)
  if (e == 0) {                                                     // zero, subnormal: m * 2^-24
    const float v = static_cast<float>(m) * 0x1p-24f;
    return sign ? -v : v;
  }
  return BitsFloat(sign | ((e + 112) << 23) | (m << 13));
}
inline uint16_t FloatToHalf(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7fff;
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // from 65520 (halfway past 65504) on: inf
  if (a >= 0x38800000u) {                       // normal half (>= 2^-14): rebias, round 13 bits
    const uint32_t r = a + 0xfffu + ((a >> 13) & 1u);
    return static_cast<uint16_t>(sign | ((r - 0x38000000u) >> 13));
  }
  if (a <= 0x33000000u) return sign;  // at most 2^-25, half the smallest subnormal: to (even) zero
  // Subnormal half: the value in units of 2^-24 is the 24-bit significand shifted right.
  const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;  // 14..24
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1), halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (r & 1u))) ++r;  // 0x3ff + 1 is the smallest normal
  return static_cast<uint16_t>(sign | r);
}
inline float BFloatToFloat(uint16_t b) {
  return BitsFloat(static_cast<uint32_t>(b) << 16);
}
inline uint16_t FloatToBFloat(float f) {
  const uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fff;
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

namespace detail {

struct BlockInfo {
  Dim3 idx, dim, grid;
  unsigned char* smem;
  size_t smem_bytes;
};
struct ThreadInfo {
  Dim3 idx;
  int lane, warp;
  const BlockInfo* block;
  void* impl;
};
// The running emulated thread of this OS thread (null outside kernels). One thread_local in
// cuda_emu.cc behind a function: kernels in a module of their own (tests/cuda_host) must see the
// same variable, and GCC's UBSan takes a read of an extern thread_local in inline code for a load
// through a null pointer.
ThreadInfo* CurrentThreadInfo();

[[noreturn]] void NotInKernel();
// Fails the launch: `what` got an address `p` that is not `bytes`-aligned.
[[noreturn]] void Misaligned(const char* what, const void* p, int bytes);
// Fails the launch: a CTA waits for a count of `want` at `counter`, which holds `have` with every
// earlier block finished.
[[noreturn]] void CountNeverReached(const int* counter, int have, int want);
// Fails the launch: a thread called trap().
[[noreturn]] void Trapped();
inline const ThreadInfo& Self() {
  const ThreadInfo* t = CurrentThreadInfo();
  if (__builtin_expect(t == nullptr, 0)) NotInKernel();
  return *t;
}

void BlockSync();
void WarpSync();
float Shfl(float v, int lane_or_mask, bool xor_mode);
void MmaHalf(float d[4], const uint32_t a[4], const uint32_t b[2]);
void MmaBFloat(float d[4], const uint32_t a[4], const uint32_t b[2]);
void Ldmatrix(uint32_t r[4], const void* smem_row, bool trans);
void CpAsync16(void* smem, const void* gmem, bool valid);
void CpAsyncCommit();
void CpAsyncWait(int n);

// Hopper warpgroup MMA (cuda/wgmma_api.cuh). Shared memory is seen at window addresses starting
// at kSmemWindowBase, deliberately not 1024-byte aligned: kernels must align their swizzled tiles
// themselves, as they must on the GPU. An mma_async records its operands; the products land in
// each thread's accumulators only at the wgmma_wait that completes its group (until then they
// hold a NaN of the emulator's: reading them shows NaN, writing them is reported at the wait),
// and B (and a shared-memory A) is read from shared memory then.
// Those reads must see shared memory as it stood at the last barrier that every thread reached
// after a fence_proxy_async: anything written since, or not fenced before it, is reported. A
// register A operand must stay unchanged until that wait too.
constexpr uint32_t kSmemWindowBase = 0x480;
// kSS: A and B K-major in shared memory; kRSTransB: A in registers, B MN-major; kSSTrans: A and
// B MN-major in shared memory; kSSTransB: both in shared memory, A K-major, B MN-major.
enum class WgmmaKind : uint8_t { kSS, kRSTransB, kSSTrans, kSSTransB };
uint32_t SmemAddr(const void* p);
void WgmmaFence();
void WgmmaCommit();
void WgmmaWait(int n);
void FenceProxyAsync();
void Wgmma(WgmmaKind kind, bool bf16, int n, float* d, const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
           bool accumulate);

// Hopper mbarriers, TMA loads and named barriers (cuda/tma_api.cuh). An mbarrier (8 bytes of the
// dynamic shared memory, 8-byte aligned) is kept in a table of the block by its offset: phase
// number, arrivals pending (`count` at every phase start), transaction bytes outstanding. Its
// phase completes when no arrival is pending and no byte is outstanding. MbarArrive with
// `tx_bytes` > 0 is arrive.expect_tx: the bytes are announced, then the thread arrives;
// MbarExpectTx announces them without an arrival (mbarrier.expect_tx).
// MbarWait returns once the phase of parity `parity` has completed, i.e. the current phase's
// parity differs. A TMA copy poisons its destination (0xFF) at issue, in shared memory and in
// the async proxy's view, and is queued on its mbarrier; the queued copies land, and retire
// their bytes, only when a thread waits on that barrier for a phase not yet complete, so a read
// before the wait shows poison. A block that ends with copies queued or bytes announced and never
// retired fails. Reported also: barriers used before mbar_init, more arrivals in a phase than its
// count, a destination that is misaligned or outside shared memory, a map not from
// EncodeRowsMap, and an mbarrier's 8 bytes overwritten since its init.
void MbarInit(uint64_t* bar, int count);
void MbarArrive(uint64_t* bar, uint32_t tx_bytes);
void MbarExpectTx(uint64_t* bar, uint32_t tx_bytes);
void MbarWait(uint64_t* bar, int parity);
void TmaLoad4d(void* smem_dst, const TensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar);
// bar.sync (`wait`) or bar.arrive on barrier `id` (1..15) of `threads` threads (a multiple of 32).
// Counted per thread: the GPU counts warps, the same for kernels whose warps arrive whole (a
// warp with lanes missing waits forever here, and shows as a deadlock). The first arrival of a
// generation fixes its thread count; an arrival giving another one fails.
void NamedBarrier(int id, int threads, bool wait);

}  // namespace detail
}  // namespace emu

#define STRIA_DEVICE inline
#define STRIA_GLOBAL
#define STRIA_DYNAMIC_SMEM(name) unsigned char* name = ::stria::cuda::emu::detail::Self().block->smem
#define threadIdx (::stria::cuda::emu::detail::Self().idx)
#define blockIdx (::stria::cuda::emu::detail::Self().block->idx)
#define blockDim (::stria::cuda::emu::detail::Self().block->dim)
#define gridDim (::stria::cuda::emu::detail::Self().block->grid)

inline int lane_id() {
  return emu::detail::Self().lane;
}
inline int warp_id() {
  return emu::detail::Self().warp;
}
inline void block_sync() {
  emu::detail::BlockSync();
}
inline void warp_sync() {
  emu::detail::WarpSync();
}
inline float shfl_xor(float v, int mask) {
  return emu::detail::Shfl(v, mask, true);
}
inline float shfl(float v, int src_lane) {
  return emu::detail::Shfl(v, src_lane, false);
}
// Blocks and threads run one at a time on one OS thread: a plain add is atomic here.
inline void atomic_add(float* p, float v) {
  *p += v;
}
inline void atomic_add2(float* p, float a, float b) {
  if (reinterpret_cast<uintptr_t>(p) % 8 != 0) emu::detail::Misaligned("atomic_add2", p, 8);  // as the GPU faults
  p[0] += a;
  p[1] += b;
}
// Blocks run one after another here, each to its end: a count that other CTAs must bring to
// `want` is there when a CTA waits for it, or never will be (on the GPU: a wait on a CTA that
// started later, or on a release nobody makes), which fails the launch.
inline int take_ticket(int* counter) {
  return (*counter)++;
}
inline void wait_count(const int* counter, int want) {
  if (*counter != want) emu::detail::CountNeverReached(counter, *counter, want);
}
inline void release_count(int* counter) {
  ++*counter;
}
inline void trap() {
  emu::detail::Trapped();
}
inline float fast_div(float a, float b) {
  return a / b;
}
// As the GPU's ex2.approx.ftz.f32: results below the smallest normal float flush to 0.
inline float fast_exp2(float x) {
  const float y = std::exp2(x);
  return y < std::numeric_limits<float>::min() ? 0.f : y;
}

template <typename T>
inline float to_float(uint16_t x);
template <>
inline float to_float<Half>(uint16_t x) {
  return emu::HalfToFloat(x);
}
template <>
inline float to_float<BFloat>(uint16_t x) {
  return emu::BFloatToFloat(x);
}
template <typename T>
inline uint16_t from_float(float x);
template <>
inline uint16_t from_float<Half>(float x) {
  return emu::FloatToHalf(x);
}
template <>
inline uint16_t from_float<BFloat>(float x) {
  return emu::FloatToBFloat(x);
}
template <typename T>
inline uint32_t pack2(float lo, float hi) {
  return static_cast<uint32_t>(from_float<T>(lo)) | (static_cast<uint32_t>(from_float<T>(hi)) << 16);
}

template <typename T>
inline void mma_16816(float d[4], const uint32_t a[4], const uint32_t b[2]);
template <>
inline void mma_16816<Half>(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  emu::detail::MmaHalf(d, a, b);
}
template <>
inline void mma_16816<BFloat>(float d[4], const uint32_t a[4], const uint32_t b[2]) {
  emu::detail::MmaBFloat(d, a, b);
}

inline void ldmatrix_x4(uint32_t r[4], const void* smem_row) {
  emu::detail::Ldmatrix(r, smem_row, false);
}
inline void ldmatrix_x4_trans(uint32_t r[4], const void* smem_row) {
  emu::detail::Ldmatrix(r, smem_row, true);
}

inline void cp_async_16(void* smem, const void* gmem, bool valid) {
  emu::detail::CpAsync16(smem, gmem, valid);
}
inline void cp_async_commit() {
  emu::detail::CpAsyncCommit();
}
template <int N>
inline void cp_async_wait() {
  emu::detail::CpAsyncWait(N);
}

inline uint32_t smem_addr(const void* p) {
  return emu::detail::SmemAddr(p);
}
inline uint32_t Opaque(uint32_t x) {
  return x;
}
inline void wgmma_fence() {
  emu::detail::WgmmaFence();
}
inline void wgmma_commit() {
  emu::detail::WgmmaCommit();
}
template <int N>
inline void wgmma_wait() {
  emu::detail::WgmmaWait(N);
}
inline void fence_proxy_async() {
  emu::detail::FenceProxyAsync();
}
// Compiler-only on the GPU (no instruction); the emulator runs the kernel's statements in order.
template <int N>
inline void wgmma_fence_operand(float (&)[N]) {}
template <int N, int M>
inline void wgmma_fence_operand(uint32_t (&)[N][M]) {}
template <typename T, int N>
inline void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu::detail::Wgmma(emu::detail::WgmmaKind::kSS, std::is_same<T, BFloat>::value, N, d, nullptr, desc_a, desc_b,
                     accumulate);
}
template <typename T, int N>
inline void wgmma_ss_tt(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu::detail::Wgmma(emu::detail::WgmmaKind::kSSTrans, std::is_same<T, BFloat>::value, N, d, nullptr, desc_a, desc_b,
                     accumulate);
}
template <typename T, int N>
inline void wgmma_ss_tb(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate) {
  emu::detail::Wgmma(emu::detail::WgmmaKind::kSSTransB, std::is_same<T, BFloat>::value, N, d, nullptr, desc_a, desc_b,
                     accumulate);
}
template <typename T, int N>
inline void wgmma_rs_tb(float (&d)[N / 2], const uint32_t a[4], uint64_t desc_b, bool accumulate) {
  emu::detail::Wgmma(emu::detail::WgmmaKind::kRSTransB, std::is_same<T, BFloat>::value, N, d, a, 0, desc_b, accumulate);
}

}  // namespace cuda
}  // namespace stria
