// The document-length distributions the packed-document benchmarks share (stria-plan-bench and
// stria-cuda-bench docs), so that their figures are of the same documents:
//   lognormal  median 1k tokens, sigma 1, capped at 15k: many short documents and a heavy tail;
//   fewlong    three documents of S/8 and many of 50..600 tokens;
//   uniform    1..4096 tokens;
//   single     one document (plain causal attention).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace stria_bench {

// Boundaries [0, .., S] of one row of `dist`; empty for a name that is none of the above.
inline std::vector<int64_t> DocumentBoundaries(const std::string& dist, int64_t S, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int64_t> cu{0};
  auto push = [&](int64_t n) { cu.push_back(std::min(S, cu.back() + std::max<int64_t>(1, n))); };
  if (dist == "single") {
    push(S);
  } else if (dist == "lognormal") {
    std::lognormal_distribution<double> len(std::log(1000.0), 1.0);
    while (cu.back() < S) push(std::min<int64_t>(15000, std::llround(len(g))));
  } else if (dist == "fewlong") {
    std::uniform_int_distribution<int64_t> len(50, 600), where(0, 7);
    std::vector<bool> long_at(8, false);
    for (int i = 0; i < 3; ++i) long_at[static_cast<size_t>(where(g))] = true;
    for (int slot = 0; cu.back() < S; ++slot) {  // the long ones start near random eighths of the row
      if (slot < 8 && long_at[static_cast<size_t>(slot)]) push(S / 8);
      const int64_t upto = std::min(S, (slot + 1) * S / 8);
      while (cu.back() < upto) push(len(g));
    }
  } else if (dist == "uniform") {
    std::uniform_int_distribution<int64_t> len(1, 4096);
    while (cu.back() < S) push(len(g));
  } else {
    cu.clear();
  }
  return cu;
}

}  // namespace stria_bench
