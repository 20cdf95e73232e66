// Which tiles of a ring block need computing, and which of those need the per-element mask.
// Everything here is plain integer logic, used by the kernels (device), the host launchers (grid
// sizes) and the emulator tests alike.
#pragma once

#include "cuda/params.h"

#if defined(__CUDACC__)
#define STRIA_HD __host__ __device__ __forceinline__
#else
#define STRIA_HD inline
#endif

namespace stria {
namespace cuda {

STRIA_HD float NegInf() {
  return -__builtin_huge_valf();
}
STRIA_HD float PosInf() {
  return __builtin_huge_valf();
}
STRIA_HD float NaN() {
  return __builtin_nanf("");
}
STRIA_HD int64_t MinI(int64_t a, int64_t b) {
  return a < b ? a : b;
}
STRIA_HD int64_t MaxI(int64_t a, int64_t b) {
  return a > b ? a : b;
}

// The mask of batch row b: with documents, its rows of the bounds (the same mask without).
STRIA_HD MaskArgs BatchMask(const MaskArgs& m, int b) {
  MaskArgs r = m;
  if (m.doc_lo != nullptr) {
    r.doc_lo += static_cast<int64_t>(b) * m.doc_stride;
    r.doc_hi += static_cast<int64_t>(b) * m.doc_stride;
  }
  return r;
}

// Document masks: the first index of [lo, hi) whose bound exceeds x (hi when none does), by
// bisection (the bounds never decrease).
STRIA_HD int64_t FirstAbove(const int64_t* bound, int64_t lo, int64_t hi, int64_t x) {
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (bound[mid] > x)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// Every index below is checked against the rectangle first, so the document bounds are read
// only for queries of the block: [q_begin, q_end) lies within the arrays. kDocs false compiles
// the document clamp out (the tensor-core kernels without documents: their registers are tight).
template <bool kDocs = true>
STRIA_HD bool Visible(const MaskArgs& m, int64_t i, int64_t j) {
  if (!(i >= m.q_begin && i < m.q_end && j >= m.k_begin && j < m.k_end && (!m.diagonal || j <= i + m.offset)))
    return false;
  if constexpr (kDocs) {
    if (m.doc_lo != nullptr) return j >= m.doc_lo[i] && j < m.doc_hi[i];
  }
  return true;
}

// Every ring block's mask is one interval of keys per query (and of queries per key), so a tile
// that needs the element mask takes that interval once per row, relative to the tile, and then
// two 32-bit comparisons per element (In) instead of Visible's six 64-bit ones with branches.
struct Window {
  int lo, hi;  // [lo, hi) relative to the tile's first index; empty when lo >= hi
};
STRIA_HD bool In(const Window& w, int x) {
  return x >= w.lo && x < w.hi;
}
// The keys of [j0, j0 + n) that query i sees.
template <bool kDocs = true>
STRIA_HD Window VisibleKeys(const MaskArgs& m, int64_t i, int64_t j0, int n) {
  if (i < m.q_begin || i >= m.q_end) return Window{0, 0};
  int64_t lo = MinI(MaxI(m.k_begin - j0, 0), n);  // both ends within [0, n], so 32 bits hold them
  int64_t hi = MinI(m.k_end - j0, n);
  if (m.diagonal) hi = MinI(hi, i + m.offset + 1 - j0);
  if constexpr (kDocs) {
    if (m.doc_lo != nullptr) {
      lo = MinI(MaxI(lo, m.doc_lo[i] - j0), n);
      hi = MinI(hi, m.doc_hi[i] - j0);
    }
  }
  return Window{static_cast<int>(lo), static_cast<int>(MaxI(hi, lo))};
}
// The queries of [i0, i0 + n) that see key j.
template <bool kDocs = true>
STRIA_HD Window SeeingQueries(const MaskArgs& m, int64_t j, int64_t i0, int n) {
  if (j < m.k_begin || j >= m.k_end) return Window{0, 0};
  int64_t lo = MaxI(m.q_begin - i0, 0);
  int64_t hi = MaxI(MinI(m.q_end - i0, n), 0);  // both ends within [0, n], so 32 bits hold them
  if (m.diagonal) lo = MaxI(lo, j - m.offset - i0);
  if constexpr (kDocs) {
    if (m.doc_lo != nullptr && lo < hi) {
      // The rows whose document holds j: doc_hi > j from the first, doc_lo > j from past the last.
      const int64_t first = FirstAbove(m.doc_hi, i0 + lo, i0 + hi, j);
      hi = FirstAbove(m.doc_lo, first, i0 + hi, j) - i0;
      lo = first - i0;
    }
  }
  return Window{static_cast<int>(MinI(lo, hi)), static_cast<int>(hi)};
}

// Query tiles of `rows` rows, aligned to multiples of `rows`, cover the block's queries
// [q_begin, q_end). A grid has QueryTileCount of them; CTA `cta` takes tile count - 1 - cta, so
// the later tiles, which see more keys under a causal mask, start first. Where the mask lists the
// tiles with work at this size (MaskArgs::tiles), the grid has those alone, in the list's order.
STRIA_HD unsigned QueryTileCount(const MaskArgs& m, int rows) {
  if (m.tiles != nullptr && rows == m.tile_rows) return static_cast<unsigned>(m.tile_count);
  const int64_t first = (m.q_begin / rows) * rows;
  return static_cast<unsigned>((m.q_end - first + rows - 1) / rows);
}
STRIA_HD int64_t QueryTileStart(const MaskArgs& m, int rows, unsigned cta, unsigned count) {
  if (m.tiles != nullptr && rows == m.tile_rows) return static_cast<int64_t>(m.tiles[cta]) * rows;
  return (m.q_begin / rows) * rows + static_cast<int64_t>(count - 1 - cta) * rows;
}

// The tile and the head (batch row times head) a CTA of a (tiles, heads) grid takes. CTAs start in
// the order of their linear index (x fastest) and are read here tile-major, so the first wave
// holds every head's first tiles: under a causal mask those see the most keys (a forward numbers
// its query tiles from the last, QueryTileStart; a backward's first key tile is seen by every query
// after it). The longest CTAs start first and the shortest fill the last wave, where head-major
// order left a head's longest tiles for the end.
//
// Where many heads are in flight, tile-major across all of them spreads the CTAs running at once
// over every head, and what they read again and again (a forward's K/V rows, a backward's Q, dO and
// dQ accumulator rows) no longer fits in L2: at 64 heads of 4k tokens, D 128, a forward's K and V
// are 128 MB against an H200's 50 MB of L2. So the heads go in groups of `group` (the launcher
// sizes a group to fit half the L2: head_groups.cuh): a group's CTAs start before the next group's,
// tile-major within it, and the last group may be smaller. FlashAttention-3's schedulers group
// heads for the same reason. group 0 (or at least `heads`): one group of every head.
struct CtaSlot {
  unsigned tile, head;
};
// The slot of the CTA that starts `linear`-th in a grid of `tiles` x `heads` (the ordered dQ
// numbers its CTAs by the order they start in, ordered_dq.cuh; a persistent kernel numbers its
// work items so).
STRIA_HD CtaSlot CtaSlotAt(uint64_t linear, unsigned tiles, unsigned heads, unsigned group) {
  if (group == 0 || group >= heads)
    return CtaSlot{static_cast<unsigned>(linear / heads), static_cast<unsigned>(linear % heads)};
  const uint64_t per_group = static_cast<uint64_t>(group) * tiles;
  const unsigned g = static_cast<unsigned>(linear / per_group), first = g * group;
  const unsigned in_group = heads - first < group ? heads - first : group;
  const uint64_t r = linear - g * per_group;
  return CtaSlot{static_cast<unsigned>(r / in_group), first + static_cast<unsigned>(r % in_group)};
}
STRIA_DEVICE CtaSlot CtaSlotOf(unsigned group = 0) {
  return CtaSlotAt(blockIdx.x + static_cast<uint64_t>(gridDim.x) * blockIdx.y, gridDim.x, gridDim.y, group);
}

// Keys [k_lo, k_hi) that some query of [i0, i1) may see.
template <bool kDocs = true>
STRIA_HD void KeyRange(const MaskArgs& m, int64_t i0, int64_t i1, int64_t* k_lo, int64_t* k_hi) {
  i0 = MaxI(i0, m.q_begin);
  i1 = MinI(i1, m.q_end);
  *k_lo = m.k_begin;
  *k_hi = i0 >= i1 ? m.k_begin : (m.diagonal ? MinI(m.k_end, i1 - 1 + m.offset + 1) : m.k_end);
  if constexpr (kDocs) {
    if (m.doc_lo != nullptr && i0 < i1) {  // the first row's document starts first, the last's ends last
      *k_lo = MaxI(*k_lo, m.doc_lo[i0]);
      *k_hi = MinI(*k_hi, m.doc_hi[i1 - 1]);
    }
  }
  if (*k_hi < *k_lo) *k_hi = *k_lo;
}

// Queries [q_lo, q_hi) that may see some key of [j0, j1).
template <bool kDocs = true>
STRIA_HD void QueryRange(const MaskArgs& m, int64_t j0, int64_t j1, int64_t* q_lo, int64_t* q_hi) {
  j0 = MaxI(j0, m.k_begin);
  j1 = MinI(j1, m.k_end);
  *q_hi = m.q_end;
  *q_lo = j0 >= j1 ? m.q_end : (m.diagonal ? MaxI(m.q_begin, j0 - m.offset) : m.q_begin);
  if constexpr (kDocs) {
    if (m.doc_lo != nullptr && *q_lo < *q_hi) {
      // Rows whose document meets [j0, j1): doc_hi > j0 (from the first such row) and doc_lo < j1.
      *q_lo = FirstAbove(m.doc_hi, *q_lo, *q_hi, j0);
      *q_hi = FirstAbove(m.doc_lo, *q_lo, *q_hi, j1 - 1);
    }
  }
  if (*q_lo > *q_hi) *q_lo = *q_hi;
}

// The tiles of `size` a CTA walks: `count` of them from `first`, aligned to multiples of `size`.
struct TileRun {
  int64_t first;
  int count;
};
// The tiles of `size` that hold [lo, hi) (none when it is empty).
STRIA_HD TileRun TilesCovering(int64_t lo, int64_t hi, int size) {
  if (lo >= hi) return TileRun{lo, 0};
  const int64_t first = (lo / size) * size;
  return TileRun{first, static_cast<int>((hi - first + size - 1) / size)};
}
// A forward CTA with query rows [i0, i1): the key tiles holding keys some row may see.
template <bool kDocs = true>
STRIA_HD TileRun KeyTilesOf(const MaskArgs& m, int64_t i0, int64_t i1, int size) {
  int64_t lo, hi;
  KeyRange<kDocs>(m, i0, i1, &lo, &hi);
  return TilesCovering(lo, hi, size);
}
// A backward CTA with keys [j0, j1): the query tiles holding rows that may see some key.
template <bool kDocs = true>
STRIA_HD TileRun QueryTilesOf(const MaskArgs& m, int64_t j0, int64_t j1, int size) {
  int64_t lo, hi;
  QueryRange<kDocs>(m, j0, j1, &lo, &hi);
  return TilesCovering(lo, hi, size);
}

// True when every pair of [i0, i1) x [j0, j1) is visible, so the tile skips the element mask.
template <bool kDocs = true>
STRIA_HD bool FullyVisible(const MaskArgs& m, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  if (i0 < m.q_begin || i1 > m.q_end || j0 < m.k_begin || j1 > m.k_end) return false;
  if constexpr (kDocs) {
    if (m.doc_lo != nullptr && (m.doc_lo[i1 - 1] > j0 || m.doc_hi[i0] < j1)) return false;
  }
  return !m.diagonal || j1 - 1 <= i0 + m.offset;
}

}  // namespace cuda
}  // namespace stria
