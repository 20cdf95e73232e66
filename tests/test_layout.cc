// Token layouts: stria_layout_positions against the normative formulas of DESIGN.md (written out
// again here, independently of src/layout), their structural properties, and stria_shard /
// stria_unshard for every layout, rank count 1..8, seq_dim 0, 1 and -1, four dtypes, and strided
// (non-compact) tensors on both sides. Every element encodes its global position, so a copy from
// or to the wrong token shows up as a wrong value; bytes outside the tensors' elements carry a
// sentinel that no copy may touch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.h"

using stria_test::FloatToBf16;

namespace {

const stria_layout_t kLayouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG};

const char* LayoutName(stria_layout_t l) {
  return l == STRIA_LAYOUT_CONTIGUOUS ? "contiguous" : l == STRIA_LAYOUT_STRIPED ? "striped" : "zigzag";
}

// The normative table of DESIGN.md.
int64_t ExpectedPosition(stria_layout_t layout, int64_t S, int64_t N, int64_t r, int64_t i) {
  const int64_t L = S / N;
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:
      return r * L + i;
    case STRIA_LAYOUT_STRIPED:
      return i * N + r;
    case STRIA_LAYOUT_ZIGZAG: {
      const int64_t C = L / 2;
      return i < C ? r * C + i : (2 * N - 1 - r) * C + (i - C);
    }
  }
  return -1;
}

// What S must be a multiple of.
int64_t Unit(stria_layout_t layout, int64_t N) {
  return layout == STRIA_LAYOUT_ZIGZAG ? 2 * N : N;
}

std::vector<int64_t> Positions(stria_layout_t layout, int64_t S, int N, int r) {
  std::vector<int64_t> p(static_cast<size_t>(S / N) + 1, -7);  // one spare entry: must stay untouched
  EXPECT_EQ(stria_layout_positions(layout, S, N, r, p.data()), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_EQ(p.back(), -7) << "wrote past seq_len / world_size entries";
  p.pop_back();
  return p;
}

TEST(Positions, MatchTheNormativeFormulas) {
  for (stria_layout_t layout : kLayouts)
    for (int N = 1; N <= 8; ++N)
      for (int64_t mult : {1, 2, 3, 5, 16}) {
        const int64_t S = Unit(layout, N) * mult;
        for (int r = 0; r < N; ++r) {
          SCOPED_TRACE(::testing::Message() << LayoutName(layout) << " S " << S << " N " << N << " rank " << r);
          const std::vector<int64_t> p = Positions(layout, S, N, r);
          for (int64_t i = 0; i < S / N; ++i)
            ASSERT_EQ(p[static_cast<size_t>(i)], ExpectedPosition(layout, S, N, r, i)) << "token " << i;
        }
      }
}

TEST(Positions, AllRanksTogetherArePermutations) {
  for (stria_layout_t layout : kLayouts)
    for (int N = 1; N <= 8; ++N)
      for (int64_t mult : {1, 2, 7}) {
        const int64_t S = Unit(layout, N) * mult;
        SCOPED_TRACE(::testing::Message() << LayoutName(layout) << " S " << S << " N " << N);
        std::vector<int> seen(static_cast<size_t>(S), 0);
        for (int r = 0; r < N; ++r)
          for (int64_t p : Positions(layout, S, N, r)) {
            ASSERT_GE(p, 0);
            ASSERT_LT(p, S);
            ++seen[static_cast<size_t>(p)];
          }
        for (int64_t p = 0; p < S; ++p) ASSERT_EQ(seen[static_cast<size_t>(p)], 1) << "position " << p;
      }
}

TEST(Positions, StructureOfEachLayout) {
  for (int N = 1; N <= 8; ++N)
    for (int64_t mult : {1, 2, 3}) {
      for (int r = 0; r < N; ++r) {
        SCOPED_TRACE(::testing::Message() << "N " << N << " rank " << r << " mult " << mult);
        // Contiguous: rank r holds the r-th block of S/N consecutive tokens, in order.
        {
          const int64_t S = N * 2 * mult, L = S / N;
          const auto p = Positions(STRIA_LAYOUT_CONTIGUOUS, S, N, r);
          for (int64_t i = 0; i < L; ++i) EXPECT_EQ(p[static_cast<size_t>(i)], r * L + i);
        }
        // Striped: r, r + N, r + 2N, ...
        {
          const int64_t S = N * 3 * mult;
          const auto p = Positions(STRIA_LAYOUT_STRIPED, S, N, r);
          EXPECT_EQ(p[0], r);
          for (size_t i = 1; i < p.size(); ++i) EXPECT_EQ(p[i] - p[i - 1], N);
        }
        // Zigzag: the sequence cut into 2N chunks; rank r holds chunks r and 2N-1-r, in order.
        {
          const int64_t S = 2 * N * 2 * mult, C = S / (2 * N);
          const auto p = Positions(STRIA_LAYOUT_ZIGZAG, S, N, r);
          ASSERT_EQ(static_cast<int64_t>(p.size()), 2 * C);
          for (int64_t i = 0; i < 2 * C; ++i) {
            const int64_t chunk = p[static_cast<size_t>(i)] / C, within = p[static_cast<size_t>(i)] % C;
            EXPECT_EQ(chunk, i < C ? r : 2 * N - 1 - r) << "token " << i;
            EXPECT_EQ(within, i % C) << "token " << i;
          }
        }
      }
    }
}

// ---- shard / unshard ----------------------------------------------------------------------

struct DtypeCase {
  const char* name;
  DLDataType dl;
  int bytes;
};

const DtypeCase kDtypes[] = {
    {"float32", {kDLFloat, 32, 1}, 4},
    {"bfloat16", {kDLBfloat, 16, 1}, 2},
    {"int64", {kDLInt, 64, 1}, 8},
    {"uint8", {kDLUInt, 8, 1}, 1},
};

// The bytes of `value` in a dtype. Values stay below 256, so every dtype holds them exactly
// (bfloat16 has 8 significant bits).
void Encode(const DtypeCase& d, int64_t value, uint8_t* out) {
  switch (d.dl.code) {
    case kDLFloat: {
      const float f = static_cast<float>(value);
      std::memcpy(out, &f, 4);
      return;
    }
    case kDLBfloat: {
      const uint16_t h = FloatToBf16(static_cast<float>(value));
      std::memcpy(out, &h, 2);
      return;
    }
    case kDLInt:
      std::memcpy(out, &value, 8);
      return;
    default:
      *out = static_cast<uint8_t>(value);
      return;
  }
}

constexpr uint8_t kSentinel = 0xA5;

// How a tensor's elements sit in memory.
enum class Mem {
  kCompact,      // strides == NULL
  kPadded,       // row-major with each dimension's extent padded by 1
  kLastStride2,  // padded, and every other element of the last dimension
  kReversed,     // the first dimension varies fastest (column-major), padded
};
const char* MemName(Mem m) {
  return m == Mem::kCompact       ? "compact"
         : m == Mem::kPadded      ? "padded"
         : m == Mem::kLastStride2 ? "stride2"
                                  : "reversed";
}

// A host tensor of any dtype over a sentinel-filled byte buffer.
struct Host {
  DtypeCase dt;
  std::vector<int64_t> shape, strides;
  std::vector<uint8_t> bytes;
  DLTensor dl{};

  Host(const DtypeCase& d, std::vector<int64_t> s, Mem mem) : dt(d), shape(std::move(s)) {
    const int n = static_cast<int>(shape.size());
    strides.assign(shape.size(), 0);
    int64_t extent = 1;
    if (mem == Mem::kReversed) {
      for (int i = 0; i < n; ++i) {
        strides[static_cast<size_t>(i)] = extent;
        extent *= shape[static_cast<size_t>(i)] + 1;
      }
    } else {
      extent = mem == Mem::kLastStride2 ? 2 : 1;
      const int64_t pad = mem == Mem::kCompact ? 0 : 1;
      for (int i = n - 1; i >= 0; --i) {
        strides[static_cast<size_t>(i)] = extent;
        extent *= shape[static_cast<size_t>(i)] + pad;
      }
    }
    // 8 spare bytes at the end, so an overrun shows up as a changed sentinel.
    bytes.assign(static_cast<size_t>(extent * d.bytes + 8), kSentinel);
    dl.data = bytes.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = n;
    dl.dtype = d.dl;
    dl.shape = shape.data();
    dl.strides = mem == Mem::kCompact ? nullptr : strides.data();
  }
  Host(const Host&) = delete;
  Host& operator=(const Host&) = delete;

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  // Element `flat` (row-major logical index) and its multi-index.
  uint8_t* At(int64_t flat, std::vector<int64_t>* index = nullptr) {
    int64_t off = 0;
    if (index) index->assign(shape.size(), 0);
    for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
      const int64_t k = flat % shape[static_cast<size_t>(i)];
      flat /= shape[static_cast<size_t>(i)];
      off += k * strides[static_cast<size_t>(i)];
      if (index) (*index)[static_cast<size_t>(i)] = k;
    }
    return bytes.data() + off * dt.bytes;
  }
  // Bytes not covered by any element still hold the sentinel.
  int64_t TouchedPadding() {
    std::vector<bool> is_elem(bytes.size(), false);
    for (int64_t f = 0; f < numel(); ++f) {
      const size_t o = static_cast<size_t>(At(f) - bytes.data());
      for (int b = 0; b < dt.bytes; ++b) is_elem[o + static_cast<size_t>(b)] = true;
    }
    int64_t n = 0;
    for (size_t i = 0; i < bytes.size(); ++i) n += !is_elem[i] && bytes[i] != kSentinel;
    return n;
  }
};

// The value of an element: its position along the sequence, and (to catch copies that mix up the
// other dimensions) its row-major index over the other dimensions.
int64_t ValueOf(const std::vector<int64_t>& index, const std::vector<int64_t>& shape, int dim, int64_t seq_pos) {
  int64_t other = 0, m = 1;
  for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
    if (i == dim) continue;
    other += index[static_cast<size_t>(i)] * m;
    m *= shape[static_cast<size_t>(i)];
  }
  return seq_pos * m + other;
}

struct ShardCase {
  stria_layout_t layout;
  DtypeCase dt;
  int seq_dim;  // as passed: 0, 1 or -1
};

void PrintTo(const ShardCase& c, std::ostream* os) {
  *os << LayoutName(c.layout) << "/" << c.dt.name << "/seq_dim " << c.seq_dim;
}

class ShardRoundTrip : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ShardRoundTrip, EveryRankCountAndMemoryLayout) {
  const ShardCase& c = GetParam();
  const int dim = c.seq_dim < 0 ? c.seq_dim + 3 : c.seq_dim;
  const std::pair<Mem, Mem> mems[] = {{Mem::kCompact, Mem::kCompact},
                                      {Mem::kPadded, Mem::kLastStride2},
                                      {Mem::kReversed, Mem::kPadded},
                                      {Mem::kLastStride2, Mem::kReversed}};
  for (int N = 1; N <= 8; ++N)
    for (auto mem : mems) {
      // 4 tokens per rank (zigzag: chunks of 2); the other two dimensions are 2 x 3.
      const int64_t L = 4, S = L * N;
      SCOPED_TRACE(::testing::Message() << "N " << N << " full " << MemName(mem.first) << " local "
                                        << MemName(mem.second));
      std::vector<int64_t> full_shape = {2, 3}, local_shape = {2, 3};
      full_shape.insert(full_shape.begin() + dim, S);
      local_shape.insert(local_shape.begin() + dim, L);
      Host full(c.dt, full_shape, mem.first);
      std::vector<int64_t> idx;
      for (int64_t f = 0; f < full.numel(); ++f) {
        uint8_t* p = full.At(f, &idx);
        Encode(c.dt, ValueOf(idx, full_shape, dim, idx[static_cast<size_t>(dim)]), p);
      }
      Host rebuilt(c.dt, full_shape, mem.first);
      std::vector<bool> owned(static_cast<size_t>(S), false);  // positions unsharded so far
      for (int r = 0; r < N; ++r) {
        SCOPED_TRACE(::testing::Message() << "rank " << r);
        Host local(c.dt, local_shape, mem.second);
        ASSERT_EQ(stria_shard(c.layout, N, r, c.seq_dim, &full.dl, &local.dl, nullptr), STRIA_SUCCESS)
            << stria_get_last_error();
        // Shard picked exactly the tokens at this rank's positions.
        for (int64_t f = 0; f < local.numel(); ++f) {
          uint8_t* p = local.At(f, &idx);
          const int64_t pos = ExpectedPosition(c.layout, S, N, r, idx[static_cast<size_t>(dim)]);
          uint8_t want[8];
          Encode(c.dt, ValueOf(idx, local_shape, dim, pos), want);
          ASSERT_EQ(std::memcmp(p, want, static_cast<size_t>(c.dt.bytes)), 0)
              << "local element " << f << " (token " << idx[static_cast<size_t>(dim)] << ", position " << pos << ")";
        }
        EXPECT_EQ(local.TouchedPadding(), 0) << "shard wrote outside the local tensor's elements";
        // Unshard writes this rank's positions of the full tensor, and nothing else.
        ASSERT_EQ(stria_unshard(c.layout, N, r, c.seq_dim, &local.dl, &rebuilt.dl, nullptr), STRIA_SUCCESS)
            << stria_get_last_error();
        for (int64_t i = 0; i < L; ++i) owned[static_cast<size_t>(ExpectedPosition(c.layout, S, N, r, i))] = true;
        for (int64_t f = 0; f < rebuilt.numel(); ++f) {
          uint8_t* p = rebuilt.At(f, &idx);
          const bool is_owned = owned[static_cast<size_t>(idx[static_cast<size_t>(dim)])];
          const bool untouched = std::all_of(p, p + c.dt.bytes, [](uint8_t b) { return b == kSentinel; });
          if (!is_owned) {
            ASSERT_TRUE(untouched) << "unshard wrote position " << idx[static_cast<size_t>(dim)]
                                   << ", which no rank so far owns";
          }
        }
        EXPECT_EQ(rebuilt.TouchedPadding(), 0) << "unshard wrote outside the full tensor's elements";
      }
      // All ranks together rebuild the full tensor exactly.
      for (int64_t f = 0; f < full.numel(); ++f)
        ASSERT_EQ(std::memcmp(full.At(f), rebuilt.At(f), static_cast<size_t>(c.dt.bytes)), 0) << "element " << f;
    }
}

std::vector<ShardCase> ShardCases() {
  std::vector<ShardCase> v;
  for (stria_layout_t l : kLayouts)
    for (const DtypeCase& d : kDtypes)
      for (int sd : {0, 1, -1}) v.push_back(ShardCase{l, d, sd});
  return v;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardRoundTrip, ::testing::ValuesIn(ShardCases()),
                         [](const ::testing::TestParamInfo<ShardCase>& i) {
                           const int sd = i.param.seq_dim;
                           return std::string(LayoutName(i.param.layout)) + "_" + i.param.dt.name + "_seqdim" +
                                  (sd < 0 ? "m" + std::to_string(-sd) : std::to_string(sd));
                         });

// One-dimensional tensors (token ids, labels) and seq_dim counted from the end of a 4-D tensor.
TEST(Shard, OneDimensionalAndFourDimensional) {
  const DtypeCase& i64 = kDtypes[2];
  for (stria_layout_t layout : kLayouts)
    for (int N : {1, 3, 8}) {
      SCOPED_TRACE(::testing::Message() << LayoutName(layout) << " N " << N);
      const int64_t S = 2 * N * 3, L = S / N;
      Host ids(i64, {S}, Mem::kCompact);
      for (int64_t p = 0; p < S; ++p) std::memcpy(ids.At(p), &p, 8);
      for (int r = 0; r < N; ++r) {
        Host local(i64, {L}, Mem::kPadded);
        ASSERT_EQ(stria_shard(layout, N, r, -1, &ids.dl, &local.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
        // The sharded token ids are exactly stria_layout_positions.
        const std::vector<int64_t> pos = Positions(layout, S, N, r);
        for (int64_t i = 0; i < L; ++i) {
          int64_t got;
          std::memcpy(&got, local.At(i), 8);
          EXPECT_EQ(got, pos[static_cast<size_t>(i)]);
        }
      }
      // [B, S, H, D] with seq_dim -3 == 1.
      Host full(kDtypes[0], {2, S, 2, 3}, Mem::kPadded), back(kDtypes[0], {2, S, 2, 3}, Mem::kCompact);
      std::vector<int64_t> idx;
      for (int64_t f = 0; f < full.numel(); ++f) {
        uint8_t* p = full.At(f, &idx);
        Encode(kDtypes[0], f, p);
      }
      for (int r = 0; r < N; ++r) {
        Host local(kDtypes[0], {2, L, 2, 3}, Mem::kReversed);
        ASSERT_EQ(stria_shard(layout, N, r, -3, &full.dl, &local.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
        ASSERT_EQ(stria_unshard(layout, N, r, -3, &local.dl, &back.dl, nullptr), STRIA_SUCCESS)
            << stria_get_last_error();
      }
      for (int64_t f = 0; f < full.numel(); ++f) ASSERT_EQ(std::memcmp(full.At(f), back.At(f), 4), 0) << f;
    }
}

// ---- bad arguments to shard / unshard ------------------------------------------------------

// Calls shard and unshard with the given tensors; both must fail with `want` and a message, and
// neither may write anything (each destination is checked against a copy taken before).
void ExpectBoth(stria_status_t want, stria_layout_t layout, int N, int r, int seq_dim, Host* full, Host* local,
                const DLTensor* full_dl, const DLTensor* local_dl, void* stream, const char* what) {
  SCOPED_TRACE(what);
  const std::vector<uint8_t> full_before = full->bytes, local_before = local->bytes;
  EXPECT_EQ(stria_shard(layout, N, r, seq_dim, full_dl, const_cast<DLTensor*>(local_dl), stream), want);
  EXPECT_STRNE(stria_get_last_error(), "");
  EXPECT_TRUE(local->bytes == local_before) << "a rejected shard wrote to local";
  EXPECT_EQ(stria_unshard(layout, N, r, seq_dim, local_dl, const_cast<DLTensor*>(full_dl), stream), want);
  EXPECT_STRNE(stria_get_last_error(), "");
  EXPECT_TRUE(full->bytes == full_before) << "a rejected unshard wrote to full";
}

TEST(Shard, BadArguments) {
  const DtypeCase& f32 = kDtypes[0];
  const stria_status_t kInv = STRIA_ERROR_INVALID_ARGUMENT;
  const stria_layout_t kS = STRIA_LAYOUT_STRIPED;
  Host full(f32, {16, 4}, Mem::kCompact), local(f32, {8, 4}, Mem::kCompact);
  for (int64_t f = 0; f < full.numel(); ++f) Encode(f32, f % 200, full.At(f));
  // The good call works, so each failure below is down to the one thing changed.
  ASSERT_EQ(stria_shard(kS, 2, 1, 0, &full.dl, &local.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
  std::fill(local.bytes.begin(), local.bytes.end(), kSentinel);

  ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, nullptr, &local.dl, nullptr, "full NULL");
  ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &full.dl, nullptr, nullptr, "local NULL");
  ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &full.dl, &local.dl, reinterpret_cast<void*>(0x20), "stream non-NULL");
  {
    Host l1(f32, {8}, Mem::kCompact);
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &l1, &full.dl, &l1.dl, nullptr, "ndim mismatch");
  }
  {
    Host li(kDtypes[2], {8, 4}, Mem::kCompact);
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &li, &full.dl, &li.dl, nullptr, "dtype mismatch");
    DLTensor i32 = local.dl;
    i32.dtype = DLDataType{kDLInt, 32, 1};
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &full.dl, &i32, nullptr, "same size, other dtype code");
  }
  for (int64_t len : {7, 9, 16}) {
    Host lw(f32, {len, 4}, Mem::kCompact);
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &lw, &full.dl, &lw.dl, nullptr, "wrong local length");
  }
  {
    Host lo(f32, {8, 5}, Mem::kCompact);
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &lo, &full.dl, &lo.dl, nullptr, "other dimension differs");
  }
  {
    // Broadcast views (stride 0 over a dimension of size > 1, torch's expand): refused as what a
    // call writes (several tokens would land on one element), accepted as what it reads.
    int64_t bstrides[2] = {0, 1};
    DLTensor fb = full.dl, lb = local.dl;
    fb.strides = bstrides;
    lb.strides = bstrides;
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &fb, &lb, nullptr, "broadcast output");
    EXPECT_NE(std::string(stria_get_last_error()).find("must not overlap"), std::string::npos)
        << stria_get_last_error();
    ASSERT_EQ(stria_shard(kS, 2, 1, 0, &fb, &local.dl, nullptr), STRIA_SUCCESS) << stria_get_last_error();
    for (int64_t i = 0; i < local.numel(); ++i)
      EXPECT_EQ(std::memcmp(local.At(i), full.At(i % 4), static_cast<size_t>(f32.bytes)), 0) << "element " << i;
    std::fill(local.bytes.begin(), local.bytes.end(), kSentinel);
  }
  for (int sd : {2, 3, -3, -100, 1000})
    ExpectBoth(kInv, kS, 2, 0, sd, &full, &local, &full.dl, &local.dl, nullptr, "seq_dim out of range");
  ExpectBoth(kInv, kS, 2, 2, 0, &full, &local, &full.dl, &local.dl, nullptr, "rank = world_size");
  ExpectBoth(kInv, kS, 2, -1, 0, &full, &local, &full.dl, &local.dl, nullptr, "rank -1");
  ExpectBoth(kInv, kS, 0, 0, 0, &full, &local, &full.dl, &local.dl, nullptr, "world_size 0");
  ExpectBoth(kInv, static_cast<stria_layout_t>(7), 2, 0, 0, &full, &local, &full.dl, &local.dl, nullptr, "layout 7");
  {
    Host f15(f32, {15, 4}, Mem::kCompact), l7(f32, {7, 4}, Mem::kCompact);
    ExpectBoth(kInv, kS, 2, 0, 0, &f15, &l7, &f15.dl, &l7.dl, nullptr, "seq_len % world_size");
    Host f6(f32, {6, 4}, Mem::kCompact), l3(f32, {3, 4}, Mem::kCompact);
    ExpectBoth(kInv, STRIA_LAYOUT_ZIGZAG, 2, 0, 0, &f6, &l3, &f6.dl, &l3.dl, nullptr, "zigzag seq_len % 2N");
  }
  {
    DLTensor d = local.dl;
    d.data = nullptr;
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &full.dl, &d, nullptr, "local data NULL");
    DLTensor s = full.dl;
    s.shape = nullptr;
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &s, &local.dl, nullptr, "full shape NULL");
    DLTensor z = full.dl;
    z.ndim = 0;
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &z, &local.dl, nullptr, "full ndim 0");
    DLTensor m = local.dl;
    m.byte_offset = 1;
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &full.dl, &m, nullptr, "misaligned local");
    DLTensor c = local.dl;
    c.device = DLDevice{kDLCUDA, 0};
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &full.dl, &c, nullptr, "local on another device than full");
    EXPECT_NE(std::string(stria_get_last_error()).find("full's device"), std::string::npos) << stria_get_last_error();
    DLTensor h = full.dl;
    int64_t huge_shape[2] = {int64_t{1} << 62, 4};
    h.shape = huge_shape;
    ExpectBoth(kInv, kS, 2, 0, 0, &full, &local, &h, &local.dl, nullptr, "full's element count overflows");
    EXPECT_NE(std::string(stria_get_last_error()).find("too large"), std::string::npos) << stria_get_last_error();
    DLTensor cf = full.dl, cl = local.dl;
    cf.device = cl.device = DLDevice{kDLCUDA, 0};
    // Host memory labelled cuda: no module or no GPU is UNSUPPORTED; with a GPU the module sees
    // that the memory is not the device's.
    ExpectBoth(stria_test::CudaContextWorks() ? kInv : STRIA_ERROR_UNSUPPORTED, kS, 2, 0, 0, &full, &local, &cf, &cl,
               nullptr, "CUDA tensors on the host");
  }
}

}  // namespace
