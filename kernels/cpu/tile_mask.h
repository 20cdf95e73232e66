// The block mask on one query tile x key tile of the CPU kernels: which pairs are visible.
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/simd.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// Visible key columns [lo, hi) of local query row i (empty when the row is outside the mask).
inline void RowRange(const BlockMask& m, int64_t i, int64_t* lo, int64_t* hi) {
  if (i < m.q_begin || i >= m.q_end) {
    *lo = *hi = 0;
    return;
  }
  *lo = m.k_begin;
  *hi = m.diagonal ? std::min(m.k_end, i + m.offset + 1) : m.k_end;
  if (m.doc_lo != nullptr) {
    *lo = std::max(*lo, m.doc_lo[i]);
    *hi = std::min(*hi, m.doc_hi[i]);
  }
  if (*hi < *lo) *hi = *lo;
}

// Cuts [*k_lo, *k_hi), the keys the rows [row_lo, row_hi) of the mask may see, to their documents.
// The bounds never decrease along the rows, so the first row has the lowest, the last the highest.
inline void DocumentKeyRange(const BlockMask& m, int64_t row_lo, int64_t row_hi, int64_t* k_lo, int64_t* k_hi) {
  if (m.doc_lo == nullptr || row_lo >= row_hi) return;
  *k_lo = std::max(*k_lo, m.doc_lo[row_lo]);
  *k_hi = std::min(*k_hi, m.doc_hi[row_hi - 1]);
}

// The query rows [*i_lo, *i_hi) that see any key of the key tile at j0; false when none do.
inline bool QueriesOfKeyTile(const BlockMask& mk, int64_t j0, int64_t* i_lo, int64_t* i_hi) {
  const int64_t j_lo = std::max(j0, mk.k_begin), j_hi = std::min(j0 + kBlockK, mk.k_end);
  if (j_lo >= j_hi) return false;
  *i_lo = mk.q_begin;
  *i_hi = mk.q_end;
  if (mk.diagonal) *i_lo = std::max(*i_lo, j_lo - mk.offset);
  if (mk.doc_lo != nullptr && *i_lo < *i_hi) {
    // Rows whose document meets [j_lo, j_hi): doc_hi[i] > j_lo and doc_lo[i] < j_hi. Both bounds
    // never decrease, so those rows are one run, found by two binary searches.
    const int64_t* first =
        std::partition_point(mk.doc_hi + *i_lo, mk.doc_hi + *i_hi, [j_lo](int64_t hi) { return hi <= j_lo; });
    const int64_t* last =
        std::partition_point(mk.doc_lo + *i_lo, mk.doc_lo + *i_hi, [j_hi](int64_t lo) { return lo < j_hi; });
    const int64_t i_first = first - mk.doc_hi, i_last = last - mk.doc_lo;
    *i_lo = i_first;
    *i_hi = i_last;
  }
  return *i_lo < *i_hi;
}

// True when every pair of the tile rows [i0, i0+kBlockQ) x cols [j0, j0+kBlockK) is visible.
inline bool TileFull(const BlockMask& m, int64_t i0, int64_t j0) {
  if (i0 < m.q_begin || i0 + kBlockQ > m.q_end || j0 < m.k_begin || j0 + kBlockK > m.k_end) return false;
  if (m.doc_lo != nullptr && (m.doc_lo[i0 + kBlockQ - 1] > j0 || m.doc_hi[i0] < j0 + kBlockK)) return false;
  return !m.diagonal || j0 + kBlockK - 1 <= i0 + m.offset;
}

// Sets the scores of invisible pairs of a tile to -inf.
inline void ApplyMask(const BlockMask& m, int64_t i0, int64_t j0, float* s) {
  for (int64_t r = 0; r < kBlockQ; ++r) {
    int64_t lo, hi;
    RowRange(m, i0 + r, &lo, &hi);
    float* row = s + r * kBlockK;
    // Visible columns are one interval: fill what lies before and after it.
    const int64_t c_lo = std::min<int64_t>(kBlockK, std::max<int64_t>(0, lo - j0));
    const int64_t c_hi = std::max(c_lo, std::min<int64_t>(kBlockK, std::max<int64_t>(0, hi - j0)));
    std::fill(row, row + c_lo, kNegInf);
    std::fill(row + c_hi, row + kBlockK, kNegInf);
  }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
