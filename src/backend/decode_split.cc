#include "backend/decode_split.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace stria {

void PlanDecodeItems(const DecodeWork& w, int64_t target, std::vector<DecodeKeyPiece>* pieces,
                     std::vector<DecodeWorkItem>* items) {
  const std::vector<CacheSegment>& segs = w.segments;
  size_t i = 0;
  while (i < segs.size()) {
    const int64_t b = segs[i].b;
    DecodeWorkItem item{b, static_cast<int64_t>(pieces->size()), 0};
    int64_t keys = 0;
    for (; i < segs.size() && segs[i].b == b; ++i) {
      for (int64_t j0 = 0; j0 < segs[i].count;) {
        const int64_t n = std::min(segs[i].count - j0, target - keys);
        pieces->push_back(DecodeKeyPiece{static_cast<int64_t>(i), j0, n});
        j0 += n;
        keys += n;
        if (keys == target) {
          item.last = static_cast<int64_t>(pieces->size());
          items->push_back(item);
          item.first = item.last;
          keys = 0;
        }
      }
    }
    item.last = static_cast<int64_t>(pieces->size());
    if (item.last > item.first) items->push_back(item);
  }
}

int64_t DecodeKeyCount(const DecodeWork& w) {
  int64_t keys = 0;
  for (const CacheSegment& seg : w.segments) keys += seg.count;
  return keys;
}

double MergeDecodeRecord(const float* all, size_t stride, int world_size, int64_t D, size_t at, const double* sink,
                         float* out) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  double mx = kNegInf;
  bool nan = false;
  for (int r = 0; r < world_size; ++r) {
    const float x = all[r * stride + at + static_cast<size_t>(D)];
    nan |= x != x;
    mx = std::max(mx, static_cast<double>(x));
  }
  double total = 0.0;
  std::vector<double> acc(static_cast<size_t>(D), 0.0);
  if (nan) {
    mx = std::numeric_limits<double>::quiet_NaN();
    std::fill(acc.begin(), acc.end(), mx);
    total = 1.0;
  } else if (mx != kNegInf) {
    for (int r = 0; r < world_size; ++r) {
      const float* p = all + r * stride + at;
      if (p[D] == -std::numeric_limits<float>::infinity()) continue;
      const double c = std::exp(static_cast<double>(p[D]) - mx);
      total += c;
      for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += c * p[d];
    }
  }
  double lse = total > 0.0 ? mx + std::log(total) : kNegInf;
  double scale = total > 0.0 ? 1.0 / total : 0.0;
  if (sink != nullptr) {
    const double z = *sink;
    if (total > 0.0) {
      const double top = std::max(lse, z);
      const double merged = top + std::log(std::exp(lse - top) + std::exp(z - top));
      scale *= std::exp(lse - merged);
      lse = merged;
    } else {
      lse = z;
    }
  }
  for (int64_t d = 0; d < D; ++d) out[d] = static_cast<float>(acc[static_cast<size_t>(d)] * scale);
  return lse;
}

}  // namespace stria
