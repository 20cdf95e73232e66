// Tests of the CUDA emulator (tests/cuda_emu): every primitive of cuda/device_api.cuh against the
// PTX ISA, and the errors it must catch. The fragment layouts here are written as "where does
// element (r, c) live" (the PTX figures read that way), independently of the emulator, which
// computes "what does lane l hold".
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/device_api.cuh"

namespace stria {
namespace cuda {
namespace {

using emu::Dim3;
using emu::Launch;

// Where a matrix element lives in a warp's fragments.
struct Pos {
  int lane, reg, half;  // half: 0 = bits 0..15 (or the float index for C/D), 1 = bits 16..31
};
// mma.m16n8k16 A (16x16, row r, column c): lane 4*(r%8) + (c%8)/2, register r/8 + 2*(c/8).
Pos APos(int r, int c) {
  return {4 * (r % 8) + (c % 8) / 2, r / 8 + 2 * (c / 8), c % 2};
}
// B (16x8, row k, column n): lane 4*n + (k%8)/2, register k/8.
Pos BPos(int k, int n) {
  return {4 * n + (k % 8) / 2, k / 8, k % 2};
}
// C/D (16x8, row r, column n): lane 4*(r%8) + n/2, float 2*(r/8) + n%2.
Pos CPos(int r, int n) {
  return {4 * (r % 8) + n / 2, 2 * (r / 8) + n % 2, 0};
}

void Put(uint32_t* reg, int half, uint16_t v) {
  if (half == 0) {
    *reg = (*reg & 0xffff0000u) | v;
  } else {
    *reg = (*reg & 0xffffu) | (static_cast<uint32_t>(v) << 16);
  }
}
uint16_t Get(uint32_t reg, int half) {
  return static_cast<uint16_t>(half == 0 ? reg & 0xffffu : reg >> 16);
}

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// ---------------------------------------------------------------- conversions

TEST(EmuConvert, HalfSpecialValues) {
  EXPECT_EQ(from_float<Half>(1.0f), 0x3c00);
  EXPECT_EQ(from_float<Half>(-2.0f), 0xc000);
  EXPECT_EQ(from_float<Half>(0.0f), 0x0000);
  EXPECT_EQ(from_float<Half>(-0.0f), 0x8000);
  EXPECT_EQ(from_float<Half>(65504.0f), 0x7bff);
  EXPECT_EQ(from_float<Half>(65519.99f), 0x7bff);
  EXPECT_EQ(from_float<Half>(65520.0f), 0x7c00);  // the tie rounds to the even "65536": inf
  EXPECT_EQ(from_float<Half>(1e30f), 0x7c00);
  EXPECT_EQ(from_float<Half>(INFINITY), 0x7c00);
  EXPECT_EQ(from_float<Half>(-INFINITY), 0xfc00);
  EXPECT_TRUE(std::isnan(to_float<Half>(from_float<Half>(NAN))));
  EXPECT_TRUE(std::isnan(to_float<Half>(from_float<Half>(-NAN))));
  EXPECT_EQ(from_float<Half>(std::ldexp(1.0f, -14)), 0x0400);     // smallest normal
  EXPECT_EQ(from_float<Half>(std::ldexp(1023.0f, -24)), 0x03ff);  // largest subnormal
  EXPECT_EQ(from_float<Half>(std::ldexp(1.0f, -24)), 0x0001);     // smallest subnormal
  EXPECT_EQ(from_float<Half>(std::ldexp(1.0f, -25)), 0x0000);     // tie: to even (0)
  EXPECT_EQ(from_float<Half>(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(from_float<Half>(std::ldexp(3.0f, -25)), 0x0002);  // tie 1|2: even
  EXPECT_EQ(from_float<Half>(std::ldexp(5.0f, -25)), 0x0002);  // tie 2|3: even
  EXPECT_EQ(from_float<Half>(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(from_float<Half>(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie: even mantissa 0
  EXPECT_EQ(from_float<Half>(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie: even mantissa 2
  EXPECT_EQ(from_float<Half>(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)), 0x3c01);
  EXPECT_EQ(to_float<Half>(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(to_float<Half>(0x83ff), -std::ldexp(1023.0f, -24));
  EXPECT_EQ(to_float<Half>(0x7c00), INFINITY);
  EXPECT_EQ(to_float<Half>(0xfbff), -65504.0f);
  EXPECT_TRUE(std::isnan(to_float<Half>(0x7c01)));
  EXPECT_TRUE(std::isnan(to_float<Half>(0xfe00)));
}

TEST(EmuConvert, BFloatSpecialValues) {
  EXPECT_EQ(from_float<BFloat>(1.0f), 0x3f80);
  EXPECT_EQ(from_float<BFloat>(-0.0f), 0x8000);
  EXPECT_EQ(from_float<BFloat>(1.0f + std::ldexp(1.0f, -8)), 0x3f80);  // tie: even
  EXPECT_EQ(from_float<BFloat>(1.0f + std::ldexp(3.0f, -8)), 0x3f82);  // tie: even
  EXPECT_EQ(from_float<BFloat>(INFINITY), 0x7f80);
  EXPECT_EQ(from_float<BFloat>(-INFINITY), 0xff80);
  EXPECT_EQ(from_float<BFloat>(3.4028235e38f), 0x7f80);  // FLT_MAX rounds past the largest bf16
  EXPECT_TRUE(std::isnan(to_float<BFloat>(from_float<BFloat>(NAN))));
  // A NaN whose payload is in the low bits only must not round to inf.
  float low_nan;
  const uint32_t bits = 0x7f800001u;
  std::memcpy(&low_nan, &bits, 4);
  EXPECT_TRUE(std::isnan(to_float<BFloat>(from_float<BFloat>(low_nan))));
  EXPECT_EQ(from_float<BFloat>(std::ldexp(1.0f, -133)), 0x0001);  // subnormals stay
  EXPECT_EQ(to_float<BFloat>(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(pack2<BFloat>(1.0f, -2.0f), 0xc0003f80u);
  EXPECT_EQ(pack2<Half>(1.0f, -2.0f), 0xc0003c00u);
}

// Every 16-bit value round-trips, and every midpoint between neighbours (exact in float: at most
// 12 significant bits) rounds to the even one, one float ulp either side to the nearer one.
template <typename T>
void CheckExhaustive() {
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = to_float<T>(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(to_float<T>(from_float<T>(f)))) << h;
      continue;
    }
    ASSERT_EQ(from_float<T>(f), h) << h;
    if ((h & 0x7fffu) == 0 || std::isinf(f)) continue;
    // The neighbour of larger magnitude (same sign), then the midpoint of the two.
    const uint16_t up = static_cast<uint16_t>(h + 1);
    const float g = to_float<T>(up);
    if (std::isinf(g)) continue;  // the largest finite value: its "midpoint" is in the special tests
    const float mid = static_cast<float>((static_cast<double>(f) + g) / 2);
    ASSERT_EQ(static_cast<double>(mid), (static_cast<double>(f) + g) / 2) << h;
    const uint16_t even = (h & 1u) ? up : static_cast<uint16_t>(h);
    EXPECT_EQ(from_float<T>(mid), even) << h;
    EXPECT_EQ(from_float<T>(std::nextafter(mid, f)), h) << h;
    EXPECT_EQ(from_float<T>(std::nextafter(mid, g)), up) << h;
  }
}
TEST(EmuConvert, HalfExhaustive) {
  CheckExhaustive<Half>();
}
TEST(EmuConvert, BFloatExhaustive) {
  CheckExhaustive<BFloat>();
}

#if defined(__FLT16_MAX__) && defined(__x86_64__)
// The compiler's own float -> _Float16 conversion (IEEE, round to nearest even) as an oracle.
TEST(EmuConvert, HalfMatchesCompilerFloat16) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    uint32_t u = rng();
    if (i % 2) u = (u & 0x80000000u) | (0x30000000u + u % 0x18000000u);  // dense near half's range
    float f;
    std::memcpy(&f, &u, 4);
    if (std::isnan(f)) continue;
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t want;
    std::memcpy(&want, &h, 2);
    ASSERT_EQ(from_float<Half>(f), want) << f;
  }
}
#endif

// ---------------------------------------------------------------- mma

template <typename T>
void CheckMma(uint32_t seed) {
  constexpr int kWarps = 2;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-2.f, 2.f);
  // Per warp: A (16x16), B (16x8), C (16x8); two products accumulate: D = C + A B + A2 B2.
  std::vector<float> A(kWarps * 2 * 256), B(kWarps * 2 * 128), C(kWarps * 128);
  for (float& x : A) x = to_float<T>(from_float<T>(dist(rng)));
  for (float& x : B) x = to_float<T>(from_float<T>(dist(rng)));
  for (float& x : C) x = dist(rng);
  std::vector<uint32_t> afrag(kWarps * 2 * 32 * 4), bfrag(kWarps * 2 * 32 * 2);
  std::vector<float> cfrag(kWarps * 32 * 4), dfrag(kWarps * 32 * 4, NAN);
  for (int w = 0; w < kWarps; ++w) {
    for (int p = 0; p < 2; ++p) {
      for (int r = 0; r < 16; ++r) {
        for (int c = 0; c < 16; ++c) {
          const Pos q = APos(r, c);
          Put(&afrag[((w * 2 + p) * 32 + q.lane) * 4 + q.reg], q.half,
              from_float<T>(A[(w * 2 + p) * 256 + r * 16 + c]));
        }
      }
      for (int k = 0; k < 16; ++k) {
        for (int n = 0; n < 8; ++n) {
          const Pos q = BPos(k, n);
          Put(&bfrag[((w * 2 + p) * 32 + q.lane) * 2 + q.reg], q.half, from_float<T>(B[(w * 2 + p) * 128 + k * 8 + n]));
        }
      }
    }
    for (int r = 0; r < 16; ++r) {
      for (int n = 0; n < 8; ++n) {
        const Pos q = CPos(r, n);
        cfrag[(w * 32 + q.lane) * 4 + q.reg] = C[w * 128 + r * 8 + n];
      }
    }
  }
  Launch(Dim3{1}, Dim3{32 * kWarps}, 0, [&] {
    const int w = warp_id(), l = lane_id();
    float d[4];
    for (int i = 0; i < 4; ++i) d[i] = cfrag[(w * 32 + l) * 4 + i];
    for (int p = 0; p < 2; ++p) {
      mma_16816<T>(d, &afrag[((w * 2 + p) * 32 + l) * 4], &bfrag[((w * 2 + p) * 32 + l) * 2]);
    }
    for (int i = 0; i < 4; ++i) dfrag[(w * 32 + l) * 4 + i] = d[i];
  });
  for (int w = 0; w < kWarps; ++w) {
    for (int r = 0; r < 16; ++r) {
      for (int n = 0; n < 8; ++n) {
        double want = C[w * 128 + r * 8 + n];
        for (int p = 0; p < 2; ++p) {
          for (int k = 0; k < 16; ++k) {
            want += static_cast<double>(A[(w * 2 + p) * 256 + r * 16 + k]) * B[(w * 2 + p) * 128 + k * 8 + n];
          }
        }
        const Pos q = CPos(r, n);
        EXPECT_NEAR(dfrag[(w * 32 + q.lane) * 4 + q.reg], want, 1e-5 * (1 + std::fabs(want)))
            << "warp " << w << " D[" << r << "][" << n << "]";
      }
    }
  }
}
TEST(EmuMma, Half) {
  CheckMma<Half>(1);
}
TEST(EmuMma, BFloat) {
  CheckMma<BFloat>(2);
}

TEST(EmuMma, NaNPropagates) {
  float out[32][4];
  Launch(Dim3{1}, Dim3{32}, 0, [&] {
    const uint32_t a[4] = {lane_id() == 0 ? 0x7e007e00u : 0x3c003c00u, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
    const uint32_t b[2] = {0x3c003c00u, 0x3c003c00u};
    float d[4] = {0, 0, 0, 0};
    mma_16816<Half>(d, a, b);
    for (int i = 0; i < 4; ++i) out[lane_id()][i] = d[i];
  });
  // Lane 0's a[0] holds A[0][0..1]: row 0 of D is NaN, row 8 (d[2], d[3]) is 16.
  for (int l = 0; l < 4; ++l) {
    EXPECT_TRUE(std::isnan(out[l][0]) && std::isnan(out[l][1])) << l;
    EXPECT_EQ(out[l][2], 16.f) << l;
  }
  EXPECT_EQ(out[4][0], 16.f);
}

// ---------------------------------------------------------------- ldmatrix

// Four 8x8 matrices, value 1000*i + 10*r + c, whose rows lie in shared memory in a permuted order
// (stored rows of 48 bytes), so that every lane's address matters.
struct LdmatrixSetup {
  static constexpr int kRowElems = 24;  // 48 bytes per stored row
  static int StoredRow(int i, int r) { return (i * 8 + r) * 5 % 32; }
  static uint16_t Value(int i, int r, int c) { return static_cast<uint16_t>(1000 * i + 10 * r + c); }
};

void CheckLdmatrix(bool trans) {
  using S = LdmatrixSetup;
  uint32_t got[32][4];
  Launch(Dim3{1}, Dim3{64}, 32 * S::kRowElems * 2, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint16_t* rows = reinterpret_cast<uint16_t*>(smem);
    if (threadIdx.x == 0) {
      for (int i = 0; i < 4; ++i) {
        for (int r = 0; r < 8; ++r) {
          for (int c = 0; c < 8; ++c) rows[S::StoredRow(i, r) * S::kRowElems + c] = S::Value(i, r, c);
        }
      }
    }
    block_sync();
    const int l = lane_id();
    uint32_t reg[4];
    const uint16_t* my_row = rows + S::StoredRow(l / 8, l % 8) * S::kRowElems;
    if (trans) {
      ldmatrix_x4_trans(reg, my_row);
    } else {
      ldmatrix_x4(reg, my_row);
    }
    if (warp_id() == 1) std::memcpy(got[l], reg, 16);  // warp 0 did the same
  });
  for (int i = 0; i < 4; ++i) {
    for (int r = 0; r < 8; ++r) {
      for (int c = 0; c < 8; ++c) {
        // Element (r, c) of matrix i: without .trans in lane 4r + c/2, half c%2; with .trans the
        // matrix arrives transposed, so (r, c) is at lane 4c + r/2, half r%2. Register i.
        const int lane = trans ? 4 * c + r / 2 : 4 * r + c / 2, half = trans ? r % 2 : c % 2;
        EXPECT_EQ(Get(got[lane][i], half), S::Value(i, r, c))
            << (trans ? "trans " : "") << "matrix " << i << " (" << r << "," << c << ")";
      }
    }
  }
}
TEST(EmuLdmatrix, X4) {
  CheckLdmatrix(false);
}
TEST(EmuLdmatrix, X4Trans) {
  CheckLdmatrix(true);
}

// The flash-attention pattern: lane l gives row l%16, column 8*(l/16) of a row-major 16x16 tile;
// the four registers are then exactly the A fragment of mma.m16n8k16.
TEST(EmuLdmatrix, AFragmentOfRowMajorTile) {
  constexpr int kStride = 24;
  uint32_t got[32][4];
  Launch(Dim3{1}, Dim3{32}, 16 * kStride * 2, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint16_t* tile = reinterpret_cast<uint16_t*>(smem);
    const int l = lane_id();
    for (int i = l; i < 256; i += 32) tile[i / 16 * kStride + i % 16] = static_cast<uint16_t>(i);
    warp_sync();
    ldmatrix_x4(got[l], tile + (l % 16) * kStride + 8 * (l / 16));
  });
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      const Pos q = APos(r, c);
      EXPECT_EQ(Get(got[q.lane][q.reg], q.half), r * 16 + c) << "A[" << r << "][" << c << "]";
    }
  }
}

// S = Q K^T and O = P V as the flash kernels compute them: A by ldmatrix, B of K (stored rows n,
// columns k) by ldmatrix, B of V (stored rows k, columns n) by ldmatrix .trans; against scalar.
template <typename T>
void CheckLdmatrixMma() {
  constexpr int kStride = 24;  // 16 + 8 elements of padding
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  std::vector<uint16_t> q(256), k(256), v(256);
  for (auto* m : {&q, &k, &v}) {
    for (uint16_t& x : *m) x = from_float<T>(dist(rng));
  }
  float s_out[16][16], o_out[16][16];
  Launch(Dim3{1}, Dim3{32}, 3 * 16 * kStride * 2, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint16_t* qs = reinterpret_cast<uint16_t*>(smem);
    uint16_t* ks = qs + 16 * kStride;
    uint16_t* vs = ks + 16 * kStride;
    const int l = lane_id(), g = l >> 2, t = l & 3;
    for (int i = l; i < 256; i += 32) {
      qs[i / 16 * kStride + i % 16] = q[i];
      ks[i / 16 * kStride + i % 16] = k[i];
      vs[i / 16 * kStride + i % 16] = v[i];
    }
    warp_sync();
    uint32_t a[4], b[4];
    ldmatrix_x4(a, qs + (l & 15) * kStride + (l >> 4) * 8);
    ldmatrix_x4(b, ks + ((l & 7) + (l >> 4) * 8) * kStride + ((l >> 3) & 1) * 8);
    float s[2][4] = {};
    mma_16816<T>(s[0], a, b);
    mma_16816<T>(s[1], a, b + 2);
    for (int nt = 0; nt < 2; ++nt) {
      for (int c = 0; c < 4; ++c) s_out[g + 8 * (c >> 1)][nt * 8 + 2 * t + (c & 1)] = s[nt][c];
    }
    // P = S rounded to T, as the A operand of P V straight from the accumulators.
    const uint32_t p[4] = {pack2<T>(s[0][0], s[0][1]), pack2<T>(s[0][2], s[0][3]), pack2<T>(s[1][0], s[1][1]),
                           pack2<T>(s[1][2], s[1][3])};
    ldmatrix_x4_trans(b, vs + ((l & 7) + ((l >> 3) & 1) * 8) * kStride + (l >> 4) * 8);
    float o[2][4] = {};
    mma_16816<T>(o[0], p, b);
    mma_16816<T>(o[1], p, b + 2);
    for (int nt = 0; nt < 2; ++nt) {
      for (int c = 0; c < 4; ++c) o_out[g + 8 * (c >> 1)][nt * 8 + 2 * t + (c & 1)] = o[nt][c];
    }
  });
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) {
      double s = 0, o = 0;
      for (int x = 0; x < 16; ++x) s += static_cast<double>(to_float<T>(q[i * 16 + x])) * to_float<T>(k[j * 16 + x]);
      for (int x = 0; x < 16; ++x) {
        double sx = 0;
        for (int y = 0; y < 16; ++y) sx += static_cast<double>(to_float<T>(q[i * 16 + y])) * to_float<T>(k[x * 16 + y]);
        o += static_cast<double>(to_float<T>(from_float<T>(static_cast<float>(sx)))) * to_float<T>(v[x * 16 + j]);
      }
      EXPECT_NEAR(s_out[i][j], s, 1e-5) << "S[" << i << "][" << j << "]";
      EXPECT_NEAR(o_out[i][j], o, 1e-4) << "O[" << i << "][" << j << "]";
    }
  }
}
TEST(EmuLdmatrix, MmaProductsHalf) {
  CheckLdmatrixMma<Half>();
}
TEST(EmuLdmatrix, MmaProductsBFloat) {
  CheckLdmatrixMma<BFloat>();
}

// ---------------------------------------------------------------- shuffles

TEST(EmuShfl, XorAndIndex) {
  constexpr int kThreads = 96;
  std::vector<float> x(kThreads * 6), idx(kThreads * 3);
  Launch(Dim3{1}, Dim3{kThreads}, 0, [&] {
    const int l = lane_id(), w = warp_id(), tid = static_cast<int>(threadIdx.x);
    const float v = static_cast<float>(100 * w + l) + 0.5f;
    const int masks[6] = {1, 2, 4, 8, 16, 33};
    for (int m = 0; m < 6; ++m) x[tid * 6 + m] = shfl_xor(v, masks[m]);
    idx[tid * 3 + 0] = shfl(v, (l * 7 + 3) % 32);
    idx[tid * 3 + 1] = shfl(v, 37);  // source lane 37 mod 32 = 5
    idx[tid * 3 + 2] = shfl(v, 0);   // broadcast
  });
  for (int tid = 0; tid < kThreads; ++tid) {
    const int l = tid % 32, w = tid / 32;
    auto val = [&](int lane) { return static_cast<float>(100 * w + lane) + 0.5f; };
    for (int m = 0; m < 5; ++m) EXPECT_EQ(x[tid * 6 + m], val(l ^ (1 << m))) << tid << " mask " << (1 << m);
    EXPECT_EQ(x[tid * 6 + 5], val(l)) << tid << ": lane ^ 33 is past the warp, so the lane keeps its own";
    EXPECT_EQ(idx[tid * 3 + 0], val((l * 7 + 3) % 32)) << tid;
    EXPECT_EQ(idx[tid * 3 + 1], val(5)) << tid;
    EXPECT_EQ(idx[tid * 3 + 2], val(0)) << tid;
  }
}

TEST(EmuShfl, WarpReductionLoop) {
  std::vector<float> out(64);
  Launch(Dim3{1}, Dim3{64}, 0, [&] {
    float v = static_cast<float>(threadIdx.x);
    for (int o = 16; o > 0; o >>= 1) v += shfl_xor(v, o);
    out[threadIdx.x] = v;
  });
  for (int i = 0; i < 64; ++i) EXPECT_EQ(out[i], i < 32 ? 496.f : 1520.f) << i;
}

// ---------------------------------------------------------------- block barrier, indices

TEST(EmuBlock, SyncOrdersSharedMemory) {
  constexpr int kX = 64, kY = 4, kN = kX * kY;
  std::vector<float> first(kN), second(kN);
  Launch(Dim3{3}, Dim3{kX, kY}, kN * sizeof(float), [&] {
    STRIA_DYNAMIC_SMEM(smem);
    float* s = reinterpret_cast<float*>(smem);
    const int i = static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x);
    const float base = static_cast<float>(blockIdx.x * 1000);
    s[i] = base + static_cast<float>(2 * i + 1);
    block_sync();
    const float a = s[(i + 1) % kN];
    block_sync();  // everybody read before anybody overwrites
    s[i] = base - static_cast<float>(i);
    block_sync();
    const float b = s[(i + 5) % kN];
    if (blockIdx.x == 2) {
      first[i] = a - base;
      second[i] = b - base;
    }
  });
  for (int i = 0; i < kN; ++i) {
    EXPECT_EQ(first[i], static_cast<float>(2 * ((i + 1) % kN) + 1)) << i;
    EXPECT_EQ(second[i], -static_cast<float>((i + 5) % kN)) << i;
  }
}

TEST(EmuBlock, Indices) {
  const Dim3 grid{3, 2, 2}, block{8, 4, 2};
  const int per_block = 64, blocks = 12;
  std::vector<int> seen(blocks * per_block * 8, -1);
  Launch(grid, block, 0, [&] {
    const int b = static_cast<int>((blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x);
    const int t = static_cast<int>((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x);
    int* o = &seen[(b * per_block + t) * 8];
    o[0] = static_cast<int>(threadIdx.x);
    o[1] = static_cast<int>(threadIdx.y);
    o[2] = static_cast<int>(threadIdx.z);
    o[3] = lane_id();
    o[4] = warp_id();
    o[5] = static_cast<int>(gridDim.x * 100 + gridDim.y * 10 + gridDim.z);
    o[6] = static_cast<int>(blockDim.x * 100 + blockDim.y * 10 + blockDim.z);
    o[7] = b;
  });
  for (int b = 0; b < blocks; ++b) {
    for (int t = 0; t < per_block; ++t) {
      const int* o = &seen[(b * per_block + t) * 8];
      EXPECT_EQ(o[0], t % 8);
      EXPECT_EQ(o[1], t / 8 % 4);
      EXPECT_EQ(o[2], t / 32);
      EXPECT_EQ(o[3], t % 32);
      EXPECT_EQ(o[4], t / 32);
      EXPECT_EQ(o[5], 322);
      EXPECT_EQ(o[6], 842);
      EXPECT_EQ(o[7], b);
    }
  }
}

TEST(EmuBlock, AtomicAddAcrossBlocks) {
  float sum = 0.f;
  std::vector<float> per(8, 0.f);
  Launch(Dim3{8}, Dim3{64}, 0, [&] {
    atomic_add(&sum, 1.0f);
    atomic_add(&per[blockIdx.x], static_cast<float>(threadIdx.x));
  });
  EXPECT_EQ(sum, 512.f);
  for (float p : per) EXPECT_EQ(p, 2016.f);
}

// The two-wide reduction adds both lanes and, like the GPU's, wants an 8-byte aligned address.
TEST(EmuBlock, AtomicAdd2) {
  alignas(8) float pair[3] = {0.f, 0.f, 0.f};
  Launch(Dim3{2}, Dim3{32}, 0, [&] { atomic_add2(pair, 1.f, 2.f); });
  EXPECT_EQ(pair[0], 64.f);
  EXPECT_EQ(pair[1], 128.f);
  const std::string e = ErrorOf([&] { Launch(Dim3{1}, Dim3{32}, 0, [&] { atomic_add2(pair + 1, 1.f, 1.f); }); });
  EXPECT_NE(e.find("atomic_add2: address"), std::string::npos) << e;
  EXPECT_NE(e.find("is not 8-byte aligned"), std::string::npos) << e;
}

TEST(EmuBlock, SharedMemoryIsPoisonedPerBlock) {
  std::vector<float> f(4);
  std::vector<uint16_t> h(4);
  Launch(Dim3{4}, Dim3{32}, 64, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    float* s = reinterpret_cast<float*>(smem);
    if (threadIdx.x == 0) {
      f[blockIdx.x] = s[1];  // block 0 writes s[1] below: later blocks must see poison again
      std::memcpy(&h[blockIdx.x], smem + 8, 2);
      s[1] = 1.0f;
    }
  });
  for (int b = 0; b < 4; ++b) {
    EXPECT_TRUE(std::isnan(f[b])) << b;
    EXPECT_TRUE(std::isnan(to_float<Half>(h[b]))) << b;
    EXPECT_TRUE(std::isnan(to_float<BFloat>(h[b]))) << b;
  }
}

void AddKernel(float* p, float v) {
  atomic_add(p + threadIdx.x % 4, v);
}

TEST(EmuBlock, LaunchKernelPointer) {
  float out[4] = {0, 0, 0, 0};
  Launch(Dim3{2}, Dim3{32}, 0, &AddKernel, out, 0.5f);
  for (float x : out) EXPECT_EQ(x, 8.f);
}

// ---------------------------------------------------------------- schedules

// Sets a schedule for one test and goes back to the environment's after it.
struct ScopedSchedule {
  ScopedSchedule(emu::Schedule s, uint64_t seed = 0) { emu::SetSchedule(s, seed); }
  ~ScopedSchedule() { emu::ResetSchedule(); }
};

// Which block and warp ran, in order: each thread logs itself between warp collectives, three
// times before a block_sync and three times after it.
struct Event {
  int block, warp, phase;
};
std::vector<Event> RunLog(emu::Schedule schedule, uint64_t seed = 0) {
  ScopedSchedule scope(schedule, seed);
  std::vector<Event> log;
  Launch(Dim3{3}, Dim3{128}, 0, [&] {
    for (int phase = 0; phase < 2; ++phase) {
      for (int k = 0; k < 3; ++k) {
        if (lane_id() == 0) log.push_back({static_cast<int>(blockIdx.x), warp_id(), phase});
        warp_sync();
      }
      block_sync();
    }
  });
  return log;
}

// The warps of each block and phase in the order they ran, each warp's three events together;
// empty if a warp's events were interleaved with another's.
std::vector<int> WarpOrder(const std::vector<Event>& log, int block, int phase) {
  std::vector<int> order;
  for (const Event& e : log) {
    if (e.block != block || e.phase != phase) continue;
    if (order.empty() || order.back() != e.warp) order.push_back(e.warp);
  }
  return order.size() == 4 ? order : std::vector<int>{};
}

std::vector<int> BlockOrder(const std::vector<Event>& log) {
  std::vector<int> order;
  for (const Event& e : log)
    if (order.empty() || order.back() != e.block) order.push_back(e.block);
  return order;
}

TEST(EmuSchedule, RoundRobinInterleavesWarps) {
  const std::vector<Event> log = RunLog(emu::Schedule::kRoundRobin);
  ASSERT_EQ(log.size(), 3u * 4 * 6);
  EXPECT_EQ(BlockOrder(log), (std::vector<int>{0, 1, 2}));
  // Every warp logs once before any logs again: the warps move together.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(log[i].warp, static_cast<int>(i));
  EXPECT_EQ(log[4].warp, 0);
  EXPECT_TRUE(WarpOrder(log, 0, 0).empty());
}

TEST(EmuSchedule, WarpsRunAloneInPriorityOrder) {
  const std::vector<Event> up = RunLog(emu::Schedule::kWarpsAscending);
  const std::vector<Event> down = RunLog(emu::Schedule::kWarpsDescending);
  EXPECT_EQ(BlockOrder(up), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(BlockOrder(down), (std::vector<int>{2, 1, 0}));
  for (int b = 0; b < 3; ++b) {
    for (int phase = 0; phase < 2; ++phase) {  // also after the barrier: the first warp goes first
      EXPECT_EQ(WarpOrder(up, b, phase), (std::vector<int>{0, 1, 2, 3})) << b << " " << phase;
      EXPECT_EQ(WarpOrder(down, b, phase), (std::vector<int>{3, 2, 1, 0})) << b << " " << phase;
    }
  }
}

TEST(EmuSchedule, ShuffledIsSeededAndRedrawnAtBarriers) {
  const std::vector<Event> a = RunLog(emu::Schedule::kWarpsShuffled, 11);
  std::set<std::vector<int>> warp_orders;
  std::set<std::vector<int>> block_orders{BlockOrder(a)};
  for (int b = 0; b < 3; ++b) {
    for (int phase = 0; phase < 2; ++phase) {
      std::vector<int> o = WarpOrder(a, b, phase);
      ASSERT_FALSE(o.empty()) << "warps interleaved in block " << b << " phase " << phase;
      warp_orders.insert(o);
      std::sort(o.begin(), o.end());
      EXPECT_EQ(o, (std::vector<int>{0, 1, 2, 3}));
    }
  }
  EXPECT_GT(warp_orders.size(), 1u);  // six draws of 24 orders
  for (uint64_t seed = 12; seed < 20; ++seed)
    block_orders.insert(BlockOrder(RunLog(emu::Schedule::kWarpsShuffled, seed)));
  EXPECT_GT(block_orders.size(), 1u);
  // The same seed, the same run.
  const std::vector<Event> again = RunLog(emu::Schedule::kWarpsShuffled, 11);
  ASSERT_EQ(again.size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(again[i].warp + 10 * again[i].block, a[i].warp + 10 * a[i].block);
}

// Warp w writes its slot and, two collectives later, reads warp w + 1's: without a barrier
// between, the round-robin order hides the race (every warp wrote by then) and the warp-serial
// orders show it, as poison in one direction or the other.
std::vector<float> ReadNeighbour(emu::Schedule schedule, bool barrier) {
  ScopedSchedule scope(schedule);
  std::vector<float> got(4);
  Launch(Dim3{1}, Dim3{128}, 4 * sizeof(float), [&] {
    STRIA_DYNAMIC_SMEM(smem);
    float* s = reinterpret_cast<float*>(smem);
    const int w = warp_id();
    if (lane_id() == 0) s[w] = static_cast<float>(w);
    warp_sync();
    if (barrier) block_sync();
    warp_sync();
    if (lane_id() == 0) got[w] = s[(w + 1) % 4];
  });
  return got;
}

TEST(EmuSchedule, WarpSerialOrdersExposeAMissingBarrier) {
  const std::vector<float> expected{1, 2, 3, 0};
  for (auto s : {emu::Schedule::kRoundRobin, emu::Schedule::kWarpsAscending, emu::Schedule::kWarpsDescending}) {
    EXPECT_EQ(ReadNeighbour(s, true), expected);
  }
  EXPECT_EQ(ReadNeighbour(emu::Schedule::kRoundRobin, false), expected);  // the race, hidden
  const std::vector<float> up = ReadNeighbour(emu::Schedule::kWarpsAscending, false);
  const std::vector<float> down = ReadNeighbour(emu::Schedule::kWarpsDescending, false);
  for (int w = 0; w < 3; ++w) EXPECT_TRUE(std::isnan(up[w])) << w;  // read before warp w + 1 wrote
  EXPECT_EQ(up[3], 0.f);
  EXPECT_TRUE(std::isnan(down[3]));  // warp 3 read warp 0's slot first
  for (int w = 0; w < 3; ++w) EXPECT_EQ(down[w], static_cast<float>(w + 1)) << w;
}

TEST(EmuSchedule, FromTheEnvironment) {
  emu::ResetSchedule();
  auto run = [](const char* value) {
    setenv("STRIA_EMU_SCHEDULE", value, 1);
    std::vector<int> blocks;
    const std::string e = ErrorOf([&] {
      Launch(Dim3{3}, Dim3{32}, 0, [&] {
        if (threadIdx.x == 0) blocks.push_back(static_cast<int>(blockIdx.x));
      });
    });
    unsetenv("STRIA_EMU_SCHEDULE");
    return e.empty() ? std::to_string(blocks[0]) + std::to_string(blocks[1]) + std::to_string(blocks[2]) : e;
  };
  EXPECT_EQ(run("round-robin"), "012");
  EXPECT_EQ(run("warps-ascending"), "012");
  EXPECT_EQ(run("warps-descending"), "210");
  EXPECT_EQ(run("warps-shuffled:5").size(), 3u);
  EXPECT_EQ(run("warps-shuffled").size(), 3u);
  for (const char* bad : {"reverse", "warps-shuffled:", "warps-shuffled:x", "warps-shuffled5"}) {
    const std::string e = run(bad);
    EXPECT_NE(e.find("is not round-robin, warps-ascending, warps-descending or warps-shuffled[:seed]"),
              std::string::npos)
        << bad << ": " << e;
  }
  // SetSchedule wins over the environment until ResetSchedule.
  setenv("STRIA_EMU_SCHEDULE", "bogus", 1);
  {
    ScopedSchedule scope(emu::Schedule::kWarpsDescending);
    EXPECT_NO_THROW(Launch(Dim3{1}, Dim3{32}, 0, [] {}));
  }
  EXPECT_THROW(Launch(Dim3{1}, Dim3{32}, 0, [] {}), std::invalid_argument);
  unsetenv("STRIA_EMU_SCHEDULE");
}

// ---------------------------------------------------------------- cp.async

TEST(EmuCpAsync, ZeroFillAndGroups) {
  alignas(16) static uint16_t global[2][256];
  for (int i = 0; i < 256; ++i) {
    global[0][i] = static_cast<uint16_t>(i + 1);
    global[1][i] = static_cast<uint16_t>(i + 5000);
  }
  uint16_t before[32], after_first[32][8], after_all[32][16];
  Launch(Dim3{1}, Dim3{32}, 32 * 32, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint16_t* s = reinterpret_cast<uint16_t*>(smem);
    const int l = lane_id();
    cp_async_16(s + 16 * l, &global[0][8 * l], l % 3 != 0);  // group 0
    cp_async_commit();
    cp_async_16(s + 16 * l + 8, &global[1][8 * l], true);  // group 1
    cp_async_commit();
    before[l] = s[16 * l];  // nothing has landed before a wait
    cp_async_wait<1>();     // group 0 only
    for (int e = 0; e < 8; ++e) after_first[l][e] = s[16 * l + 8 + e];
    cp_async_wait<0>();
    for (int e = 0; e < 16; ++e) after_all[l][e] = s[16 * l + e];
  });
  for (int l = 0; l < 32; ++l) {
    EXPECT_EQ(before[l], 0xffff) << l;
    for (int e = 0; e < 8; ++e) EXPECT_EQ(after_first[l][e], 0xffff) << l;
    for (int e = 0; e < 8; ++e) EXPECT_EQ(after_all[l][e], l % 3 != 0 ? 8 * l + e + 1 : 0) << l;
    for (int e = 0; e < 8; ++e) EXPECT_EQ(after_all[l][8 + e], 8 * l + e + 5000) << l;
  }
}

// ---------------------------------------------------------------- errors

TEST(EmuErrors, LdmatrixOutOfBounds) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{2}, Dim3{64}, 512, [] {
      STRIA_DYNAMIC_SMEM(smem);
      const int l = lane_id();
      const bool bad = blockIdx.x == 1 && warp_id() == 1 && l == 7;
      uint32_t r[4];
      ldmatrix_x4(r, smem + (bad ? 512 : 16 * l));
    });
  });
  EXPECT_NE(e.find("block (1,0,0) thread (39,0,0) (warp 1, lane 7): ldmatrix_x4"), std::string::npos) << e;
  EXPECT_NE(e.find("offset 512 are outside the 512-byte dynamic shared memory"), std::string::npos) << e;
}

TEST(EmuErrors, LdmatrixMisaligned) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{32}, 1024, [] {
      STRIA_DYNAMIC_SMEM(smem);
      uint32_t r[4];
      ldmatrix_x4_trans(r, smem + 16 * lane_id() + (lane_id() == 3 ? 8 : 0));
    });
  });
  EXPECT_NE(e.find("lane 3): ldmatrix_x4_trans: shared-memory offset 56 is not 16-byte aligned"), std::string::npos)
      << e;
}

TEST(EmuErrors, CpAsyncMisalignedGlobal) {
  alignas(16) static unsigned char global[1024];
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{32}, 1024, [] {
      STRIA_DYNAMIC_SMEM(smem);
      const int l = lane_id();
      cp_async_16(smem + 16 * l, global + 16 * l + (l == 9 ? 8 : 0), true);
    });
  });
  EXPECT_NE(e.find("lane 9): cp_async_16: global source"), std::string::npos) << e;
  EXPECT_NE(e.find("is not 16-byte aligned"), std::string::npos) << e;
}

TEST(EmuErrors, CpAsyncOutOfBounds) {
  alignas(16) static unsigned char global[64];
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{32}, 256, [] {
      STRIA_DYNAMIC_SMEM(smem);
      cp_async_16(smem + 16 * lane_id(), global, false);  // zero fill still writes shared memory
    });
  });
  EXPECT_NE(e.find("lane 16): cp_async_16: the 16 bytes at shared-memory offset 256 are outside"), std::string::npos)
      << e;
}

TEST(EmuErrors, DivergentBarrier) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{128}, 0, [] {
      if (threadIdx.x >= 64) return;
      block_sync();
    });
  });
  EXPECT_NE(e.find("block (0,0,0): block_sync never completes: 64 of 128 threads reached it"), std::string::npos) << e;
  EXPECT_NE(e.find("threads 0-63 wait at block_sync; threads 64-127 returned"), std::string::npos) << e;
}

TEST(EmuErrors, EarlyReturnBeforeLaterBarrier) {
  // One thread returns while the others are still busy before the barrier.
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{64}, 0, [] {
      if (threadIdx.x == 40) return;
      for (int i = 0; i < 3; ++i) shfl_xor(1.f, 1);
      block_sync();
    });
  });
  EXPECT_NE(e.find("lane(s) of this warp returned"), std::string::npos) << e;
}

TEST(EmuErrors, MixedCollectives) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{64}, 0, [] {
      if (warp_id() == 1 && lane_id() >= 16) {
        warp_sync();
      } else {
        shfl(1.f, 0);
      }
    });
  });
  EXPECT_NE(e.find("thread (48,0,0) (warp 1, lane 16): reached warp_sync while lane 0 of its warp waits at shfl"),
            std::string::npos)
      << e;
}

TEST(EmuErrors, CollectiveAgainstBarrier) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{32}, 0, [] {
      if (lane_id() < 16) {
        shfl_xor(1.f, 1);
      } else {
        block_sync();
      }
    });
  });
  EXPECT_NE(e.find("deadlock"), std::string::npos) << e;
  EXPECT_NE(e.find("threads 0-15 wait at shfl_xor; threads 16-31 wait at block_sync"), std::string::npos) << e;
}

TEST(EmuErrors, KernelExceptionAndRecovery) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{4}, Dim3{64}, 0, [] {
      shfl(0.f, 0);
      if (blockIdx.x == 2 && threadIdx.x == 5) throw std::runtime_error("boom");
      block_sync();
    });
  });
  EXPECT_NE(e.find("block (2,0,0) thread (5,0,0) (warp 0, lane 5): the kernel threw: boom"), std::string::npos) << e;
  // The emulator is usable again.
  float sum = 0;
  Launch(Dim3{2}, Dim3{64}, 16, [&] {
    block_sync();
    atomic_add(&sum, shfl(1.f, 3));
  });
  EXPECT_EQ(sum, 128.f);
}

TEST(EmuErrors, BadLaunches) {
  EXPECT_THROW(Launch(Dim3{1}, Dim3{48}, 0, [] {}), std::invalid_argument);
  EXPECT_THROW(Launch(Dim3{1}, Dim3{2048}, 0, [] {}), std::invalid_argument);
  EXPECT_THROW(Launch(Dim3{0}, Dim3{32}, 0, [] {}), std::invalid_argument);
  EXPECT_THROW(Launch(Dim3{1}, Dim3{32}, 300 * 1024, [] {}), std::invalid_argument);
  EXPECT_THROW(lane_id(), std::logic_error);
  const std::string e = ErrorOf([] { Launch(Dim3{1}, Dim3{32}, 0, [] { Launch(Dim3{1}, Dim3{32}, 0, [] {}); }); });
  EXPECT_NE(e.find("from inside a kernel"), std::string::npos) << e;
}

// ---------------------------------------------------------------- speed

// 64 blocks of 128 threads, 100 mma per warp with an ldmatrix and a shuffle per 2 mma (about the
// mix of a flash-attention tile loop): should take well under a second at -O2.
TEST(EmuSpeed, FlashLikeLoop) {
  constexpr int kStride = 24, kIters = 50;
  float sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  Launch(Dim3{64}, Dim3{128}, 4 * 16 * kStride * 2, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint16_t* tile = reinterpret_cast<uint16_t*>(smem) + warp_id() * 16 * kStride;
    const int l = lane_id();
    for (int i = l; i < 256; i += 32) tile[i / 16 * kStride + i % 16] = from_float<Half>(0.01f * (i % 7));
    block_sync();
    float d[2][4] = {};
    for (int it = 0; it < kIters; ++it) {
      uint32_t a[4];
      ldmatrix_x4(a, tile + (l & 15) * kStride + (l >> 4) * 8);
      mma_16816<Half>(d[0], a, a);
      mma_16816<Half>(d[1], a, a + 2);
      d[0][0] = shfl_xor(d[0][0], 1);
    }
    if (threadIdx.x == 0) atomic_add(&sink, d[0][0] + d[1][3]);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("64 blocks x 128 threads, 100 mma + 50 ldmatrix + 50 shfl per warp: %.3f s\n", s);
  RecordProperty("seconds", std::to_string(s));
  EXPECT_TRUE(std::isfinite(sink));
}

}  // namespace
}  // namespace cuda
}  // namespace stria
