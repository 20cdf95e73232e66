// A plan's home boundary (Plan::HomeBegin): the local slot from which a rank's rows and keys meet
// only each other, under every mask, which is what lets a backend compute them apart from the ring
// (ForwardStep::home_begin). Checked against the plan's own document bounds on random packings.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "layout/plan.h"

namespace stria {
namespace {

constexpr int64_t kAlign = 128;

// Lognormal lengths (median `median`, capped at `cap`) until S tokens are used.
std::vector<int64_t> Boundaries(int64_t S, int64_t median, int64_t cap, std::mt19937_64& rng) {
  std::lognormal_distribution<double> len(std::log(static_cast<double>(median)), 1.0);
  std::vector<int64_t> cu = {0};
  while (cu.back() < S) {
    const int64_t n = std::clamp<int64_t>(static_cast<int64_t>(len(rng)), 1, cap);
    cu.push_back(std::min(S, cu.back() + n));
  }
  return cu;
}

// Every property a home part relies on, for every rank of `plan` under `mask`.
void CheckHome(const Plan& plan, const MaskSpec& mask, int* homes) {
  const int N = plan.world_size();
  const int64_t L = plan.local_len();
  std::vector<int64_t> lo(static_cast<size_t>(L)), hi(static_cast<size_t>(L));
  for (int r = 0; r < N; ++r) {
    const int64_t h = plan.HomeBegin(r, kAlign);
    ASSERT_LE(h, L);
    if (h == L) continue;
    ++*homes;
    ASSERT_EQ(h % kAlign, 0) << "rank " << r;
    bool kept_past = false;
    for (int64_t b = 0; b < plan.batch(); ++b) {
      for (const Plan::Run& run : plan.runs(b, r)) {
        if (run.segment == 0) {
          EXPECT_LE(run.local_begin + run.count, h) << "a shared document past it, rank " << r;
        }
        EXPECT_FALSE(run.local_begin < h && h < run.local_begin + run.count) << "a document crosses it, rank " << r;
        kept_past |= run.count > 0 && run.local_begin >= h;
      }
      for (int k = 0; k < N; ++k) {
        // Rank r's rows past h see keys of its own block only, and only those past h.
        if (plan.Bounds(b, r, k, mask, lo.data(), hi.data()))
          for (int64_t i = h; i < L; ++i)
            if (hi[i] > lo[i]) {
              ASSERT_EQ(k, r) << "row " << i << " of rank " << r << " sees rank " << k;
              ASSERT_GE(lo[i], h) << "row " << i << " of rank " << r;
            }
        // Its keys past h are seen by those rows only: by no other rank, and by no row below h.
        if (plan.Bounds(b, k, r, mask, lo.data(), hi.data()))
          for (int64_t i = 0; i < L; ++i)
            if (hi[i] > lo[i] && (k != r || i < h)) {
              ASSERT_LE(hi[i], h) << "row " << i << " of rank " << k;
            }
      }
    }
    EXPECT_TRUE(kept_past) << "rank " << r << ": nothing of its own past " << h;
  }
}

TEST(PlanHome, KeptDocumentsMeetOnlyEachOther) {
  std::mt19937_64 rng(7);
  int homes = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int N = 2 + trial % 7;
    const int64_t S = 1024 * (4 + trial % 29) + trial;  // not a multiple of N or of a tile
    const int64_t batch = 1 + trial % 3;
    std::vector<int64_t> cu;
    int64_t num_seqs = 0;
    for (int64_t b = 0; b < batch; ++b) {
      std::vector<int64_t> row = Boundaries(S, 64 + trial * 16, S / 2, rng);
      // Every row the same number of documents (the plan's [batch][num_seqs + 1]): split or
      // merge at the end.
      if (b == 0) num_seqs = static_cast<int64_t>(row.size()) - 1;
      while (static_cast<int64_t>(row.size()) - 1 > num_seqs) row.erase(row.end() - 2);
      while (static_cast<int64_t>(row.size()) - 1 < num_seqs) row.insert(row.end() - 1, row[row.size() - 2]);
      cu.insert(cu.end(), row.begin(), row.end());
    }
    Plan::Options o;
    o.world_size = N;
    o.tile = trial % 2 == 0 ? 128 : 64;
    std::unique_ptr<Plan> plan;
    ASSERT_TRUE(Plan::Create(cu.data(), batch, num_seqs, S, o, &plan).ok());
    MaskSpec causal, full, window;
    full.causal = false;
    window.window_left = 300;
    for (const MaskSpec& m : {causal, full, window}) CheckHome(*plan, m, &homes);
  }
  EXPECT_GT(homes, 40) << "too few ranks kept documents of their own to test anything";
}

TEST(PlanHome, DocumentsCutAcrossRanksAreShared) {
  // Where no rank has room for a document whole (short sequences at a large tile: S < N * tile),
  // the solver cuts it into consecutive pieces on several ranks, inside the kept segment. Their
  // rows see other ranks' keys, so they are never home.
  int cut = 0, homes = 0;
  for (int N : {2, 3, 5})
    for (int64_t S : {79, 111, 127, 259, 300})
      for (const std::vector<int64_t>& inner : {std::vector<int64_t>{}, {S / 3}, {S / 5, S / 2}}) {
        std::vector<int64_t> cu = {0};
        cu.insert(cu.end(), inner.begin(), inner.end());
        cu.push_back(S);
        const int64_t docs = static_cast<int64_t>(cu.size()) - 1;
        Plan::Options o;
        o.world_size = N;
        o.tile = 128;
        std::unique_ptr<Plan> plan;
        ASSERT_TRUE(Plan::Create(cu.data(), 1, docs, S, o, &plan).ok());
        for (int r = 0; r < N; ++r)
          for (const Plan::Run& run : plan->runs(0, r))
            cut +=
                run.segment == 1 && run.count < cu[static_cast<size_t>(run.doc) + 1] - cu[static_cast<size_t>(run.doc)];
        SCOPED_TRACE(::testing::Message() << "N " << N << " S " << S << " documents " << docs);
        MaskSpec causal, full;
        full.causal = false;
        for (const MaskSpec& m : {causal, full}) CheckHome(*plan, m, &homes);
      }
  EXPECT_GT(cut, 0) << "no document was cut across ranks: the case tests nothing";
}

TEST(PlanHome, NoneWhereNothingIsKept) {
  // A fixed layout's plan shares every document; a single document is shared too.
  const std::vector<int64_t> cu = {0, 1000, 5000, 8192};
  Plan::Options o;
  o.world_size = 4;
  o.strategy = Plan::Strategy::kLayout;
  std::unique_ptr<Plan> plan;
  ASSERT_TRUE(Plan::Create(cu.data(), 1, 3, 8192, o, &plan).ok());
  for (int r = 0; r < 4; ++r) EXPECT_EQ(plan->HomeBegin(r, kAlign), plan->local_len());
  const std::vector<int64_t> one = {0, 65536};
  Plan::Options balanced;
  balanced.world_size = 8;
  ASSERT_TRUE(Plan::Create(one.data(), 1, 1, 65536, balanced, &plan).ok());
  for (int r = 0; r < 8; ++r) EXPECT_EQ(plan->HomeBegin(r, kAlign), plan->local_len());
}

TEST(PlanHome, ShortDocumentsAreMostlyHome) {
  // Short documents only: the solver keeps most whole (it may share a few to even out the ranks),
  // so every rank has a home part, and together they hold most slots.
  std::vector<int64_t> cu = {0};
  while (cu.back() < 32768) cu.push_back(cu.back() + 256);
  Plan::Options o;
  o.world_size = 8;
  std::unique_ptr<Plan> plan;
  ASSERT_TRUE(Plan::Create(cu.data(), 1, static_cast<int64_t>(cu.size()) - 1, 32768, o, &plan).ok());
  int64_t home = 0;
  for (int r = 0; r < 8; ++r) {
    const int64_t h = plan->HomeBegin(r, kAlign);
    EXPECT_LT(h, plan->local_len()) << "rank " << r;
    home += plan->local_len() - h;
  }
  EXPECT_GT(home, 4 * plan->local_len());
}

}  // namespace
}  // namespace stria
