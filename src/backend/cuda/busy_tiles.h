// The query tiles of a document block that have work, for a forward launch that takes those alone
// (cuda::MaskArgs::tiles): for the backend and for the benchmark that times the block kernels.
//
// Under a document plan most of a rank's query tiles see nothing in most blocks (its kept
// documents' rows see only their own rank's keys), yet a launch over every tile gives each of them
// a CTA that starts, finds no key and exits, and under the causal order (later tiles first) those
// idle CTAs run before the plan's split documents, whose rows come first. The list holds the tiles
// in which some row has a nonempty document interval, by the key tiles the kernels will walk,
// longest first.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "layout/layout.h"

namespace stria {

// Tiles of `rows` rows of [0, L) (batch rows B of `m.doc_batch_stride`), indexed from 0 as the
// kernels index them (QueryTileStart). A superset of the tiles a kernel would find work in: a row
// with a nonempty interval in a tile whose rectangle or diagonal hides it only costs its CTA, and
// a tile none of whose rows sees a key contributes nothing to the running state, in any kernel.
inline void BusyQueryTiles(const BlockMask& m, int64_t B, int64_t L, int rows, std::vector<int32_t>* tiles) {
  tiles->clear();
  struct Work {
    int32_t tile;
    int64_t keys;
  };
  std::vector<Work> busy;
  const int64_t first = std::max<int64_t>(m.q_begin, 0), last = std::min(m.q_end, L);
  for (int64_t i0 = (first / rows) * rows; i0 < last; i0 += rows) {
    const int64_t lo_row = std::max(i0, first), hi_row = std::min(i0 + rows, last);
    int64_t keys = -1;  // the widest span of keys a batch row's tile walks; -1: no row sees one
    for (int64_t b = 0; b < B; ++b) {
      const int64_t* lo = m.doc_lo + b * m.doc_batch_stride;
      const int64_t* hi = m.doc_hi + b * m.doc_batch_stride;
      for (int64_t i = lo_row; i < hi_row; ++i)
        if (hi[i] > lo[i]) {
          keys = std::max(keys, hi[hi_row - 1] - lo[lo_row]);
          break;
        }
    }
    if (keys >= 0) busy.push_back(Work{static_cast<int32_t>(i0 / rows), keys});
  }
  // Longest first; among equals the later tile first, the order of a launch over every tile.
  std::stable_sort(busy.begin(), busy.end(),
                   [](const Work& a, const Work& b) { return a.keys != b.keys ? a.keys > b.keys : a.tile > b.tile; });
  tiles->reserve(busy.size());
  for (const Work& w : busy) tiles->push_back(w.tile);
}

}  // namespace stria
