// The load-balance analysis through the public C API: the figures the Striped Attention paper
// and DESIGN.md publish, exact identities of the work counts, a brute-force cross-check against
// a pair-by-pair count over global positions, and argument validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "stria/stria.h"
#include "test_util.h"

using stria_test::LayoutName;

namespace {

const stria_layout_t kLayouts[] = {STRIA_LAYOUT_CONTIGUOUS, STRIA_LAYOUT_STRIPED, STRIA_LAYOUT_ZIGZAG};

// The divisibility unit of seq_len for a layout: zigzag cuts each rank's share in two.
int64_t Unit(stria_layout_t layout, int n) {
  return layout == STRIA_LAYOUT_ZIGZAG ? 2 * n : n;
}

stria_balance_t Analyze(stria_layout_t layout, bool causal, int64_t seq_len, int n, int64_t tile) {
  stria_balance_t b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  EXPECT_EQ(stria_analyze_balance(layout, causal ? 1 : 0, seq_len, n, tile, &b), STRIA_SUCCESS)
      << LayoutName(layout) << " S=" << seq_len << " N=" << n << " tile=" << tile << ": " << stria_get_last_error();
  return b;
}

std::vector<double> Steps(stria_layout_t layout, bool causal, int64_t seq_len, int n, int64_t tile) {
  std::vector<double> work(static_cast<size_t>(n) * n, -1.0);
  EXPECT_EQ(stria_analyze_balance_steps(layout, causal ? 1 : 0, seq_len, n, tile, work.data()), STRIA_SUCCESS)
      << LayoutName(layout) << " S=" << seq_len << " N=" << n << " tile=" << tile << ": " << stria_get_last_error();
  return work;
}

// The same table counted the slow, obvious way: every (query, key) pair of every block, by the
// global positions the library itself reports, with whole tiles charged when any pair is
// visible. Independent of the block masks the library derives.
std::vector<double> BruteForceSteps(stria_layout_t layout, bool causal, int64_t seq_len, int n, int64_t tile) {
  const int64_t len = seq_len / n;
  std::vector<std::vector<int64_t>> pos(n, std::vector<int64_t>(len));
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(stria_layout_positions(layout, seq_len, n, r, pos[r].data()), STRIA_SUCCESS) << stria_get_last_error();
  }
  std::vector<double> work(static_cast<size_t>(n) * n, 0.0);
  for (int s = 0; s < n; ++s) {
    for (int r = 0; r < n; ++r) {
      const int k = ((r - s) % n + n) % n;
      double w = 0.0;
      for (int64_t i0 = 0; i0 < len; i0 += tile) {
        const int64_t i1 = std::min(len, i0 + tile);
        for (int64_t j0 = 0; j0 < len; j0 += tile) {
          const int64_t j1 = std::min(len, j0 + tile);
          bool any = false;
          for (int64_t i = i0; i < i1 && !any; ++i)
            for (int64_t j = j0; j < j1 && !any; ++j) any = !causal || pos[k][j] <= pos[r][i];
          if (any) w += static_cast<double>((i1 - i0) * (j1 - j0));
        }
      }
      work[static_cast<size_t>(s) * n + r] = w;
    }
  }
  return work;
}

// Published figures (Striped Attention, Brandon et al. 2023; DESIGN.md): exact pairs, causal.
TEST(Balance, PublishedContiguous) {
  stria_balance_t b = Analyze(STRIA_LAYOUT_CONTIGUOUS, true, 2048, 8, 1);
  EXPECT_NEAR(b.speedup, 4.27, 0.005);
  EXPECT_NEAR(b.imbalance, 1.87, 0.005);
  // Closed form: step 0 is one diagonal block, the 7 later steps each have a full block.
  const double len = 256;
  EXPECT_EQ(b.total_work, 2048.0 * 2049.0 / 2);
  EXPECT_EQ(b.ring_latency, len * (len + 1) / 2 + 7 * len * len);

  EXPECT_NEAR(Analyze(STRIA_LAYOUT_CONTIGUOUS, true, 4096, 16, 1).speedup, 8.26, 0.005);
}

TEST(Balance, PublishedZigzag) {
  stria_balance_t b = Analyze(STRIA_LAYOUT_ZIGZAG, true, 2048, 8, 1);
  EXPECT_NEAR(b.speedup, 8.00, 0.005);
  EXPECT_NEAR(b.imbalance, 1.00, 0.005);
}

TEST(Balance, StripedOverContiguousLatencyRatio) {
  // Striped attention's gain over contiguous ring attention at N = 8: (1/2 + 7) / 4 = 1.875
  // in the limit of long sequences, approached from below.
  const double contiguous = Analyze(STRIA_LAYOUT_CONTIGUOUS, true, 16384, 8, 1).ring_latency;
  const double striped = Analyze(STRIA_LAYOUT_STRIPED, true, 16384, 8, 1).ring_latency;
  const double gain = contiguous / striped;
  EXPECT_NEAR(gain, 1.87, 0.005);
  EXPECT_LT(gain, 1.875);
}

TEST(Balance, StripedSpeedupCloseToN) {
  for (int n : {2, 4, 8, 16, 32, 64}) {
    for (int64_t seq_len : {int64_t{16384}, int64_t{262144}}) {
      stria_balance_t b = Analyze(STRIA_LAYOUT_STRIPED, true, seq_len, n, 1);
      const double len = static_cast<double>(seq_len / n);
      // Every step costs one block with the diagonal included: speedup (S + 1) / (L + 1).
      EXPECT_DOUBLE_EQ(b.speedup, (static_cast<double>(seq_len) + 1) / (len + 1)) << "N=" << n << " S=" << seq_len;
      EXPECT_GT(b.speedup, 0.99 * n);
      EXPECT_LE(b.speedup, n);
    }
  }
}

TEST(Balance, ZigzagExactlyBalanced) {
  for (int n = 1; n <= 16; ++n) {
    for (int64_t seq_len : {2 * n, 2 * n * 7, 2 * n * 128}) {
      // Exact pairs, and tiles that divide the half-chunks, are balanced to the last pair.
      for (int64_t tile : {int64_t{1}, int64_t{seq_len / (2 * n)}}) {
        stria_balance_t b = Analyze(STRIA_LAYOUT_ZIGZAG, true, seq_len, n, tile);
        EXPECT_DOUBLE_EQ(b.imbalance, 1.0) << "N=" << n << " S=" << seq_len << " tile=" << tile;
        EXPECT_DOUBLE_EQ(b.speedup, n) << "N=" << n << " S=" << seq_len << " tile=" << tile;
      }
    }
  }
}

TEST(Balance, NonCausalIsPerfectForEveryLayout) {
  for (stria_layout_t layout : kLayouts) {
    for (int n = 1; n <= 8; ++n) {
      const int64_t seq_len = Unit(layout, n) * 12;
      for (int64_t tile : {1, 5, 64}) {
        stria_balance_t b = Analyze(layout, false, seq_len, n, tile);
        EXPECT_EQ(b.speedup, n) << LayoutName(layout) << " N=" << n << " tile=" << tile;
        EXPECT_EQ(b.imbalance, 1.0) << LayoutName(layout) << " N=" << n << " tile=" << tile;
        EXPECT_EQ(b.total_work, static_cast<double>(seq_len * seq_len));
      }
    }
  }
}

TEST(Balance, ExactTotalWorkIsTheCausalTriangle) {
  for (stria_layout_t layout : kLayouts) {
    for (int n = 1; n <= 8; ++n) {
      for (int64_t m : {1, 3, 16, 101}) {
        const int64_t seq_len = Unit(layout, n) * m;
        const double s = static_cast<double>(seq_len);
        EXPECT_EQ(Analyze(layout, true, seq_len, n, 1).total_work, s * (s + 1) / 2)
            << LayoutName(layout) << " N=" << n << " S=" << seq_len;
        EXPECT_EQ(Analyze(layout, false, seq_len, n, 1).total_work, s * s)
            << LayoutName(layout) << " N=" << n << " S=" << seq_len;
      }
    }
  }
}

TEST(Balance, StepsAddUpToTheSummary) {
  for (stria_layout_t layout : kLayouts) {
    for (int n : {1, 2, 3, 5, 8}) {
      for (int64_t tile : {1, 4, 7}) {
        const int64_t seq_len = Unit(layout, n) * 20;
        const std::vector<double> work = Steps(layout, true, seq_len, n, tile);
        double total = 0, latency = 0;
        for (int s = 0; s < n; ++s) {
          double step_max = 0;
          for (int r = 0; r < n; ++r) {
            total += work[s * n + r];
            step_max = std::max(step_max, work[s * n + r]);
          }
          latency += step_max;
        }
        stria_balance_t b = Analyze(layout, true, seq_len, n, tile);
        EXPECT_EQ(b.total_work, total) << LayoutName(layout) << " N=" << n << " tile=" << tile;
        EXPECT_EQ(b.ring_latency, latency) << LayoutName(layout) << " N=" << n << " tile=" << tile;
        EXPECT_DOUBLE_EQ(b.speedup, total / latency);
        EXPECT_DOUBLE_EQ(b.imbalance, latency / (total / n));
      }
    }
  }
}

TEST(Balance, TilesNeverCountLessThanExactPairs) {
  for (stria_layout_t layout : kLayouts) {
    for (bool causal : {true, false}) {
      for (int n : {1, 2, 3, 4, 7, 8}) {
        const int64_t seq_len = Unit(layout, n) * 36;
        const std::vector<double> exact = Steps(layout, causal, seq_len, n, 1);
        const stria_balance_t exact_summary = Analyze(layout, causal, seq_len, n, 1);
        for (int64_t tile : {2, 3, 5, 8, 16, 64, 1000}) {
          const std::vector<double> tiled = Steps(layout, causal, seq_len, n, tile);
          for (size_t c = 0; c < exact.size(); ++c) {
            EXPECT_GE(tiled[c], exact[c]) << LayoutName(layout) << " N=" << n << " tile=" << tile << " cell " << c;
          }
          const stria_balance_t b = Analyze(layout, causal, seq_len, n, tile);
          EXPECT_GE(b.total_work, exact_summary.total_work);
          EXPECT_GE(b.ring_latency, exact_summary.ring_latency);
        }
      }
    }
  }
}

TEST(Balance, MatchesBruteForceOverGlobalPositions) {
  for (stria_layout_t layout : kLayouts) {
    for (bool causal : {true, false}) {
      for (int n = 1; n <= 8; ++n) {
        for (int64_t m : {1, 3, 5}) {
          const int64_t seq_len = Unit(layout, n) * m * 2;  // L = 2m (contiguous, striped) or 4m (zigzag)
          const int64_t len = seq_len / n;
          for (int64_t tile : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{7}, len, len + 5}) {
            const std::vector<double> expected = BruteForceSteps(layout, causal, seq_len, n, tile);
            const std::vector<double> got = Steps(layout, causal, seq_len, n, tile);
            for (int s = 0; s < n; ++s) {
              for (int r = 0; r < n; ++r) {
                EXPECT_EQ(got[s * n + r], expected[s * n + r])
                    << LayoutName(layout) << (causal ? " causal" : " full") << " S=" << seq_len << " N=" << n
                    << " tile=" << tile << " step " << s << " rank " << r;
              }
            }
          }
        }
      }
    }
  }
}

TEST(Balance, MillionTokensIsFast) {
  // Counting is per tile-row, never per pair: a million tokens at exact granularity must be
  // nearly instantaneous (the bound is generous for sanitizer and debug builds).
  const auto start = std::chrono::steady_clock::now();
  for (stria_layout_t layout : kLayouts) {
    stria_balance_t b = Analyze(layout, true, int64_t{1} << 20, 64, 1);
    EXPECT_GT(b.speedup, 30.0) << LayoutName(layout);
    std::vector<double> work = Steps(layout, true, int64_t{1} << 20, 64, 1);
    EXPECT_GT(work[0], 0.0);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
}

TEST(Balance, TrillionTokensIsFastToo) {
  // Every block's work is a closed form: 2^40 tokens at exact granularity (half an hour when
  // counted per tile-row) answers at once, and the causal total is still the triangle.
  const auto start = std::chrono::steady_clock::now();
  const int64_t seq_len = int64_t{1} << 40;
  const double triangle = static_cast<double>(seq_len) * static_cast<double>(seq_len + 1) / 2;
  for (stria_layout_t layout : kLayouts) {
    for (int64_t tile : {int64_t{1}, int64_t{3}, int64_t{128}}) {
      const stria_balance_t b = Analyze(layout, true, seq_len, 8, tile);
      EXPECT_GE(b.total_work, triangle * (1 - 1e-12)) << LayoutName(layout) << " tile " << tile;
      if (tile == 1) {
        EXPECT_NEAR(b.total_work / triangle, 1.0, 1e-12) << LayoutName(layout);
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
}

// Tile-rows that reach a cut last key tile, odd offsets and tiles that do not divide L: the
// closed form against the brute force on lengths that are not multiples of the tile.
TEST(Balance, ClosedFormAtRaggedEdges) {
  for (stria_layout_t layout : kLayouts) {
    for (int n : {1, 2, 3, 5}) {
      for (int64_t m : {7, 11, 13}) {
        const int64_t seq_len = Unit(layout, n) * m;
        for (int64_t tile : {int64_t{2}, int64_t{4}, int64_t{5}, int64_t{6}, int64_t{9}}) {
          const std::vector<double> expected = BruteForceSteps(layout, true, seq_len, n, tile);
          const std::vector<double> got = Steps(layout, true, seq_len, n, tile);
          for (size_t c = 0; c < got.size(); ++c)
            EXPECT_EQ(got[c], expected[c])
                << LayoutName(layout) << " S=" << seq_len << " N=" << n << " tile=" << tile << " cell " << c;
        }
      }
    }
  }
}

TEST(Balance, LargestWorldSize) {
  stria_balance_t b = Analyze(STRIA_LAYOUT_STRIPED, true, int64_t{65536} * 4, 65536, 1);
  EXPECT_GT(b.speedup, 0.0);
}

// Every rejected call returns STRIA_ERROR_INVALID_ARGUMENT and explains itself.
void ExpectRejected(stria_status_t status, const std::string& what) {
  EXPECT_EQ(status, STRIA_ERROR_INVALID_ARGUMENT) << what;
  EXPECT_STRNE(stria_get_last_error(), "") << what;
}

TEST(Balance, RejectsBadArguments) {
  stria_balance_t b;
  std::memset(&b, 0, sizeof b);
  b.struct_size = sizeof b;
  std::vector<double> work(64);
  const stria_layout_t unknown = static_cast<stria_layout_t>(3);
  const stria_layout_t negative = static_cast<stria_layout_t>(-1);

  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 1, nullptr), "NULL out");
  ExpectRejected(stria_analyze_balance_steps(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 1, nullptr), "NULL work");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 0, &b), "tile 0");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 8, -64, &b), "negative tile");
  ExpectRejected(stria_analyze_balance_steps(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 0, work.data()), "steps tile 0");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_CONTIGUOUS, 1, 2049, 8, 1, &b), "seq_len % N");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_ZIGZAG, 1, 2056, 8, 1, &b), "zigzag seq_len % 2N");
  ExpectRejected(stria_analyze_balance_steps(STRIA_LAYOUT_STRIPED, 1, 10, 4, 1, work.data()), "steps seq_len % N");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 0, 8, 1, &b), "seq_len 0");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, -2048, 8, 1, &b), "negative seq_len");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 0, 1, &b), "world_size 0");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, -8, 1, &b), "negative world_size");
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, int64_t{65537} * 2, 65537, 1, &b),
                 "world_size above 65536");
  ExpectRejected(stria_analyze_balance_steps(STRIA_LAYOUT_STRIPED, 1, 2048, 0, 1, work.data()), "steps world_size 0");
  ExpectRejected(stria_analyze_balance(unknown, 1, 2048, 8, 1, &b), "layout 3");
  ExpectRejected(stria_analyze_balance(negative, 1, 2048, 8, 1, &b), "layout -1");
  ExpectRejected(stria_analyze_balance_steps(unknown, 1, 2048, 8, 1, work.data()), "steps layout 3");

  stria_balance_t small;
  std::memset(&small, 0, sizeof small);
  small.struct_size = 4;
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 1, &small), "struct_size 4");
  small.struct_size = 0;
  ExpectRejected(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 1, &small), "struct_size 0");

  // A successful call clears the message.
  ASSERT_EQ(stria_analyze_balance(STRIA_LAYOUT_STRIPED, 1, 2048, 8, 1, &b), STRIA_SUCCESS);
  EXPECT_STREQ(stria_get_last_error(), "");
}

TEST(Balance, AcceptsALargerStructFromANewerHeader) {
  // A caller compiled against a later header passes a bigger struct; the fields we know are filled.
  struct {
    stria_balance_t b;
    double later_fields[4];
  } big;
  std::memset(&big, 0, sizeof big);
  big.b.struct_size = sizeof big;
  ASSERT_EQ(stria_analyze_balance(STRIA_LAYOUT_ZIGZAG, 1, 2048, 8, 1, &big.b), STRIA_SUCCESS) << stria_get_last_error();
  EXPECT_NEAR(big.b.speedup, 8.0, 1e-12);
  EXPECT_EQ(big.b.struct_size, sizeof big);
}

}  // namespace
