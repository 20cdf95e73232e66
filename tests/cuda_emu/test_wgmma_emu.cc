// Tests of the emulator's warpgroup MMA (cuda/wgmma_api.cuh) against the PTX ISA. Operands are
// placed in shared memory by the "exact layouts" the PTX ISA gives as examples (bf16, section
// "Shared Memory Matrix Layout"), written out here stride by stride, not through the emulator's
// decoder or the kernels' SwizzledOffset; the swizzle is applied to byte addresses (16-byte
// chunks XORed with the 128-byte row bits), on tiles aligned to the swizzle's repeat.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/wgmma_api.cuh"

namespace stria {
namespace cuda {
namespace {

using emu::Dim3;
using emu::Launch;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

// A byte offset (from a 1024-byte aligned base) after the swizzle of `width` bytes (0: none).
uint32_t Swizzle(uint32_t byte, int width) {
  if (width == 0) return byte;
  const uint32_t bits = width == 128 ? 3 : width == 64 ? 2 : 1;
  return byte ^ (((byte >> 7) & ((1u << bits) - 1)) << 4);
}

struct Layout {
  const char* name;
  bool k_major;
  int rows;                                   // M or N
  std::function<uint32_t(int mn, int k)> at;  // element offset, before the swizzle
  int width;                                  // swizzle bytes, 0 = none
  uint32_t lbo, sbo;                          // bytes
  uint32_t start = 0;                         // bytes past the aligned base the descriptor starts
};

uint64_t Desc(uint32_t addr, const Layout& l) {
  const uint64_t mode = l.width == 0 ? 0 : l.width == 128 ? 1 : l.width == 64 ? 2 : 3;
  return static_cast<uint64_t>((addr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(l.lbo >> 4) << 16) |
         (static_cast<uint64_t>(l.sbo >> 4) << 32) | (mode << 62);
}

// D (64 x N) = A (64 x 16) B (16 x N), bf16, in one warpgroup; B per `lb`, A per `la` (shared
// memory) or in registers (la == nullptr: the m16n8k16 A fragment per warp). Returns the largest
// error against a double product.
double RunProduct(const Layout* la, const Layout& lb) {
  const int N = lb.rows;
  std::mt19937_64 rng(N * 7 + lb.width);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<uint16_t> A(64 * 16), B(16 * N);
  for (auto& x : A) x = emu::FloatToBFloat(u(rng));
  for (auto& x : B) x = emu::FloatToBFloat(u(rng));
  std::vector<float> D(64 * static_cast<size_t>(N), NAN);
  Launch(Dim3{1}, Dim3{128}, 40 * 1024, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    const uint32_t raw = smem_addr(smem), pad = (1024 - raw % 1024) % 1024;
    unsigned char* b_base = smem + pad;
    unsigned char* a_base = b_base + 16384;
    if (threadIdx.x == 0) {
      for (int k = 0; k < 16; ++k)
        for (int n = 0; n < N; ++n) {
          const uint32_t at = Swizzle(lb.start + 2 * lb.at(n, k), lb.width);
          std::memcpy(b_base + at, &B[static_cast<size_t>(k * N + n)], 2);
        }
      for (int m = 0; la != nullptr && m < 64; ++m)
        for (int k = 0; k < 16; ++k)
          std::memcpy(a_base + Swizzle(la->start + 2 * la->at(m, k), la->width), &A[static_cast<size_t>(m * 16 + k)],
                      2);
    }
    fence_proxy_async();
    block_sync();
    const int w = warp_id(), l = lane_id(), g = l >> 2, t = l & 3;
    float d[128];
    for (float& x : d) x = 1e30f;  // must be ignored: scale-d = 0
    // The register A fragment outlives the branch that fills it: the emulator compares it at the
    // wait, as the GPU reads register operands until the operation completes.
    uint32_t a[4];
    wgmma_fence();
    const uint64_t db = Desc(smem_addr(b_base) + lb.start, lb);
    if (la != nullptr && !la->k_major) {  // both MN-major: the transposed form
      const uint64_t da = Desc(smem_addr(a_base) + la->start, *la);
      if (N == 16) wgmma_ss_tt<BFloat, 16>(*reinterpret_cast<float(*)[8]>(d), da, db, false);
      if (N == 128) wgmma_ss_tt<BFloat, 128>(*reinterpret_cast<float(*)[64]>(d), da, db, false);
    } else if (la != nullptr && !lb.k_major) {  // A K-major, B MN-major: the transposed-B form
      const uint64_t da = Desc(smem_addr(a_base) + la->start, *la);
      if (N == 16) wgmma_ss_tb<BFloat, 16>(*reinterpret_cast<float(*)[8]>(d), da, db, false);
      if (N == 128) wgmma_ss_tb<BFloat, 128>(*reinterpret_cast<float(*)[64]>(d), da, db, false);
    } else if (la != nullptr) {
      const uint64_t da = Desc(smem_addr(a_base) + la->start, *la);
      if (N == 16) wgmma_ss<BFloat, 16>(*reinterpret_cast<float(*)[8]>(d), da, db, false);
      if (N == 24) wgmma_ss<BFloat, 24>(*reinterpret_cast<float(*)[12]>(d), da, db, false);
      if (N == 128) wgmma_ss<BFloat, 128>(*reinterpret_cast<float(*)[64]>(d), da, db, false);
    } else {
      // Register r of lane 4g + t: row g + 8 (r & 1), columns 2t + 8 (r >> 1) and + 1.
      for (int r = 0; r < 4; ++r) {
        const int row = 16 * w + g + 8 * (r & 1), col = 2 * t + 8 * (r >> 1);
        a[r] = A[static_cast<size_t>(row * 16 + col)] |
               (static_cast<uint32_t>(A[static_cast<size_t>(row * 16 + col + 1)]) << 16);
      }
      if (N == 16) wgmma_rs_tb<BFloat, 16>(*reinterpret_cast<float(*)[8]>(d), a, db, false);
      if (N == 32) wgmma_rs_tb<BFloat, 32>(*reinterpret_cast<float(*)[16]>(d), a, db, false);
      if (N == 64) wgmma_rs_tb<BFloat, 64>(*reinterpret_cast<float(*)[32]>(d), a, db, false);
      if (N == 128) wgmma_rs_tb<BFloat, 128>(*reinterpret_cast<float(*)[64]>(d), a, db, false);
    }
    wgmma_commit();
    wgmma_wait<0>();
    // Accumulator element i: row 16 w + g + 8 ((i & 3) >> 1), column 8 (i >> 2) + 2 t + (i & 1).
    for (int i = 0; i < N / 2; ++i) {
      const int row = 16 * w + g + 8 * ((i & 3) >> 1), col = 8 * (i >> 2) + 2 * t + (i & 1);
      D[static_cast<size_t>(row * N + col)] = d[i];
    }
  });
  double worst = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < N; ++n) {
      double want = 0;
      for (int k = 0; k < 16; ++k)
        want += static_cast<double>(emu::BFloatToFloat(A[static_cast<size_t>(m * 16 + k)])) *
                emu::BFloatToFloat(B[static_cast<size_t>(k * N + n)]);
      const double got = D[static_cast<size_t>(m * N + n)];
      worst = std::isnan(got) ? INFINITY : std::max(worst, std::fabs(got - want));
    }
  return worst;
}

// B N-major (the transposed-B form), the PTX examples for bf16 (T = 8, m = 2, k = 2):
//   none: ((8,1,2),(8,2)):((1,8,64),(8,128)),    LBO 128*2, SBO 64*2
//   32B:  ((8,2,2),(8,2)):((1,8,128),(16,256)),  LBO 128*2, SBO 256*2
//   64B:  ((8,4,2),(8,2)):((1,8,256),(32,512)),  LBO 256*2, SBO 512*2
// and 128B from the canonical ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)) with compact strides.
TEST(EmuWgmma, NMajorExamplesOfThePtxIsa) {
  const Layout none{
      "mn none", false, 16, [](int n, int k) -> uint32_t { return n % 8 + 64 * (n / 8) + 8 * (k % 8) + 128 * (k / 8); },
      0,         256,   128};
  const Layout sw32{
      "mn 32B",
      false,
      32,
      [](int n, int k) -> uint32_t { return n % 8 + 8 * (n / 8 % 2) + 128 * (n / 16) + 16 * (k % 8) + 256 * (k / 8); },
      32,
      256,
      512};
  const Layout sw64{
      "mn 64B",
      false,
      64,
      [](int n, int k) -> uint32_t { return n % 8 + 8 * (n / 8 % 4) + 256 * (n / 32) + 32 * (k % 8) + 512 * (k / 8); },
      64,
      512,
      1024};
  const Layout sw128{
      "mn 128B", false,
      128,       [](int n, int k) -> uint32_t { return n % 64 + 1024 * (n / 64) + 64 * (k % 8) + 512 * (k / 8); },
      128,       2048,
      1024};
  for (const Layout* l : {&none, &sw32, &sw64, &sw128}) EXPECT_LT(RunProduct(nullptr, *l), 1e-3) << l->name;
}

// A MN-major too (the transposed-A form, for dQ = dS K with dS^T stored): M = 64 rows laid out
// like the N of the examples above, with B N-major. No swizzle ((T,1,8),(8,2)):((1,T,SBO),(T,LBO))
// and 128B ((T,8,1),(8,2)):((1,T,LBO),(8T,SBO)).
TEST(EmuWgmma, MnMajorA) {
  const Layout a_none{
      "a mn none", false,
      64,          [](int m, int k) -> uint32_t { return m % 8 + 64 * (m / 8) + 8 * (k % 8) + 512 * (k / 8); },
      0,           1024,
      128};
  const Layout b_none{
      "b mn none", false,
      16,          [](int n, int k) -> uint32_t { return n % 8 + 64 * (n / 8) + 8 * (k % 8) + 128 * (k / 8); },
      0,           256,
      128};
  EXPECT_LT(RunProduct(&a_none, b_none), 1e-3) << "none";
  const Layout a128{
      "a mn 128B", false, 64,  [](int m, int k) -> uint32_t { return m % 64 + 64 * (k % 8) + 512 * (k / 8); },
      128,         4096,  1024};
  const Layout b128{
      "b mn 128B", false,
      128,         [](int n, int k) -> uint32_t { return n % 64 + 1024 * (n / 64) + 64 * (k % 8) + 512 * (k / 8); },
      128,         2048,
      1024};
  EXPECT_LT(RunProduct(&a128, b128), 1e-3) << "128B";
  // A transposed but decoded K-major (a wrong form for this layout) must not pass.
  Layout wrong = a128;
  wrong.k_major = true;
  wrong.lbo = 16;
  EXPECT_GT(RunProduct(&wrong, Layout{"b k 128B", true, 24,
                                      [](int n, int k) -> uint32_t { return 64 * (n % 8) + 512 * (n / 8) + k; }, 128,
                                      16, 1024}),
            1e-1);
}

// A and B K-major: no swizzle ((8,m),(T,2)):((T,SBO),(1,LBO)) with core matrices 128 bytes apart
// along K and 256 along M/N; the 32B and 128B swizzles ((8,m),(T,2)):((xT,SBO),(1,T)); and a
// descriptor starting 32 bytes into a 128B-swizzled row (columns 16..31 of a 64-wide tile).
TEST(EmuWgmma, KMajorLayouts) {
  const Layout a_none{
      "a none", true, 64, [](int m, int k) -> uint32_t { return 8 * (m % 8) + 128 * (m / 8) + k % 8 + 64 * (k / 8); },
      0,        128,  256};
  const Layout b_none{
      "b none", true, 24, [](int n, int k) -> uint32_t { return 8 * (n % 8) + 128 * (n / 8) + k % 8 + 64 * (k / 8); },
      0,        128,  256};
  EXPECT_LT(RunProduct(&a_none, b_none), 1e-3) << "none";
  const Layout a32{"a 32B", true, 64, [](int m, int k) -> uint32_t { return 16 * (m % 8) + 128 * (m / 8) + k; },
                   32,      16,   256};
  const Layout b32{"b 32B", true, 16, [](int n, int k) -> uint32_t { return 16 * (n % 8) + 128 * (n / 8) + k; },
                   32,      16,   256};
  EXPECT_LT(RunProduct(&a32, b32), 1e-3) << "32B";
  // 64-wide rows of 128 bytes; the descriptor starts at column 16 (byte 32) of row 0. Element
  // (mn, k) of the operand is column 16 + k of the stored row: offset relative to that start.
  const Layout a128{"a 128B", true, 64,   [](int m, int k) -> uint32_t { return 64 * (m % 8) + 512 * (m / 8) + k; },
                    128,      16,   1024, 32};
  const Layout b128{"b 128B", true, 24,   [](int n, int k) -> uint32_t { return 64 * (n % 8) + 512 * (n / 8) + k; },
                    128,      16,   1024, 32};
  EXPECT_LT(RunProduct(&a128, b128), 1e-3) << "128B, k offset";
}

// A K-major and B MN-major, both in shared memory (dV += P^T dO with P^T stored, as the head-dim
// 256 backward reads it): the 128B K-major A of KMajorLayouts, B N-major as in the PTX examples
// (no swizzle, and 128B over two 64-column blocks).
TEST(EmuWgmma, KMajorAWithMnMajorB) {
  const Layout a128{"a 128B", true, 64,  [](int m, int k) -> uint32_t { return 64 * (m % 8) + 512 * (m / 8) + k; },
                    128,      16,   1024};
  const Layout b_none{
      "b mn none", false,
      16,          [](int n, int k) -> uint32_t { return n % 8 + 64 * (n / 8) + 8 * (k % 8) + 128 * (k / 8); },
      0,           256,
      128};
  EXPECT_LT(RunProduct(&a128, b_none), 1e-3) << "none";
  const Layout b128{
      "b mn 128B", false,
      128,         [](int n, int k) -> uint32_t { return n % 64 + 1024 * (n / 64) + 64 * (k % 8) + 512 * (k / 8); },
      128,         2048,
      1024};
  EXPECT_LT(RunProduct(&a128, b128), 1e-3) << "128B";
  // The same B decoded K-major (the plain shared-shared form) must not pass.
  Layout wrong = b128;
  wrong.k_major = true;
  EXPECT_GT(RunProduct(&a128, wrong), 1e-1);
}

// The kernels' own layout helper agrees with the PTX layout it claims (128B, K-major rows).
TEST(EmuWgmma, SwizzledOffsetIsThe128ByteSwizzle) {
  for (int rows : {64, 128})
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < 128; ++c) {
        const uint32_t want = Swizzle(static_cast<uint32_t>((c / 64) * rows * 128 + r * 128 + (c % 64) * 2), 128);
        ASSERT_EQ(static_cast<uint32_t>(SwizzledOffset(rows, r, c)), want) << rows << " " << r << " " << c;
      }
}

// A warpgroup kernel skeleton for the error tests: K-major 128B operands at an aligned base.
template <typename Body>
void OneWarpgroup(Body body) {
  Launch(Dim3{1}, Dim3{128}, 16 * 1024, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    const uint32_t raw = smem_addr(smem);
    unsigned char* base = smem + (1024 - raw % 1024) % 1024;
    const uint64_t desc = SwizzledDesc(smem_addr(base), 16, 1024);
    body(base, desc);
  });
}

// Zeroes the operand tile of OneWarpgroup in every thread, then fences and synchronises, so
// wgmma may read it.
void ZeroOperands(unsigned char* base) {
  for (int i = static_cast<int>(threadIdx.x); i < 4096; i += 128) std::memset(base + 2 * i, 0, 2);
  fence_proxy_async();
  block_sync();
}

TEST(EmuWgmma, AccumulatorsLandAtTheWait) {
  OneWarpgroup([](unsigned char* base, uint64_t desc) {
    for (int i = static_cast<int>(threadIdx.x); i < 4096; i += 128) std::memset(base + 2 * i, 0, 2);
    if (threadIdx.x == 0) std::memcpy(base, "\x80\x3f", 2);  // A[0][0] = B[0][0] = 1 (bf16)
    fence_proxy_async();
    block_sync();
    float d[8];
    for (float& x : d) x = 5.f;
    wgmma_fence();
    wgmma_ss<BFloat, 16>(d, desc, desc, true);
    wgmma_commit();
    EXPECT_TRUE(std::isnan(d[0]));  // owned by the operation: reading before the wait sees NaN
    wgmma_wait<0>();
    EXPECT_EQ(d[0], threadIdx.x == 0 ? 6.f : 5.f);  // row 0, column 0 is thread 0's element 0
  });
}

TEST(EmuWgmma, ErrorsTheGpuWouldNotReport) {
  std::string e = ErrorOf([] {
    OneWarpgroup([](unsigned char*, uint64_t desc) {
      float d[8] = {};
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
    });
  });
  EXPECT_NE(e.find("no wgmma_fence"), std::string::npos) << e;

  alignas(16) static unsigned char global[16] = {};
  e = ErrorOf([] {
    OneWarpgroup([](unsigned char* base, uint64_t desc) {
      if (threadIdx.x == 7) cp_async_16(base, global, true);
      cp_async_commit();
      cp_async_wait<0>();
      block_sync();
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
    });
  });
  EXPECT_NE(e.find("thread 7 has cp.async data landed in shared memory with no fence_proxy_async"), std::string::npos)
      << e;

  // A plain shared-memory store wgmma reads: not fenced by its writer (thread 9), then fenced but
  // written again after the barrier (a race with the operation).
  e = ErrorOf([] {
    OneWarpgroup([](unsigned char* base, uint64_t desc) {
      if (threadIdx.x == 9) std::memset(base + 1024, 0, 2);
      if (threadIdx.x != 9) fence_proxy_async();
      block_sync();
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
      wgmma_commit();
      wgmma_wait<0>();
    });
  });
  EXPECT_NE(e.find("not fenced for the async proxy"), std::string::npos) << e;
  e = ErrorOf([] {
    OneWarpgroup([](unsigned char* base, uint64_t desc) {
      ZeroOperands(base);
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
      wgmma_commit();
      if (threadIdx.x == 5) std::memset(base + 128, 0x11, 2);  // row 1 of A, before the wait
      wgmma_wait<0>();
    });
  });
  EXPECT_NE(e.find("a write racing the wgmma"), std::string::npos) << e;

  e = ErrorOf([] {
    OneWarpgroup([](unsigned char* base, uint64_t desc) {
      ZeroOperands(base);
      float d[8] = {};
      uint32_t a[4] = {};
      wgmma_fence();
      wgmma_rs_tb<BFloat, 16>(d, a, desc, false);
      wgmma_commit();
      if (threadIdx.x == 3) a[2] = 0x3f80u;  // still being read
      wgmma_wait<0>();
    });
  });
  EXPECT_NE(e.find("thread (3,0,0)"), std::string::npos) << e;
  EXPECT_NE(e.find("A fragment registers changed"), std::string::npos) << e;

  // An accumulator written while a chain of two operations owns it, between their completions.
  e = ErrorOf([] {
    OneWarpgroup([](unsigned char* base, uint64_t desc) {
      ZeroOperands(base);
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
      wgmma_commit();
      wgmma_ss<BFloat, 16>(d, desc, desc, true);
      wgmma_commit();
      wgmma_wait<1>();
      if (threadIdx.x == 6) d[2] = 1.f;  // the second operation still owns it
      wgmma_wait<0>();
    });
  });
  EXPECT_NE(e.find("thread (6,0,0)"), std::string::npos) << e;
  EXPECT_NE(e.find("accumulator 2 of this thread was written"), std::string::npos) << e;

  e = ErrorOf([] {
    OneWarpgroup([](unsigned char*, uint64_t desc) {
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc + (threadIdx.x == 70 ? 2 : 0), desc, false);
      wgmma_commit();
      wgmma_wait<0>();
    });
  });
  EXPECT_NE(e.find("thread (70,0,0)"), std::string::npos) << e;
  EXPECT_NE(e.find("must be uniform"), std::string::npos) << e;

  e = ErrorOf([] {
    OneWarpgroup([](unsigned char*, uint64_t desc) {
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
      wgmma_commit();
    });
  });
  EXPECT_NE(e.find("never waited for"), std::string::npos) << e;

  e = ErrorOf([] {
    OneWarpgroup([](unsigned char*, uint64_t desc) {
      if (warp_id() == 3) return;  // one warp of the group never issues
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, desc, desc, false);
      wgmma_commit();
      wgmma_wait<0>();
    });
  });
  EXPECT_NE(e.find("wait at wgmma_wait"), std::string::npos) << e;

  e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{96}, 4096, [] {
      float d[8] = {};
      wgmma_fence();
      wgmma_ss<BFloat, 16>(d, 0, 0, false);
    });
  });
  EXPECT_NE(e.find("not a whole number of warpgroups"), std::string::npos) << e;
}

}  // namespace
}  // namespace cuda
}  // namespace stria
