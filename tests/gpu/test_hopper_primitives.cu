// The Hopper primitives that the wgmma and TMA kernels are built from, one at a time on the GPU
// (compute capability 9.0; skipped elsewhere, saying why). The emulator models each of them from
// the PTX ISA and the kernels pass there; this suite checks the same uses against the hardware,
// so that a first GPU run which fails in the attention suites says which primitive the emulator
// misreads rather than only that some output is wrong:
//  - a TMA box from a tensor map that EncodeRowsMap made (the driver's encoder), completing on
//    an mbarrier, lands where SwizzledOffset says, zero-filled past the tensor;
//  - S = Q K^T through the forward's own IssueScores (both operands K-major by descriptor), for one
//    warpgroup and for the second of a 128-row tile;
//  - O += P V through the forward's own IssuePV (P in registers, V in the transposed-B form);
//  - dQ = dS K with both operands MN-major, with the backward's descriptors (wgmma_ss_tt);
//  - dV += P^T dO with P^T in shared memory (A K-major, B MN-major: wgmma_ss_tb), as the head-dim
//    256 backward issues it; S at N 32 and P V at D 256 through the forward's own helpers;
//  - the FP8 (e4m3) products: S = Q K^T with both operands K-major, and O += P V with P packed
//    from the accumulator layout into e4m3 A fragments (PackPE4m3) against V transposed with its
//    keys in E4m3PvKey's order, which checks the register fragment layout the packing assumes;
//  - the softmax's special-function forms: fast_exp2 (ex2.approx.ftz: results below 2^-126 flush
//    to 0, as the emulator models it) and the softcap's RationalTanh (with __fdividef).
// Each product is checked element by element, in the accumulator layout the kernels assume,
// against a double-precision product of the same bf16 values.
//
// The same source also runs on the host model of the CUDA runtime (tests/cuda_host), where the
// kernels run on the emulator: that checks the checks, so that a failure on the GPU is the GPU's.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "cuda/softcap.cuh"
#include "cuda/tma_api.cuh"
#include "cuda/wgmma_forward.cuh"
#include "cuda/wgmma_fp8.cuh"

namespace sc = stria::cuda;

namespace {

// Empty when this GPU runs sm_90a code; otherwise why the test skips.
std::string NoHopperReason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no usable CUDA device";
  }
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0);
  if (major != 9 || minor != 0)
    return "device 0 has compute capability " + std::to_string(major) + "." + std::to_string(minor) +
           "; sm_90a code (wgmma, TMA) runs on 9.0 only";
  return "";
}

#define REQUIRE_HOPPER()                                             \
  do {                                                               \
    const std::string why_ = NoHopperReason();                       \
    if (!why_.empty()) GTEST_SKIP() << "GPU test skipped: " << why_; \
  } while (0)

const cudaStream_t kDefaultStream = nullptr;

template <typename Kernel>
cudaError_t AllowSmem(Kernel kernel, int bytes) {
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call << ": " << cudaGetErrorString(cudaGetLastError())

uint16_t ToBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
double FromBf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::vector<uint16_t> RandomBf16(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = ToBf16(u(rng));
  return v;
}

// A device buffer holding a copy of `host` (or `n` zero bytes), freed at scope exit.
struct Dev {
  void* p = nullptr;
  template <typename T>
  explicit Dev(const std::vector<T>& host) {
    EXPECT_EQ(cudaMalloc(&p, host.size() * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  }
  explicit Dev(size_t bytes) {
    EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0xFF, bytes), cudaSuccess);  // poison: NaN as bf16 and as float
  }
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

template <typename T>
std::vector<T> ToHost(const Dev& d, size_t n) {
  std::vector<T> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d.p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

// Row and column of accumulator element i of thread `tid` in a 64 x N wgmma result.
STRIA_HD int AccRow(int tid, int i) {
  return 16 * (tid >> 5) + ((tid & 31) >> 2) + 8 * ((i & 3) >> 1);
}
STRIA_HD int AccCol(int tid, int i) {
  return 8 * (i >> 2) + 2 * (tid & 3) + (i & 1);
}

// `rows` x `cols` 16-bit values, row-major in global memory, into a swizzled shared tile.
STRIA_DEVICE void StoreSwizzled(unsigned char* tile, const uint16_t* src, int rows, int cols) {
  for (int x = static_cast<int>(threadIdx.x); x < rows * cols; x += static_cast<int>(blockDim.x)) {
    const int r = x / cols, c = x % cols;
    *reinterpret_cast<uint16_t*>(tile + sc::SwizzledOffset(rows, r, c)) = src[x];
  }
}

// fast_exp2 and RationalTanh of each x, as the kernels' softmax and softcap take them.
STRIA_GLOBAL void SpecialFunctionsKernel(const float* x, int n, float* exp2_out, float* tanh_out) {
  for (int i = static_cast<int>(threadIdx.x); i < n; i += static_cast<int>(blockDim.x)) {
    exp2_out[i] = sc::fast_exp2(x[i]);
    tanh_out[i] = sc::RationalTanh(x[i]);
  }
}

constexpr int kBoxRows = 64;

STRIA_GLOBAL void TmaBoxKernel(const STRIA_GRID_CONSTANT sc::TensorMap map, int h, int row0, int b, uint16_t* out) {
#if STRIA_HAS_WGMMA
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* tile = sc::AlignToSwizzleAtom(smem_raw);
  uint64_t* bar = reinterpret_cast<uint64_t*>(tile + 2 * kBoxRows * sc::kSwizzleBytes);
  if (threadIdx.x == 0) {
    sc::mbar_init(bar, 1);
    sc::fence_barrier_init();
  }
  sc::block_sync();
  if (threadIdx.x == 0) {
    sc::mbar_arrive_expect_tx(bar, 2 * kBoxRows * sc::kSwizzleBytes);
    for (int cb = 0; cb < 2; ++cb)
      sc::tma_load_4d(tile + cb * kBoxRows * sc::kSwizzleBytes, &map, 64 * cb, h, row0, b, bar);
  }
  sc::mbar_wait(bar, 0);
  for (int x = static_cast<int>(threadIdx.x); x < 2 * kBoxRows * 64; x += static_cast<int>(blockDim.x))
    out[x] = reinterpret_cast<const uint16_t*>(tile)[x];
#endif
}

// S (kM x kN) = Q (kM x D) K^T, as the forward issues it: one warpgroup per 64 rows of the Q
// tile (kM 128: the second warpgroup reads rows 64.. of each column block, as in the kernels).
template <int D, int kM, int kN>
STRIA_GLOBAL void ScoresKernel(const uint16_t* q, const uint16_t* k, float* s_out) {
#if STRIA_HAS_WGMMA
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = sc::AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = qs + kM * D * 2;
  StoreSwizzled(qs, q, kM, D);
  StoreSwizzled(ks, k, kN, D);
  sc::fence_proxy_async();
  sc::block_sync();
  const int tid = static_cast<int>(threadIdx.x), group = tid >> 7;
  float s[kN / 2];
  sc::wgmma_fence();
  sc::IssueScores<sc::BFloat, D, kM, kN>(s, sc::smem_addr(qs), sc::smem_addr(ks), group);
  sc::wgmma_wait<0>();
  sc::wgmma_fence_operand(s);
  for (int i = 0; i < kN / 2; ++i) s_out[(64 * group + AccRow(tid & 127, i)) * kN + AccCol(tid & 127, i)] = s[i];
#endif
}

// O (64 x D) = P (64 x kN, from registers) V (kN x D), as the forward issues it.
template <int D, int kN>
STRIA_GLOBAL void PVKernel(const float* p_in, const uint16_t* v, float* o_out) {
#if STRIA_HAS_WGMMA
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* vs = sc::AlignToSwizzleAtom(smem_raw);
  StoreSwizzled(vs, v, kN, D);
  sc::fence_proxy_async();
  sc::block_sync();
  const int tid = static_cast<int>(threadIdx.x);
  float s[kN / 2], o[D / 2], alpha[2] = {0.f, 0.f};
  for (int i = 0; i < kN / 2; ++i) s[i] = p_in[AccRow(tid, i) * kN + AccCol(tid, i)];
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  uint32_t pa[kN / 16][4];
  sc::RescaleAndPack<sc::BFloat, D, kN>(o, alpha, s, pa);
  sc::wgmma_fence_operand(o);
  sc::wgmma_fence_operand(pa);
  sc::wgmma_fence();
  sc::IssuePV<sc::BFloat, D, kN>(o, pa, sc::smem_addr(vs));
  sc::wgmma_wait<0>();
  sc::wgmma_fence_operand(o);
  for (int i = 0; i < D / 2; ++i) o_out[AccRow(tid, i) * D + AccCol(tid, i)] = o[i];
#endif
}

// dQ block (qb, cb) (64 x 64) = dS (queries 64 qb.., kN keys) K (kN keys, columns 64 cb..), with
// dS^T and K in shared memory as the backward keeps them (rows: keys), read MN-major.
constexpr int kDqKeys = 128, kDqQueries = 128, kDqDim = 128;
STRIA_GLOBAL void DqKernel(const uint16_t* ds_t, const uint16_t* k, int qb, int cb, float* dq_out) {
#if STRIA_HAS_WGMMA
  constexpr int kN = kDqKeys;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* dss = sc::AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = dss + kN * kDqQueries * 2;
  StoreSwizzled(dss, ds_t, kN, kDqQueries);
  StoreSwizzled(ks, k, kN, kDqDim);
  sc::fence_proxy_async();
  sc::block_sync();
  const uint32_t ds_addr = sc::smem_addr(dss), k_addr = sc::smem_addr(ks);
  float dq[32];
  sc::wgmma_fence();
  for (int kk = 0; kk < kN / 16; ++kk) {  // the backward's descriptors (wgmma_backward.cuh)
    const uint64_t da = sc::SwizzledDesc(ds_addr + qb * kN * sc::kSwizzleBytes + kk * 16 * sc::kSwizzleBytes,
                                         kN * sc::kSwizzleBytes, sc::kSwizzleAtomBytes);
    const uint64_t db = sc::SwizzledDesc(k_addr + cb * kN * sc::kSwizzleBytes + kk * 16 * sc::kSwizzleBytes,
                                         kN * sc::kSwizzleBytes, sc::kSwizzleAtomBytes);
    sc::wgmma_ss_tt<sc::BFloat, 64>(dq, da, db, kk > 0);
  }
  sc::wgmma_commit();
  sc::wgmma_wait<0>();
  sc::wgmma_fence_operand(dq);
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = 0; i < 32; ++i) dq_out[AccRow(tid, i) * 64 + AccCol(tid, i)] = dq[i];
#endif
}

// dV columns 128 h.. (64 keys x 128) = P^T (64 keys x 64 queries, rows: keys) dO (64 queries x
// 256 columns, rows: queries), as the head-dim 256 backward issues it (wgmma_backward_wide.cuh): A
// K-major and B MN-major, both in shared memory (wgmma_ss_tb).
constexpr int kPtKeys = 64, kPtQueries = 64, kPtDim = 256;
STRIA_GLOBAL void PtDoKernel(const uint16_t* p_t, const uint16_t* dout, int h, float* dv_out) {
#if STRIA_HAS_WGMMA
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* pts = sc::AlignToSwizzleAtom(smem_raw);
  unsigned char* dos = pts + kPtKeys * kPtQueries * 2;
  StoreSwizzled(pts, p_t, kPtKeys, kPtQueries);
  StoreSwizzled(dos, dout, kPtQueries, kPtDim);
  sc::fence_proxy_async();
  sc::block_sync();
  const uint32_t pt_addr = sc::smem_addr(pts), do_addr = sc::smem_addr(dos);
  const uint32_t col_at = 2 * h * kPtQueries * sc::kSwizzleBytes;  // column block 128 h / 64
  float dv[64];
  sc::wgmma_fence();
  for (int kq = 0; kq < kPtQueries / 16; ++kq) {
    const uint64_t da = sc::SwizzledDesc(pt_addr + kq * 32, 16, sc::kSwizzleAtomBytes);
    const uint64_t db = sc::SwizzledDesc(do_addr + col_at + kq * 16 * sc::kSwizzleBytes, kPtQueries * sc::kSwizzleBytes,
                                         sc::kSwizzleAtomBytes);
    sc::wgmma_ss_tb<sc::BFloat, 128>(dv, da, db, kq > 0);
  }
  sc::wgmma_commit();
  sc::wgmma_wait<0>();
  sc::wgmma_fence_operand(dv);
  const int tid = static_cast<int>(threadIdx.x);
  for (int i = 0; i < 64; ++i) dv_out[AccRow(tid, i) * 128 + AccCol(tid, i)] = dv[i];
#endif
}

// `rows` x 128 e4m3 values, row-major in global memory, into a swizzled shared tile: a row is one
// 128-byte swizzle row, its 16-byte chunk c at chunk c ^ (row % 8).
STRIA_DEVICE void StoreSwizzledBytes(unsigned char* tile, const uint8_t* src, int rows) {
  for (int x = static_cast<int>(threadIdx.x); x < rows * 128; x += static_cast<int>(blockDim.x)) {
    const int r = x / 128, c = x % 128;
    tile[r * 128 + (((c >> 4) ^ (r & 7)) << 4) + (c & 15)] = src[x];
  }
}

// S (64 x kN) = Q (64 x 128) K^T in e4m3: four products of K 32, each 32 bytes further along the
// swizzled rows, as the 16-bit forward steps 16 columns.
template <int kN>
STRIA_GLOBAL void ScoresE4m3Kernel(const uint8_t* q, const uint8_t* k, float* s_out) {
#if STRIA_HAS_WGMMA
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = sc::AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = qs + 64 * 128;
  StoreSwizzledBytes(qs, q, 64);
  StoreSwizzledBytes(ks, k, kN);
  sc::fence_proxy_async();
  sc::block_sync();
  const int tid = static_cast<int>(threadIdx.x);
  float s[kN / 2];
  sc::wgmma_fence();
  for (int kk = 0; kk < 4; ++kk) {
    const uint64_t qa = sc::SwizzledDesc(sc::smem_addr(qs) + 32 * kk, 16, sc::kSwizzleAtomBytes);
    const uint64_t kb = sc::SwizzledDesc(sc::smem_addr(ks) + 32 * kk, 16, sc::kSwizzleAtomBytes);
    sc::wgmma_ss_e4m3<kN>(s, qa, kb, kk > 0);
  }
  sc::wgmma_commit();
  sc::wgmma_wait<0>();
  sc::wgmma_fence_operand(s);
  for (int i = 0; i < kN / 2; ++i) s_out[AccRow(tid, i) * kN + AccCol(tid, i)] = s[i];
#endif
}

// O (64 x D) = P (64 x 128 keys, f32 in the accumulator layout, packed to e4m3 by PackPE4m3) V,
// with V given transposed (D rows of 128 keys, in E4m3PvKey's order): four products of K 32.
template <int D>
STRIA_GLOBAL void PVE4m3Kernel(const float* p_in, const uint8_t* vt, float* o_out) {
#if STRIA_HAS_WGMMA
  constexpr int kN = 128;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* vs = sc::AlignToSwizzleAtom(smem_raw);
  StoreSwizzledBytes(vs, vt, D);
  sc::fence_proxy_async();
  sc::block_sync();
  const int tid = static_cast<int>(threadIdx.x);
  float s[kN / 2], o[D / 2];
  for (int i = 0; i < kN / 2; ++i) s[i] = p_in[AccRow(tid, i) * kN + AccCol(tid, i)];
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  uint32_t pa[kN / 32][4];
  sc::PackPE4m3<kN>(s, pa);
  sc::wgmma_fence_operand(o);
  sc::wgmma_fence_operand(pa);
  sc::wgmma_fence();
  for (int kk = 0; kk < kN / 32; ++kk) {
    const uint64_t vb = sc::SwizzledDesc(sc::smem_addr(vs) + 32 * kk, 16, sc::kSwizzleAtomBytes);
    sc::wgmma_rs_e4m3<D>(o, pa[kk], vb, true);
  }
  sc::wgmma_commit();
  sc::wgmma_wait<0>();
  sc::wgmma_fence_operand(o);
  for (int i = 0; i < D / 2; ++i) o_out[AccRow(tid, i) * D + AccCol(tid, i)] = o[i];
#endif
}

// Random e4m3 codes of magnitudes 2^-3 .. 2^2, either sign (no NaN).
std::vector<uint8_t> RandomE4m3(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& x : v) {
    const uint64_t r = rng();
    x = static_cast<uint8_t>(((r & 1) << 7) | ((4 + (r >> 1) % 5) << 3) | ((r >> 8) & 7));
  }
  return v;
}

// Largest |got - want| / (1 + |want|) over a row-major result, and where.
std::string Compare(const std::vector<float>& got, const std::vector<double>& want, int cols, double* worst) {
  *worst = 0;
  std::string where = "nowhere";
  for (size_t x = 0; x < want.size(); ++x) {
    const double err = std::isnan(got[x]) ? INFINITY : std::fabs(got[x] - want[x]) / (1 + std::fabs(want[x]));
    if (err > *worst) {
      *worst = err;
      where = "row " + std::to_string(x / cols) + " col " + std::to_string(x % cols) + ": got " +
              std::to_string(got[x]) + ", want " + std::to_string(want[x]);
    }
  }
  return where;
}

// A box of 64 rows x 128 columns of head 2 of a strided [B, L, H, D] view (the heads 1..3 of a
// packed [2, 100, 5, 128] tensor), rows 64..127 of batch 1: rows past L = 100 come back zero.
TEST(HopperTma, BoxLandsInTheSwizzleAndZeroFillsPastTheEnd) {
  REQUIRE_HOPPER();
  const int B = 2, L = 100, Hp = 5, H = 3, D = 128, h0 = 1, h = 2, row0 = 64, b = 1;
  const std::vector<uint16_t> full = RandomBf16(static_cast<size_t>(B) * L * Hp * D, 1);
  Dev dfull(full);
  sc::TensorMap map;
  ASSERT_TRUE(sc::EncodeRowsMap(&map, dfull.as<uint16_t>() + h0 * D, B, L, H, D, int64_t{L} * Hp * D, int64_t{Hp} * D,
                                D, kBoxRows))
      << "the driver refused the tensor map";
  Dev out(size_t{2} * kBoxRows * 64 * 2);
  const int smem = 2 * kBoxRows * sc::kSwizzleBytes + 8 + sc::kSwizzleAtomBytes;
  CUDA_OK(STRIA_LAUNCH(TmaBoxKernel, 1, 128, smem, kDefaultStream)(map, h, row0, b, out.as<uint16_t>()));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint16_t> got = ToHost<uint16_t>(out, size_t{2} * kBoxRows * 64);
  int bad = 0;
  for (int r = 0; r < kBoxRows; ++r)
    for (int c = 0; c < D; ++c) {
      const int i = row0 + r;
      const uint16_t want = i < L ? full[((static_cast<size_t>(b) * L + i) * Hp + h0 + h) * D + c] : 0;
      const uint16_t at = got[static_cast<size_t>(sc::SwizzledOffset(kBoxRows, r, c) / 2)];
      if (at != want && ++bad <= 5) ADD_FAILURE() << "row " << r << " col " << c << ": " << at << " != " << want;
    }
  EXPECT_EQ(bad, 0);
}

// The special-function forms against double precision: 2^x within 2^-21 relative where the result
// is at least 2^-125, 0 where it is below 2^-127 (flushed), 1 at 0, 0 at -inf, NaN at NaN; tanh
// within 6e-7 (the fit's 4e-7 and the reciprocal's 2 ulp), odd, NaN at NaN.
TEST(HopperSpecialFunctions, ExponentialAndTanhAsTheKernelsTakeThem) {
  REQUIRE_HOPPER();
  std::vector<float> x;
  for (int i = -3000; i <= 3000; ++i) x.push_back(static_cast<float>(i) * 0.0071f);   // tanh's range and past
  for (int i = 0; i <= 260; ++i) x.push_back(-130.f + static_cast<float>(i) * 0.5f);  // 2^x down to the flush
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  x.insert(x.end(), {0.f, -0.f, 1e-30f, -inf, inf, nan});
  const int n = static_cast<int>(x.size());
  Dev dx(x), de(size_t{4} * n), dt(size_t{4} * n);
  CUDA_OK(STRIA_LAUNCH(SpecialFunctionsKernel, 1, 256, 0, kDefaultStream)(dx.as<float>(), n, de.as<float>(),
                                                                          dt.as<float>()));
  CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> e = ToHost<float>(de, n), t = ToHost<float>(dt, n);
  int bad = 0;
  for (int i = 0; i < n; ++i) {
    const double xi = x[i], want_e = std::exp2(xi), want_t = std::tanh(xi);
    bool ok_e, ok_t;
    if (std::isnan(xi)) {
      ok_e = std::isnan(e[i]);
      ok_t = std::isnan(t[i]);
    } else {
      if (want_e >= std::ldexp(1.0, -125))
        ok_e = std::fabs(e[i] - want_e) <= std::ldexp(want_e, -21) || (std::isinf(want_e) && e[i] == inf);
      else if (want_e < std::ldexp(1.0, -127))
        ok_e = e[i] == 0.f;
      else
        ok_e = e[i] == 0.f || std::fabs(e[i] - want_e) <= std::ldexp(want_e, -21);  // the flush's edge
      ok_t = std::fabs(t[i] - want_t) <= 6e-7;
    }
    if ((!ok_e || !ok_t) && ++bad <= 8)
      ADD_FAILURE() << "x " << xi << ": fast_exp2 " << e[i] << " (2^x " << want_e << "), RationalTanh " << t[i]
                    << " (tanh " << want_t << ")";
  }
  EXPECT_EQ(bad, 0);
}

template <int D, int kM, int kN>
void CheckScores() {
  const std::vector<uint16_t> q = RandomBf16(kM * D, 2 + D), k = RandomBf16(kN * D, 3 + kN);
  Dev dq(q), dk(k), out(size_t{kM} * kN * 4);
  const int smem = (kM + kN) * D * 2 + sc::kSwizzleAtomBytes;
  void (*kernel)(const uint16_t*, const uint16_t*, float*) = ScoresKernel<D, kM, kN>;
  CUDA_OK(AllowSmem(kernel, smem));
  CUDA_OK(STRIA_LAUNCH(kernel, 1, 2 * kM, smem, kDefaultStream)(dq.as<uint16_t>(), dk.as<uint16_t>(), out.as<float>()));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> want(size_t{kM} * kN, 0);
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j)
      for (int d = 0; d < D; ++d) want[i * kN + j] += FromBf16(q[i * D + d]) * FromBf16(k[j * D + d]);
  double worst;
  const std::string where = Compare(ToHost<float>(out, want.size()), want, kN, &worst);
  EXPECT_LT(worst, 1e-4) << "D " << D << ", kM " << kM << ", worst at " << where;
}
TEST(HopperWgmma, ScoresAsTheForwardIssuesThem) {
  REQUIRE_HOPPER();
  CheckScores<64, 64, 128>();
  CheckScores<128, 64, 128>();
  CheckScores<128, 128, 128>();  // the forward's tile: two warpgroups, the second at row 64
  CheckScores<256, 128, 64>();   // head dim 256: 64-key tiles
  CheckScores<256, 64, 32>();    // N 32: the head-dim 256 backward's S^T of 32 queries
}

template <int D, int kN>
void CheckPV() {
  std::mt19937_64 rng(4 + D);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> p(size_t{64} * kN);
  for (auto& x : p) x = u(rng);
  const std::vector<uint16_t> v = RandomBf16(kN * D, 5 + D);
  Dev dp(p), dv(v), out(size_t{64} * D * 4);
  const int smem = kN * D * 2 + sc::kSwizzleAtomBytes;
  void (*kernel)(const float*, const uint16_t*, float*) = PVKernel<D, kN>;
  CUDA_OK(AllowSmem(kernel, smem));
  CUDA_OK(STRIA_LAUNCH(kernel, 1, 128, smem, kDefaultStream)(dp.as<float>(), dv.as<uint16_t>(), out.as<float>()));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> want(size_t{64} * D, 0);  // P as the kernel packs it: rounded to bf16
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < kN; ++j)
      for (int d = 0; d < D; ++d) want[i * D + d] += FromBf16(ToBf16(p[i * kN + j])) * FromBf16(v[j * D + d]);
  double worst;
  const std::string where = Compare(ToHost<float>(out, want.size()), want, D, &worst);
  EXPECT_LT(worst, 1e-4) << "D " << D << ", worst at " << where;
}
TEST(HopperWgmma, PTimesVAsTheForwardIssuesIt) {
  REQUIRE_HOPPER();
  CheckPV<64, 128>();
  CheckPV<128, 128>();
  CheckPV<128, 64>();  // 64 keys: the next 64 columns 8 KiB on, as dV and dK read dO and Q
  CheckPV<256, 64>();  // head dim 256: two products of N 128
}

// e4m3 products are exact in f32 here (few terms of few bits); the GPU's FP8 accumulation is
// coarser than f32's, hence the looser bound than the 16-bit checks'.
TEST(HopperWgmma, E4m3ScoresBothOperandsKMajor) {
  REQUIRE_HOPPER();
  for (int kn : {64, 128}) {
    const std::vector<uint8_t> q = RandomE4m3(64 * 128, 11), k = RandomE4m3(size_t(kn) * 128, 12 + kn);
    Dev dq(q), dk(k), out(size_t{64} * kn * 4);
    const int smem = (64 + kn) * 128 + sc::kSwizzleAtomBytes;
    void (*kernel)(const uint8_t*, const uint8_t*, float*) = kn == 64 ? ScoresE4m3Kernel<64> : ScoresE4m3Kernel<128>;
    CUDA_OK(AllowSmem(kernel, smem));
    CUDA_OK(STRIA_LAUNCH(kernel, 1, 128, smem, kDefaultStream)(dq.as<uint8_t>(), dk.as<uint8_t>(), out.as<float>()));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> want(size_t{64} * kn, 0);
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < kn; ++j)
        for (int d = 0; d < 128; ++d)
          want[i * kn + j] += stria::Float8E4M3ToF32(q[i * 128 + d]) * stria::Float8E4M3ToF32(k[j * 128 + d]);
    double worst;
    const std::string where = Compare(ToHost<float>(out, want.size()), want, kn, &worst);
    EXPECT_LT(worst, 2e-3) << "N " << kn << ", worst at " << where;
  }
}

template <int D>
void CheckPVE4m3() {
  constexpr int kN = 128;
  std::mt19937_64 rng(40 + D);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  std::vector<float> p(size_t{64} * kN);
  for (auto& x : p) x = u(rng);
  const std::vector<uint8_t> v = RandomE4m3(size_t{kN} * D, 41 + D);  // [keys, D]
  std::vector<uint8_t> vt(size_t{D} * kN);                            // [D, keys in P V's order]
  for (int d = 0; d < D; ++d)
    for (int pos = 0; pos < kN; ++pos) vt[d * kN + pos] = v[sc::E4m3PvKey(pos) * D + d];
  Dev dp(p), dvt(vt), out(size_t{64} * D * 4);
  const int smem = D * kN + sc::kSwizzleAtomBytes;
  void (*kernel)(const float*, const uint8_t*, float*) = PVE4m3Kernel<D>;
  CUDA_OK(AllowSmem(kernel, smem));
  CUDA_OK(STRIA_LAUNCH(kernel, 1, 128, smem, kDefaultStream)(dp.as<float>(), dvt.as<uint8_t>(), out.as<float>()));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<double> want(size_t{64} * D, 0);  // P as the kernel packs it: rounded to e4m3
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < kN; ++j)
      for (int d = 0; d < D; ++d)
        want[i * D + d] +=
            stria::Float8E4M3ToF32(stria::F32ToFloat8E4M3(p[i * kN + j])) * stria::Float8E4M3ToF32(v[j * D + d]);
  double worst;
  const std::string where = Compare(ToHost<float>(out, want.size()), want, D, &worst);
  EXPECT_LT(worst, 2e-3) << "D " << D << ", worst at " << where;
}
TEST(HopperWgmma, E4m3PTimesVWithPFromTheAccumulatorLayout) {
  REQUIRE_HOPPER();
  CheckPVE4m3<64>();
  CheckPVE4m3<128>();
}

TEST(HopperWgmma, DvFromSharedPTransposedAsTheWideBackwardIssuesIt) {
  REQUIRE_HOPPER();
  const std::vector<uint16_t> p_t = RandomBf16(size_t{kPtKeys} * kPtQueries, 8),
                              dout = RandomBf16(size_t{kPtQueries} * kPtDim, 9);
  Dev dp(p_t), ddo(dout), out(size_t{64} * 128 * 4);
  const int smem = (kPtKeys + kPtDim) * kPtQueries * 2 + sc::kSwizzleAtomBytes;
  CUDA_OK(AllowSmem(PtDoKernel, smem));
  for (int h = 0; h < 2; ++h) {
    CUDA_OK(STRIA_LAUNCH(PtDoKernel, 1, 128, smem, kDefaultStream)(dp.as<uint16_t>(), ddo.as<uint16_t>(), h,
                                                                   out.as<float>()));
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<double> want(size_t{64} * 128, 0);
    for (int j = 0; j < kPtKeys; ++j)
      for (int n = 0; n < 128; ++n)
        for (int i = 0; i < kPtQueries; ++i)
          want[j * 128 + n] += FromBf16(p_t[j * kPtQueries + i]) * FromBf16(dout[i * kPtDim + 128 * h + n]);
    double worst;
    const std::string where = Compare(ToHost<float>(out, want.size()), want, 128, &worst);
    EXPECT_LT(worst, 1e-4) << "columns " << 128 * h << ".., worst at " << where;
  }
}

TEST(HopperWgmma, DqFromTransposedOperandsAsTheBackwardIssuesIt) {
  REQUIRE_HOPPER();
  const std::vector<uint16_t> ds_t = RandomBf16(size_t{kDqKeys} * kDqQueries, 6),
                              k = RandomBf16(size_t{kDqKeys} * kDqDim, 7);
  Dev dds(ds_t), dk(k), out(size_t{64} * 64 * 4);
  const int smem = kDqKeys * (kDqQueries + kDqDim) * 2 + sc::kSwizzleAtomBytes;
  CUDA_OK(AllowSmem(DqKernel, smem));
  for (int qb = 0; qb < 2; ++qb)
    for (int cb = 0; cb < 2; ++cb) {
      CUDA_OK(STRIA_LAUNCH(DqKernel, 1, 128, smem, kDefaultStream)(dds.as<uint16_t>(), dk.as<uint16_t>(), qb, cb,
                                                                   out.as<float>()));
      CUDA_OK(cudaDeviceSynchronize());
      std::vector<double> want(size_t{64} * 64, 0);
      for (int i = 0; i < 64; ++i)
        for (int n = 0; n < 64; ++n)
          for (int j = 0; j < kDqKeys; ++j)
            want[i * 64 + n] += FromBf16(ds_t[j * kDqQueries + 64 * qb + i]) * FromBf16(k[j * kDqDim + 64 * cb + n]);
      double worst;
      const std::string where = Compare(ToHost<float>(out, want.size()), want, 64, &worst);
      EXPECT_LT(worst, 1e-4) << "block (" << qb << ", " << cb << "), worst at " << where;
    }
}

}  // namespace
