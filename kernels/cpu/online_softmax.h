// The online softmax of one score tile, shared by the CPU forward kernels (float32 GEMMs and
// AMX tiles): turns scores into probabilities in place and keeps each row's running state.
#pragma once

#include <cstring>
#include <limits>

#include "cpu/simd.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// s [kBlockQ][kBlockK]: scores; scale * s is in the log2 domain. Row r reads columns
// [0, cols[r / group_rows]) (the rest are invisible and left alone) and gets its probabilities
// relative to m[r]. m, l: the rows' running reference maximum and sum; lsum: per-lane partial
// sums not yet added into l; acc: the unnormalised output rows (stride Dp), rescaled when m moves
// and meaningful only once m is no longer -inf (they need no clearing before the first tile).
inline void SoftmaxTile(float* s, const int64_t* cols, int group_rows, float scale, float* m, float* l, vf* lsum,
                        float* acc, int64_t Dp) {
  const vf sv = Splat(scale);
  for (int64_t r = 0; r < kBlockQ; ++r) {
    float* row = s + r * kBlockK;
    const int64_t n = cols[r / group_rows];  // columns past n are invisible and never read
    vf mx = Splat(kNegInf);
    for (int64_t c = 0; c < n; c += VL) mx = Max(mx, Load(row + c));
    // The reference m only moves when a score exceeds it by more than kRescaleSlack (or on the
    // row's first visible scores): the common tile skips the horizontal maximum, the exp2 of
    // the correction and the rescaling of the output row.
    if (m[r] == kNegInf || AnyGreater(mx * sv, m[r] + kRescaleSlack)) {
      const float m_old = m[r];
      // Max passes over NaN scores: they turn into NaN probabilities below and poison the row
      // sum and the output. Only a row with no finite score yet must look for them itself.
      float m_new = std::max(m_old, HMax(mx) * scale);
      if (m_new == kNegInf) {
        if (!HasNaN(row, n)) {  // nothing visible yet: this row contributes nothing
          std::memset(row, 0, sizeof(float) * n);
          continue;
        }
        m_new = std::numeric_limits<float>::quiet_NaN();
      }
      const float alpha = std::exp2(m_old - m_new);  // 0 when m_old is -inf
      l[r] = (l[r] + HSum(lsum[r])) * alpha;
      lsum[r] = vf{};
      m[r] = m_new;
      // The output row is set, not scaled, at the row's first visible key: until then it holds
      // whatever the buffer held (the backend does not clear it; see ForwardEnd there).
      float* o = acc + r * Dp;
      const vf av = Splat(alpha);
      if (m_old == kNegInf)
        for (int64_t d = 0; d < Dp; d += VL) Store(o + d, vf{});
      else
        for (int64_t d = 0; d < Dp; d += VL) Store(o + d, Load(o + d) * av);
    }
    const vf mv = Splat(m[r]);
    vf sum = lsum[r];
    for (int64_t c = 0; c < n; c += VL) {
      vf p = Exp2(Load(row + c) * sv - mv);
      Store(row + c, p);
      sum += p;
    }
    lsum[r] = sum;
  }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
