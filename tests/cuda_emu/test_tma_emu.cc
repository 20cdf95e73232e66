// Tests of the emulator's mbarriers, TMA loads and named barriers (cuda/tma_api.cuh): mbarrier
// phases and parities as the PTX ISA defines them, where a TMA box lands (against the kernels'
// SwizzledOffset, and against the swizzle's address rule for a destination off the 1024-byte
// repeat), the landing rule (poison from the issue until a wait on the barrier), a
// producer/consumer ring under every schedule, wgmma reading TMA-loaded operands, named barriers
// taking turns, and the errors each must report.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda/tma_api.cuh"

namespace stria {
namespace cuda {
namespace {

using emu::Dim3;
using emu::Launch;
using emu::Schedule;

std::string ErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "(no error)";
}

struct ScopedSchedule {
  explicit ScopedSchedule(Schedule s, uint64_t seed = 0) { emu::SetSchedule(s, seed); }
  ~ScopedSchedule() { emu::ResetSchedule(); }
};

struct NamedSchedule {
  Schedule schedule;
  uint64_t seed;
  const char* name;
};
const NamedSchedule kSchedules[] = {
    {Schedule::kRoundRobin, 0, "round robin"},           {Schedule::kWarpsAscending, 0, "warps ascending"},
    {Schedule::kWarpsDescending, 0, "warps descending"}, {Schedule::kWarpsShuffled, 1, "warps shuffled 1"},
    {Schedule::kWarpsShuffled, 2, "warps shuffled 2"},   {Schedule::kWarpsShuffled, 3, "warps shuffled 3"}};

// ---------------------------------------------------------------- mbarriers

// Four warps, one arrival each (lane 0) per phase, after writing its slot of that phase: a wait
// for the phase's parity returns only once every slot of the phase is written (else it reads
// poison), and again at once while the next phase is open. The warp_sync keeps every thread
// within one phase of the others, as parity waits require.
TEST(EmuMbarrier, PhasesAndParity) {
  constexpr int kPhases = 5;
  for (const NamedSchedule& s : kSchedules) {
    ScopedSchedule scope(s.schedule, s.seed);
    std::vector<int> bad(128, 0);
    Launch(Dim3{1}, Dim3{128}, 64 + kPhases * 4 * sizeof(float), [&] {
      STRIA_DYNAMIC_SMEM(smem);
      uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8);
      float* slot = reinterpret_cast<float*>(smem + 64);
      const int tid = static_cast<int>(threadIdx.x);
      if (tid == 0) {
        mbar_init(bar, 4);
        fence_barrier_init();
      }
      block_sync();
      mbar_wait(bar, 1);  // the phase before phase 0 counts as complete
      block_sync();       // (before anyone completes phase 0, after which parity 1 is phase 1's)
      for (int k = 0; k < kPhases; ++k) {
        if (lane_id() == 0) {
          slot[4 * k + warp_id()] = static_cast<float>(k + 1);
          mbar_arrive(bar);
        }
        mbar_wait(bar, k & 1);
        mbar_wait(bar, k & 1);  // still complete: the open phase k + 1 has the other parity
        for (int w = 0; w < 4; ++w) bad[tid] += slot[4 * k + w] != static_cast<float>(k + 1);
        warp_sync();
      }
    });
    for (int t = 0; t < 128; ++t) ASSERT_EQ(bad[t], 0) << s.name << " thread " << t;
  }
}

TEST(EmuMbarrier, PhaseThatNeverCompletesIsADeadlock) {
  const std::string e = ErrorOf([] {
    Launch(Dim3{1}, Dim3{64}, 64, [] {
      STRIA_DYNAMIC_SMEM(smem);
      uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 16);
      if (threadIdx.x == 0) mbar_init(bar, 2);
      block_sync();
      if (threadIdx.x == 0) mbar_arrive(bar);  // one of two arrivals
      mbar_wait(bar, 0);
    });
  });
  EXPECT_NE(e.find("block (0,0,0): deadlock: an mbarrier phase that threads wait for never completes"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("threads 0-63 wait at mbar_wait for parity 0 on the mbarrier at shared-memory offset 16 (its "
                   "phase 0 has 1 of 2 arrivals and 0 transaction bytes outstanding)"),
            std::string::npos)
      << e;
}

TEST(EmuMbarrier, Errors) {
  auto run = [](const std::function<void(uint64_t*, unsigned char*)>& body) {
    return ErrorOf([&] {
      Launch(Dim3{1}, Dim3{64}, 256, [&] {
        STRIA_DYNAMIC_SMEM(smem);
        body(reinterpret_cast<uint64_t*>(smem), smem);
      });
    });
  };
  std::string e = run([](uint64_t* bar, unsigned char*) {
    if (threadIdx.x == 3) mbar_wait(bar + 1, 0);
  });
  EXPECT_NE(e.find("thread (3,0,0) (warp 0, lane 3): mbar_wait: the mbarrier at shared-memory offset 8 was never "
                   "initialised"),
            std::string::npos)
      << e;

  // A phase whose arrivals are all in, waiting for bytes only, gets one more arrival.
  e = run([](uint64_t* bar, unsigned char*) {
    if (threadIdx.x == 0) mbar_init(bar, 1);
    block_sync();
    if (threadIdx.x == 0) mbar_arrive_expect_tx(bar, 256);
    block_sync();
    if (threadIdx.x == 1) mbar_arrive(bar);
  });
  EXPECT_NE(e.find("thread (1,0,0) (warp 0, lane 1): mbar_arrive: more arrivals than its count (1) in phase 0 of the "
                   "mbarrier at shared-memory offset 0, which waits for 256 transaction bytes only"),
            std::string::npos)
      << e;

  for (int count : {0, 1 << 20}) {
    e = run([count](uint64_t* bar, unsigned char*) {
      if (threadIdx.x == 0) mbar_init(bar, count);
    });
    EXPECT_NE(e.find("mbar_init: count " + std::to_string(count) + " is outside 1..2^20-1"), std::string::npos) << e;
  }
  e = run([](uint64_t*, unsigned char* smem) {
    if (threadIdx.x == 0) mbar_init(reinterpret_cast<uint64_t*>(smem + 4), 1);
  });
  EXPECT_NE(e.find("mbar_init: the mbarrier at shared-memory offset 4 is not 8-byte aligned"), std::string::npos) << e;
  e = run([](uint64_t* bar, unsigned char*) {
    if (threadIdx.x == 0) mbar_arrive(bar + 32);  // offset 256: past the end
  });
  EXPECT_NE(e.find("is not in the 256-byte dynamic shared memory"), std::string::npos) << e;
  // Every thread initialising the barrier (instead of one) re-initialises it under the arrivals.
  e = run([](uint64_t* bar, unsigned char*) {
    mbar_init(bar, 64);
    mbar_arrive(bar);
  });
  EXPECT_NE(e.find("thread (1,0,0) (warp 0, lane 1): mbar_init: the mbarrier at shared-memory offset 0 initialised "
                   "again in the middle of its phase 0"),
            std::string::npos)
      << e;
  e = run([](uint64_t* bar, unsigned char* smem) {
    if (threadIdx.x == 0) mbar_init(bar + 2, 1);
    block_sync();
    if (threadIdx.x == 9) std::memset(smem + 16, 0, 8);  // a tile overlapping the barrier, say
    block_sync();
    if (threadIdx.x == 0) mbar_arrive(bar + 2);
  });
  EXPECT_NE(e.find("mbar_arrive: the 8 bytes of the mbarrier at shared-memory offset 16 were overwritten since its "
                   "mbar_init"),
            std::string::npos)
      << e;
  e = run([](uint64_t* bar, unsigned char*) {
    if (threadIdx.x == 0) mbar_init(bar, 1);
    block_sync();
    mbar_wait(bar, 2);
  });
  EXPECT_NE(e.find("mbar_wait: parity 2 is not 0 or 1"), std::string::npos) << e;
}

// ---------------------------------------------------------------- TMA

// A packed QKV buffer [B, L, 3, H, D] of 16-bit values, none 0 (the zero fill) or 0xFFFF (the
// poison); the K part is the [B, L, H, D] view the loads read, with non-compact strides.
struct Qkv {
  int B, L, H, D;
  std::vector<uint16_t> data;
  Qkv(int b, int l, int h, int d) : B(b), L(l), H(h), D(d), data(static_cast<size_t>(b) * l * 3 * h * d) {
    std::mt19937 rng(static_cast<unsigned>(b * 1000003 + l * 101 + h * 7 + d));
    for (uint16_t& x : data) x = static_cast<uint16_t>(1 + rng() % 0x7000);
  }
  int64_t sb() const { return int64_t{L} * sl(); }
  int64_t sl() const { return int64_t{3} * H * D; }
  int64_t sh() const { return D; }
  const uint16_t* k() const { return data.data() + int64_t{H} * D; }
  // K[b][l][h][col], 0 outside the tensor (as TMA fills).
  uint16_t At(int64_t b, int64_t l, int64_t h, int64_t col) const {
    if (b < 0 || b >= B || l < 0 || l >= L || h < 0 || h >= H || col < 0 || col >= D) return 0;
    return k()[b * sb() + l * sl() + h * sh() + col];
  }
  TensorMap Map(int box_rows) const {
    TensorMap map;
    EXPECT_TRUE(EncodeRowsMap(&map, k(), B, L, H, D, sb(), sl(), sh(), box_rows));
    return map;
  }
};

using Box = std::array<int, 4>;  // c0 (column), c1 (head), c2 (first row), c3 (batch)

// One thread loads `boxes` of `map` (box i at i * box_bytes) with one mbarrier, into a buffer
// `skew` bytes past a 1024-byte aligned shared-window address; every thread waits; returns the
// buffer as thread 5 read it after its wait.
std::vector<unsigned char> LoadBoxes(const TensorMap& map, int box_bytes, const std::vector<Box>& boxes, int skew) {
  const int total = box_bytes * static_cast<int>(boxes.size());
  std::vector<unsigned char> out;
  Launch(Dim3{1}, Dim3{64}, 64 + 1024 + skew + total, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
    unsigned char* dst = AlignToSwizzleAtom(smem + 64) + skew;
    if (threadIdx.x == 0) {
      mbar_init(bar, 1);
      fence_barrier_init();
    }
    block_sync();
    if (threadIdx.x == 0) {
      mbar_arrive_expect_tx(bar, static_cast<uint32_t>(total));
      for (size_t i = 0; i < boxes.size(); ++i) {
        const Box& c = boxes[i];
        tma_load_4d(dst + i * box_bytes, &map, c[0], c[1], c[2], c[3], bar);
      }
    }
    mbar_wait(bar, 0);
    if (threadIdx.x == 5) out.assign(dst, dst + total);
  });
  return out;
}

uint16_t Get16(const std::vector<unsigned char>& bytes, size_t at) {
  uint16_t v;
  std::memcpy(&v, bytes.data() + at, 2);
  return v;
}

// D = 128: two boxes of 64 columns make one swizzled tile of 64 rows, which the kernels address
// with SwizzledOffset. One tile runs past L (rows 36.. zero), one starts before row 0, one is at
// a head past H (all zero).
TEST(EmuTma, BoxesLandWhereSwizzledOffsetSays) {
  const Qkv t(2, 100, 3, 128);
  const TensorMap map = t.Map(64);
  const std::vector<Box> boxes{{0, 2, 64, 1}, {64, 2, 64, 1}, {0, 0, -5, 0}, {64, 0, -5, 0}, {0, 3, 0, 0}};
  const std::vector<unsigned char> got = LoadBoxes(map, 64 * 128, boxes, 0);
  ASSERT_EQ(got.size(), 5u * 8192);
  for (int tile = 0; tile < 2; ++tile) {
    const Box& c = boxes[2 * tile];
    for (int r = 0; r < 64; ++r)
      for (int col = 0; col < 128; ++col) {
        const size_t at = static_cast<size_t>(tile * 16384 + SwizzledOffset(64, r, col));
        ASSERT_EQ(Get16(got, at), t.At(c[3], c[2] + r, c[1], col)) << tile << " " << r << " " << col;
      }
  }
  EXPECT_EQ(Get16(got, 16384 + SwizzledOffset(64, 0, 0)), 0);                // row -5
  EXPECT_NE(Get16(got, 16384 + SwizzledOffset(64, 5, 0)), 0);                // row 0
  EXPECT_EQ(Get16(got, SwizzledOffset(64, 36, 70)), 0);                      // row 100
  EXPECT_NE(Get16(got, SwizzledOffset(64, 35, 70)), 0);                      // row 99
  for (size_t i = 4 * 8192; i < got.size(); ++i) ASSERT_EQ(got[i], 0) << i;  // head 3 of 3
}

// The swizzle is a function of the destination's shared-window address: 384 bytes past the
// 1024-byte repeat, row r of the box is row 3 + r of the pattern.
TEST(EmuTma, SwizzleFollowsTheWindowAddress) {
  const Qkv t(1, 40, 2, 64);
  const TensorMap map = t.Map(16);
  const std::vector<unsigned char> got = LoadBoxes(map, 16 * 128, {{0, 1, 10, 0}}, 384);
  for (int r = 0; r < 16; ++r)
    for (int chunk = 0; chunk < 8; ++chunk)
      for (int e = 0; e < 8; ++e) {
        const size_t at = static_cast<size_t>(r * 128 + ((chunk ^ ((3 + r) & 7)) << 4) + 2 * e);
        ASSERT_EQ(Get16(got, at), t.At(0, 10 + r, 1, 8 * chunk + e)) << r << " " << chunk << " " << e;
      }
}

// Extent-1 dimensions take any stride (0 here): the map is valid and loads right.
TEST(EmuTma, ExtentOneDimensionsIgnoreTheirStride) {
  std::vector<uint16_t> x(static_cast<size_t>(20) * 64);
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint16_t>(i + 1);
  TensorMap map;
  ASSERT_TRUE(EncodeRowsMap(&map, x.data(), 1, 20, 1, 64, 0, 64, 0, 8));
  const std::vector<unsigned char> got = LoadBoxes(map, 8 * 128, {{0, 0, 16, 0}}, 0);
  for (int r = 0; r < 8; ++r)
    for (int col = 0; col < 64; ++col) {
      const uint16_t want = 16 + r < 20 ? x[static_cast<size_t>((16 + r) * 64 + col)] : 0;
      ASSERT_EQ(Get16(got, static_cast<size_t>(SwizzledOffset(8, r, col))), want) << r << " " << col;
    }
}

// Between the issue and the first wait on its barrier, the destination reads as 0xFF (NaN) from
// every thread, even where it held data before; after the wait, the data.
TEST(EmuTma, ReadBeforeTheWaitSeesPoison) {
  const Qkv t(1, 8, 1, 64);
  const TensorMap map = t.Map(8);
  std::vector<uint16_t> before(64), after(64);
  Launch(Dim3{1}, Dim3{64}, 64 + 1024 + 1024, [&] {
    STRIA_DYNAMIC_SMEM(smem);
    uint64_t* bar = reinterpret_cast<uint64_t*>(smem);
    unsigned char* dst = AlignToSwizzleAtom(smem + 64);
    const int tid = static_cast<int>(threadIdx.x);
    std::memset(dst + 16 * tid, 0, 16);  // data there before the copy
    if (tid == 0) {
      mbar_init(bar, 1);
      fence_barrier_init();
    }
    block_sync();
    if (tid == 0) {
      mbar_arrive_expect_tx(bar, 1024);
      tma_load_4d(dst, &map, 0, 0, 0, 0, bar);
    }
    block_sync();  // a block barrier orders nothing for the async proxy: the copy is in flight
    std::memcpy(&before[tid], dst + 16 * tid, 2);  // the bug: reading before mbar_wait
    block_sync();                                  // (before any thread waits, and lands the copy)
    mbar_wait(bar, 0);
    std::memcpy(&after[tid], dst + 16 * tid, 2);
  });
  for (int i = 0; i < 64; ++i) {
    EXPECT_EQ(before[i], 0xFFFF) << i;
    EXPECT_TRUE(std::isnan(emu::BFloatToFloat(before[i])));
    const int r = i / 8, chunk = (i % 8) ^ (r % 8);  // byte 16 i holds chunk (i % 8) ^ r of row r
    EXPECT_EQ(after[i], t.At(0, r, 0, 8 * chunk)) << i;
  }
}

TEST(EmuTma, CopyNeverWaitedForIsReported) {
  const Qkv t(1, 8, 1, 64);
  const TensorMap map = t.Map(8);
  auto run = [&](bool copy) {
    return ErrorOf([&] {
      Launch(Dim3{2}, Dim3{32}, 64 + 2048, [&] {
        STRIA_DYNAMIC_SMEM(smem);
        uint64_t* bar = reinterpret_cast<uint64_t*>(smem + 8);
        if (threadIdx.x != 0) return;
        mbar_init(bar, 1);
        mbar_arrive_expect_tx(bar, 1024);
        if (copy) tma_load_4d(AlignToSwizzleAtom(smem + 64), &map, 0, 0, 0, 0, bar);
      });
    });
  };
  std::string e = run(true);
  EXPECT_NE(e.find("block (0,0,0): TMA copy never waited for: 1 tma_load_4d (1024 bytes) on the mbarrier at "
                   "shared-memory offset 8 with no mbar_wait on that barrier after them"),
            std::string::npos)
      << e;
  e = run(false);
  EXPECT_NE(e.find("block (0,0,0): the mbarrier at shared-memory offset 8 ended its phase 0 with 1024 transaction "
                   "bytes announced (mbar_arrive_expect_tx) and never retired by a TMA copy"),
            std::string::npos)
      << e;
}

TEST(EmuTma, Errors) {
  const Qkv t(1, 8, 1, 64);
  const TensorMap good = t.Map(8);
  TensorMap zeroed;
  std::memset(&zeroed, 0, sizeof zeroed);
  // `offset`: the destination, bytes past a 1024-byte aligned window address.
  auto run = [&](const TensorMap& map, int offset) {
    return ErrorOf([&] {
      Launch(Dim3{1}, Dim3{32}, 4096, [&] {
        STRIA_DYNAMIC_SMEM(smem);
        unsigned char* base = AlignToSwizzleAtom(smem);
        uint64_t* bar = reinterpret_cast<uint64_t*>(base + 1024 + 512);
        if (threadIdx.x != 0) return;
        mbar_init(bar, 1);
        mbar_arrive_expect_tx(bar, 1024);
        tma_load_4d(base + offset, &map, 0, 0, 0, 0, bar);
        mbar_wait(bar, 0);
      });
    });
  };
  EXPECT_EQ(run(good, 128), "(no error)");
  std::string e = run(zeroed, 0);
  EXPECT_NE(e.find("tma_load_4d: the tensor map was not made by EncodeRowsMap"), std::string::npos) << e;
  e = run(good, 64);
  EXPECT_NE(e.find("tma_load_4d: the destination, shared-window address"), std::string::npos) << e;
  EXPECT_NE(e.find("is not 128-byte aligned"), std::string::npos) << e;
  e = run(good, 1024);  // the box's 1024 bytes cover the barrier at +512
  EXPECT_NE(e.find("(1024 bytes) covers the mbarrier at offset"), std::string::npos) << e;
  e = run(good, 3072);  // past the 4096 bytes
  EXPECT_NE(e.find("-byte box at"), std::string::npos) << e;
  EXPECT_NE(e.find("is not inside the 4096-byte dynamic shared memory"), std::string::npos) << e;
}

TEST(EmuTma, EncodeRowsMapRefusesWhatTmaCannotAddress) {
  alignas(16) static uint16_t x[64 * 64];
  TensorMap m;
  // [B, L, H, D] = [2, 4, 2, 64] over x, compact: sb = 512, sl = 128, sh = 64 elements.
  EXPECT_TRUE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, 128, 64, 64));
  EXPECT_TRUE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 1024, 128, 64, 256));  // non-compact batch stride
  EXPECT_FALSE(EncodeRowsMap(&m, x + 1, 2, 4, 2, 64, 512, 128, 64, 64)) << "base 2 bytes off 16";
  EXPECT_FALSE(EncodeRowsMap(&m, x + 4, 2, 4, 2, 64, 512, 128, 64, 64)) << "base 8 bytes off 16";
  EXPECT_TRUE(EncodeRowsMap(&m, x + 8, 2, 4, 2, 64, 512, 128, 64, 64)) << "base 16 bytes on";
  EXPECT_FALSE(EncodeRowsMap(&m, nullptr, 2, 4, 2, 64, 512, 128, 64, 64));
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, 128, 68, 64)) << "head stride 136 bytes";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, 132, 64, 64)) << "row stride 264 bytes";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 516, 128, 64, 64)) << "batch stride 1032 bytes";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, int64_t{1} << 39, 128, 64, 64)) << "stride 2^40 bytes";
  EXPECT_TRUE(EncodeRowsMap(&m, x, 2, 4, 2, 64, (int64_t{1} << 39) - 8, 128, 64, 64)) << "just below 2^40";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, -128, 64, 64)) << "negative stride";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, 0, 64, 64)) << "zero stride, extent 4";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 96, 512, 128, 64, 64)) << "D = 96";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 0, 512, 128, 64, 64)) << "D = 0";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 0, 4, 2, 64, 512, 128, 64, 64)) << "B = 0";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 0, 2, 64, 512, 128, 64, 64)) << "L = 0";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, -1, 64, 512, 128, 64, 64)) << "H = -1";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, 128, 64, 0)) << "box_rows = 0";
  EXPECT_FALSE(EncodeRowsMap(&m, x, 2, 4, 2, 64, 512, 128, 64, 257)) << "box_rows = 257";
  // Extent 1: the stride is not looked at (the compact one is used).
  EXPECT_TRUE(EncodeRowsMap(&m, x, 1, 4, 2, 64, 0, 128, 64, 64)) << "B = 1, sb = 0";
  EXPECT_TRUE(EncodeRowsMap(&m, x, 2, 4, 1, 64, 256, 64, -3, 64)) << "H = 1, sh = -3";
  EXPECT_TRUE(EncodeRowsMap(&m, x, 2, 1, 2, 64, 128, 7, 64, 64)) << "L = 1, sl = 7";
}

// ---------------------------------------------------------------- producer and consumers

// A two-stage ring, as a warp-specialised kernel runs it: warp 0's lane 0 loads tile n (16 rows
// from row 16 n - 8 of head n % H, batch blockIdx.x) into stage n % 2, signalled by full[stage]
// (one arrival with the tile's bytes); the 64 threads of warps 1 and 2 wait for it, check it
// against the host tensor between them, and release the stage on empty[stage] (64 arrivals).
// The producer loads through a copy of the map that it overwrites right after each issue (and
// returns after its last load, before the consumers land it): a copy must not depend on its map
// after the issue, as the GPU's does not.
constexpr int kRingRows = 16, kRingStages = 2, kRingTiles = 7, kRingConsumers = 64;
constexpr int kRingBytes = kRingRows * 128;
struct RingParams {
  const TensorMap* map;  // not by value: GCC notes an ABI change for 64-byte aligned parameters
  const Qkv* t;
  float* mismatches;
  float* checked;
};

void RingKernel(RingParams check) {
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* stages = AlignToSwizzleAtom(smem_raw);
  uint64_t* full = reinterpret_cast<uint64_t*>(stages + kRingStages * kRingBytes);
  uint64_t* empty = full + kRingStages;
  const int tid = static_cast<int>(threadIdx.x), b = static_cast<int>(blockIdx.x), H = check.t->H;
  if (tid == 0) {
    for (int st = 0; st < kRingStages; ++st) {
      mbar_init(&full[st], 1);
      mbar_init(&empty[st], kRingConsumers);
    }
    fence_barrier_init();
  }
  block_sync();
  if (warp_id() == 0) {
    if (lane_id() != 0) return;
    prefetch_tensor_map(check.map);
    for (int n = 0; n < kRingTiles; ++n) {
      const int st = n % kRingStages, parity = (n / kRingStages) & 1;
      mbar_wait(&empty[st], parity ^ 1);  // the first use of a stage does not wait
      mbar_arrive_expect_tx(&full[st], kRingBytes);
      TensorMap map = *check.map;
      tma_load_4d(stages + st * kRingBytes, &map, 0, n % H, kRingRows * n - 8, b, &full[st]);
      std::memset(&map, 0, sizeof map);
    }
    return;
  }
  const int c = tid - 32;
  for (int n = 0; n < kRingTiles; ++n) {
    const int st = n % kRingStages, parity = (n / kRingStages) & 1;
    mbar_wait(&full[st], parity);
    const unsigned char* tile = stages + st * kRingBytes;
    for (int i = c; i < kRingRows * 64; i += kRingConsumers) {
      const int r = i / 64, col = i % 64;
      uint16_t v;
      std::memcpy(&v, tile + SwizzledOffset(kRingRows, r, col), 2);
      atomic_add(check.mismatches, v != check.t->At(b, kRingRows * n - 8 + r, n % H, col) ? 1.f : 0.f);
      atomic_add(check.checked, 1.f);
    }
    mbar_arrive(&empty[st]);
  }
}

TEST(EmuTma, ProducerConsumerRingUnderEverySchedule) {
  const Qkv t(2, kRingRows * kRingTiles - 12, 3, 64);  // the last tile runs 4 rows past L
  const TensorMap map = t.Map(kRingRows);
  for (const NamedSchedule& s : kSchedules) {
    ScopedSchedule scope(s.schedule, s.seed);
    float mismatches = 0, checked = 0;
    Launch(Dim3{2}, Dim3{96}, kRingStages * kRingBytes + 1024 + 64, &RingKernel,
           RingParams{&map, &t, &mismatches, &checked});
    EXPECT_EQ(mismatches, 0.f) << s.name;
    EXPECT_EQ(checked, 2.f * kRingTiles * kRingRows * 64) << s.name;
  }
}

// The TMA backward's producer warp: lane 0 announces a tile's bytes without arriving
// (mbar_expect_tx) and issues the copy, then every lane of the warp stores a value of its own
// beside the tile and arrives (32 arrivals a phase). The consumers see the tile and all 32 values
// under every schedule. Announcing after the warp's arrivals instead lets the phase complete on
// the arrivals alone: under some schedule the consumers then read the stage before the copy is
// even issued.
struct SideBySide {
  float mismatches = 0, checked = 0;
  std::string error;
};
SideBySide RunSideBySide(const Qkv& t, const TensorMap& map, bool announce_late) {
  SideBySide r;
  r.error = ErrorOf([&] {
    Launch(Dim3{1}, Dim3{64}, kRingStages * kRingBytes + 1024 + 256, [&] {
      STRIA_DYNAMIC_SMEM(smem_raw);
      unsigned char* stages = AlignToSwizzleAtom(smem_raw);
      float* side = reinterpret_cast<float*>(stages + kRingStages * kRingBytes);  // [stage][32]
      uint64_t* full = reinterpret_cast<uint64_t*>(side + kRingStages * 32);
      uint64_t* empty = full + kRingStages;
      const int tid = static_cast<int>(threadIdx.x), lane = lane_id();
      if (tid == 0) {
        for (int st = 0; st < kRingStages; ++st) {
          mbar_init(&full[st], 32);
          mbar_init(&empty[st], 32);
        }
        fence_barrier_init();
      }
      block_sync();
      for (int n = 0; n < kRingTiles; ++n) {
        const int st = n % kRingStages, parity = (n / kRingStages) & 1;
        if (warp_id() == 0) {
          mbar_wait(&empty[st], parity ^ 1);
          auto copy = [&] {
            mbar_expect_tx(&full[st], kRingBytes);
            tma_load_4d(stages + st * kRingBytes, &map, 0, 0, kRingRows * n, 0, &full[st]);
          };
          side[32 * st + lane] = static_cast<float>(100 * n + lane);
          if (!announce_late) {
            if (lane == 0) copy();
            mbar_arrive(&full[st]);
          } else {
            // The warp's lanes arrive together, as one instruction of a converged warp does on
            // the GPU (here: lane 0 after the others), and lane 0 announces after.
            if (lane != 0) mbar_arrive(&full[st]);
            warp_sync();
            if (lane == 0) {
              mbar_arrive(&full[st]);
              copy();
            }
          }
          continue;
        }
        mbar_wait(&full[st], parity);
        const unsigned char* tile = stages + st * kRingBytes;
        for (int i = lane; i < kRingRows * 64; i += 32) {
          uint16_t v;
          std::memcpy(&v, tile + SwizzledOffset(kRingRows, i / 64, i % 64), 2);
          r.mismatches += v != t.At(0, kRingRows * n + i / 64, 0, i % 64) ? 1.f : 0.f;
        }
        r.mismatches += side[32 * st + lane] != static_cast<float>(100 * n + lane) ? 1.f : 0.f;
        r.checked += 1.f;
        mbar_arrive(&empty[st]);
      }
    });
  });
  return r;
}

TEST(EmuTma, BytesAnnouncedBeforeTheWarpsArrivals) {
  const Qkv t(1, kRingRows * kRingTiles, 1, 64);
  const TensorMap map = t.Map(kRingRows);
  bool late_caught = false;
  for (const NamedSchedule& s : kSchedules) {
    ScopedSchedule scope(s.schedule, s.seed);
    const SideBySide ok = RunSideBySide(t, map, false);
    EXPECT_EQ(ok.error, "(no error)") << s.name;
    EXPECT_EQ(ok.mismatches, 0.f) << s.name;
    EXPECT_EQ(ok.checked, 32.f * kRingTiles) << s.name;
    const SideBySide late = RunSideBySide(t, map, true);
    late_caught = late_caught || late.error != "(no error)" || late.mismatches > 0;
  }
  EXPECT_TRUE(late_caught) << "bytes announced after the arrivals passed under every schedule";
}

// A consumer that releases a stage and then reads it again (its mbar_arrive on empty too early)
// reads the next tile under the schedule that gives the producer priority: the thread whose
// arrival completes the phase lets the producer run at once, which loads the next tile over the
// stage (and another consumer, ahead of it in the order, lands it).
TEST(EmuTma, ReadAfterReleaseShowsUnderPriorityToTheProducer) {
  const Qkv t(1, 64, 1, 64);
  const TensorMap map = t.Map(kRingRows);
  ScopedSchedule scope(Schedule::kWarpsAscending);
  std::vector<uint16_t> late(32, 0);
  Launch(Dim3{1}, Dim3{64}, 2 * kRingBytes + 1024 + 64, [&] {
    STRIA_DYNAMIC_SMEM(smem_raw);
    unsigned char* stage = AlignToSwizzleAtom(smem_raw);
    uint64_t* full = reinterpret_cast<uint64_t*>(stage + kRingBytes);
    uint64_t* empty = full + 1;
    const int tid = static_cast<int>(threadIdx.x);
    if (tid == 0) {
      mbar_init(full, 1);
      mbar_init(empty, 32);
      fence_barrier_init();
    }
    block_sync();
    if (warp_id() == 0) {
      if (lane_id() != 0) return;
      for (int n = 0; n < 2; ++n) {
        mbar_wait(empty, (n & 1) ^ 1);
        mbar_arrive_expect_tx(full, kRingBytes);
        tma_load_4d(stage, &map, 0, 0, kRingRows * n, 0, full);
      }
      return;
    }
    for (int n = 0; n < 2; ++n) {
      mbar_wait(full, n & 1);
      mbar_arrive(empty);
      if (n == 0) std::memcpy(&late[static_cast<size_t>(lane_id())], stage + 64 * lane_id(), 2);  // the bug
    }
  });
  // Byte 64 l: row l / 2, stored chunk 4 (l % 2), which holds chunk 4 (l % 2) ^ (row % 8).
  auto tile0 = [&](int l) { return t.At(0, l / 2, 0, 8 * ((4 * (l % 2)) ^ (l / 2 % 8))); };
  for (int l = 0; l < 31; ++l) EXPECT_EQ(late[static_cast<size_t>(l)], tile0(l)) << l;  // before the phase completed
  EXPECT_NE(late[31], tile0(31));                                                    // lane 31's arrival completed it
  EXPECT_EQ(late[31], t.At(0, kRingRows + 15, 0, 8 * ((4 * (31 % 2)) ^ (15 % 8))));  // tile 1
}

// wgmma reads TMA-loaded tiles through the async proxy, which TMA writes through: no
// fence_proxy_async is needed, and the product is right. A = rows 0..63 of head 0, B = rows
// 64..127 of head 1, K = 64 in four k16 steps (descriptors 32 bytes apart in the swizzled rows).
TEST(EmuTma, WgmmaReadsTmaLoadedOperands) {
  constexpr int L = 128, H = 2, D = 64;
  std::vector<uint16_t> x(static_cast<size_t>(L) * H * D);
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (uint16_t& v : x) v = emu::FloatToBFloat(u(rng));
  TensorMap map;
  ASSERT_TRUE(EncodeRowsMap(&map, x.data(), 1, L, H, D, 0, H * D, D, 64));
  auto run = [&](bool store_after_load, std::vector<float>* out) {
    return ErrorOf([&] {
      Launch(Dim3{1}, Dim3{128}, 2 * 8192 + 1024 + 64, [&] {
        STRIA_DYNAMIC_SMEM(smem);
        unsigned char* a_tile = AlignToSwizzleAtom(smem);
        unsigned char* b_tile = a_tile + 8192;
        uint64_t* bar = reinterpret_cast<uint64_t*>(b_tile + 8192);
        const int tid = static_cast<int>(threadIdx.x);
        if (tid == 0) {
          mbar_init(bar, 1);
          fence_barrier_init();
        }
        block_sync();
        if (tid == 0) {
          mbar_arrive_expect_tx(bar, 2 * 8192);
          tma_load_4d(a_tile, &map, 0, 0, 0, 0, bar);
          tma_load_4d(b_tile, &map, 0, 1, 64, 0, bar);
        }
        mbar_wait(bar, 0);
        if (store_after_load) {
          if (tid == 9) std::memset(b_tile + 256, 0, 2);  // a generic-proxy store, not fenced
          block_sync();
        }
        float d[32];
        wgmma_fence();
        for (int kk = 0; kk < D / 16; ++kk) {
          wgmma_ss<BFloat, 64>(d, SwizzledDesc(smem_addr(a_tile) + 32 * kk, 16, 1024),
                               SwizzledDesc(smem_addr(b_tile) + 32 * kk, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        const int w = warp_id(), l = lane_id(), g = l >> 2, t4 = l & 3;
        for (int i = 0; i < 32; ++i) {
          const int row = 16 * w + g + 8 * ((i & 3) >> 1), col = 8 * (i >> 2) + 2 * t4 + (i & 1);
          (*out)[static_cast<size_t>(row * 64 + col)] = d[i];
        }
      });
    });
  };
  std::vector<float> got(64 * 64, NAN);
  ASSERT_EQ(run(false, &got), "(no error)");
  double worst = 0;
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 64; ++n) {
      double want = 0;
      for (int k = 0; k < D; ++k) {
        want += static_cast<double>(emu::BFloatToFloat(x[static_cast<size_t>((m * H + 0) * D + k)])) *
                emu::BFloatToFloat(x[static_cast<size_t>(((64 + n) * H + 1) * D + k)]);
      }
      const double e = std::fabs(got[static_cast<size_t>(m * 64 + n)] - want);
      worst = std::isnan(e) ? INFINITY : std::max(worst, e);
    }
  EXPECT_LT(worst, 1e-3);
  // The async proxy's view holds what TMA wrote: a plain store over it afterwards still shows.
  const std::string e = run(true, &got);
  EXPECT_NE(e.find("not fenced for the async proxy"), std::string::npos) << e;
}

// ---------------------------------------------------------------- named barriers

// Warpgroups that publish plain stores to each other for wgmma through a named barrier (the TMA
// backward's dS^T, with the producer warpgroup elsewhere): each writer fences the async proxy
// first; without the fence the read is reported, as at block_sync.
TEST(EmuNamedBarrier, PublishesFencedStoresToWgmma) {
  auto run = [&](bool fence, std::vector<float>* out) {
    return ErrorOf([&] {
      Launch(Dim3{1}, Dim3{384}, 2 * 8192 + 1024, [&] {
        STRIA_DYNAMIC_SMEM(smem);
        unsigned char* a_tile = AlignToSwizzleAtom(smem);
        unsigned char* b_tile = a_tile + 8192;
        const int tid = static_cast<int>(threadIdx.x);
        if (tid < 128) return;    // the "producer" warpgroup takes no part
        const int c = tid - 128;  // 256 consumer threads write A = 1 and B = the identity
        for (int x = c; x < 64 * 64; x += 256) {
          const int r = x / 64, k = x % 64;
          const uint16_t one = emu::FloatToBFloat(1.f), zero = 0;
          std::memcpy(a_tile + SwizzledOffset(64, r, k), &one, 2);
          std::memcpy(b_tile + SwizzledOffset(64, r, k), r == k ? &one : &zero, 2);
        }
        if (fence) fence_proxy_async();
        named_barrier_sync(1, 256);
        if (tid >= 256) return;  // one warpgroup multiplies
        float d[32];
        wgmma_fence();
        for (int kk = 0; kk < 4; ++kk) {
          wgmma_ss<BFloat, 64>(d, SwizzledDesc(smem_addr(a_tile) + 32 * kk, 16, 1024),
                               SwizzledDesc(smem_addr(b_tile) + 32 * kk, 16, 1024), kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        for (int i = 0; i < 32; ++i) (*out)[static_cast<size_t>(c * 32 + i)] = d[i];
      });
    });
  };
  std::vector<float> got(128 * 32, NAN);
  ASSERT_EQ(run(true, &got), "(no error)");
  for (float v : got) ASSERT_EQ(v, 1.f);  // (all ones) x identity
  const std::string e = run(false, &got);
  EXPECT_NE(e.find("not fenced for the async proxy"), std::string::npos) << e;
}

// Two groups of two warps take turns, as two consumer warpgroups do: group A waits on barrier 1
// (its turn), works, and hands the turn to B on barrier 2, and back; the 128-thread count is
// met by one group's sync and the other's arrive. The turns alternate under every schedule.
TEST(EmuNamedBarrier, PingPongInAFixedOrder) {
  constexpr int kRounds = 4;
  for (const NamedSchedule& s : kSchedules) {
    ScopedSchedule scope(s.schedule, s.seed);
    std::vector<int> log;  // 10 * round + group, by lane 0 of each warp
    Launch(Dim3{1}, Dim3{128}, 0, [&] {
      const int group = warp_id() / 2;
      if (group == 1) named_barrier_arrive(1, 128);  // A goes first
      for (int r = 0; r < kRounds; ++r) {
        named_barrier_sync(1 + group, 128);
        if (lane_id() == 0) log.push_back(10 * r + group);
        if (group == 0 || r + 1 < kRounds) named_barrier_arrive(2 - group, 128);
      }
    });
    std::vector<int> want;
    for (int r = 0; r < kRounds; ++r)
      for (int g : {0, 0, 1, 1}) want.push_back(10 * r + g);
    EXPECT_EQ(log, want) << s.name;
  }
}

TEST(EmuNamedBarrier, Errors) {
  auto run = [](const std::function<void()>& body) { return ErrorOf([&] { Launch(Dim3{1}, Dim3{128}, 0, body); }); };
  std::string e = run([] { named_barrier_sync(3, warp_id() < 2 ? 128 : 64); });
  EXPECT_NE(e.find("thread (64,0,0) (warp 2, lane 0): named_barrier_sync: thread count 64 for named barrier 3, where "
                   "64 threads already arrived with a count of 128"),
            std::string::npos)
      << e;
  for (int id : {0, 16}) {
    e = run([id] { named_barrier_sync(id, 128); });
    EXPECT_NE(e.find("named_barrier_sync: barrier id " + std::to_string(id) + " is outside 1..15 (0 is block_sync's)"),
              std::string::npos)
        << e;
  }
  for (int threads : {48, 0, 256}) {
    e = run([threads] { named_barrier_arrive(1, threads); });
    EXPECT_NE(e.find("named_barrier_arrive: thread count " + std::to_string(threads) +
                     " is not a positive multiple of 32 up to the 128 threads of the block"),
              std::string::npos)
        << e;
  }
  e = run([] {
    if (warp_id() == 0) named_barrier_sync(5, 64);  // the other warp never comes
  });
  EXPECT_NE(e.find("deadlock: a named barrier never completes"), std::string::npos) << e;
  EXPECT_NE(e.find("threads 0-31 wait at named barrier 5 (32 of 64 threads arrived); threads 32-127 returned"),
            std::string::npos)
      << e;
}

}  // namespace
}  // namespace cuda
}  // namespace stria
