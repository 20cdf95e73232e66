#include "layout/plan_balance.h"

#include <algorithm>
#include <vector>

namespace stria {
namespace {

// Width of the whole tiles (boundaries at multiples of `tile`, the last cut at `len`) covering
// [begin, end), begin < end <= len.
int64_t TileSpan(int64_t begin, int64_t end, int64_t len, int64_t tile) {
  const int64_t first = begin / tile * tile;
  const int64_t last = (end - 1) / tile * tile;
  return last + std::min(tile, len - last) - first;
}

}  // namespace

void PlanStepWork(const Plan& plan, const MaskSpec& mask, int64_t tile, double* work) {
  const int n = plan.world_size();
  const int64_t L = plan.local_len();
  std::vector<int64_t> lo(static_cast<size_t>(L)), hi(static_cast<size_t>(L));
  for (int64_t b = 0; b < plan.batch(); ++b)
    for (int s = 0; s < n; ++s)
      for (int r = 0; r < n; ++r) {
        const int k = (r - s + n) % n;
        if (!plan.Bounds(b, r, k, mask, lo.data(), hi.data())) continue;
        double w = 0.0;
        for (int64_t i0 = 0; i0 < L; i0 += tile) {
          const int64_t i1 = std::min(L, i0 + tile);
          const int64_t k_lo = lo[static_cast<size_t>(i0)], k_hi = hi[static_cast<size_t>(i1 - 1)];
          if (k_hi > k_lo) w += static_cast<double>(i1 - i0) * static_cast<double>(TileSpan(k_lo, k_hi, L, tile));
        }
        work[s * n + r] += w;
      }
}

double PlanIdealWork(const Plan& plan, const MaskSpec& mask, int64_t tile) {
  double total = 0.0;
  const int64_t row = plan.num_seqs() + 1;
  for (int64_t b = 0; b < plan.batch(); ++b) {
    const int64_t* cu = plan.boundaries().data() + b * row;
    for (int64_t d = 0; d < plan.num_seqs(); ++d) {
      const int64_t len = cu[d + 1] - cu[d];
      // The same count as PlanStepWork's, on the document alone (local index = offset in it).
      for (int64_t i0 = 0; i0 < len; i0 += tile) {
        const int64_t i1 = std::min(len, i0 + tile);
        const int64_t k_lo = mask.window_left >= 0 ? std::max<int64_t>(0, i0 - mask.window_left) : 0;
        const int64_t last = i1 - 1;
        const int64_t k_hi =
            mask.causal ? last + 1 : (mask.window_right >= 0 ? std::min(len, last + mask.window_right + 1) : len);
        total += static_cast<double>(i1 - i0) * static_cast<double>(TileSpan(k_lo, k_hi, len, tile));
      }
    }
  }
  return total;
}

double PlanKVRowsSent(const Plan& plan, const MaskSpec& mask, int64_t tile) {
  const int n = plan.world_size(), steps = plan.RingSteps(mask);
  std::vector<int64_t> rows(static_cast<size_t>(plan.batch()));
  double sent = 0;
  for (int k = 0; k < n; ++k)
    for (int step = 0; step + 1 < steps; ++step) {
      plan.RowsStillNeeded(k, step, mask, rows.data());
      for (int64_t r : rows) sent += static_cast<double>(std::min(plan.local_len(), (r + tile - 1) / tile * tile));
    }
  return sent;
}

}  // namespace stria
