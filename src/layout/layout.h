// Token layouts (DESIGN.md, normative): where each rank's local tokens sit in the global
// sequence, and which local keys of rank k each local query of rank r may see.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace stria {

const char* LayoutName(stria_layout_t layout);
// seq_len / world_size divisibility (2·N for zigzag), ranges of rank and world size.
Status CheckLayout(stria_layout_t layout, int64_t seq_len, int world_size, int rank);
// Global position of local token i on `rank`; L = seq_len / world_size.
int64_t GlobalPosition(stria_layout_t layout, int64_t local_len, int world_size, int rank, int64_t i);

// How many local tokens of `rank` sit at global positions below `pos`. Every layout orders a
// rank's local tokens by global position, so this is also the local index of the first of them
// at or after `pos`: the local tokens in [p0, p1) are [LocalCountBelow(p0), LocalCountBelow(p1)).
int64_t LocalCountBelow(stria_layout_t layout, int64_t local_len, int world_size, int rank, int64_t pos);

// The visible pairs between local queries of rank r and local keys of rank k, as one rectangle
// of local indices, optionally cut by a diagonal: query i sees key j iff
//   q_begin <= i < q_end, k_begin <= j < k_end, and (!diagonal || j <= i + offset).
// Every layout's causal mask has this shape, so one kernel with a diagonal offset serves all.
struct BlockMask {
  int64_t q_begin = 0, q_end = 0;
  int64_t k_begin = 0, k_end = 0;
  bool diagonal = false;
  int64_t offset = 0;
  // Document masks (layout/documents.h): when doc_lo is set, query i also needs
  // doc_lo[i] <= j < doc_hi[i], the local keys of its own document. Both bounds never decrease
  // with i. The arrays are one batch row's; the row b + 1's follow doc_batch_stride later.
  const int64_t* doc_lo = nullptr;
  const int64_t* doc_hi = nullptr;
  int64_t doc_batch_stride = 0;

  bool empty() const;
  bool visible(int64_t i, int64_t j) const {
    return i >= q_begin && i < q_end && j >= k_begin && j < k_end && (!diagonal || j <= i + offset) &&
           (doc_lo == nullptr || (j >= doc_lo[i] && j < doc_hi[i]));
  }
  // The mask of batch row b (the same mask when it has no documents).
  BlockMask ForBatch(int64_t b) const {
    BlockMask m = *this;
    if (doc_lo != nullptr) {
      m.doc_lo += b * doc_batch_stride;
      m.doc_hi += b * doc_batch_stride;
    }
    return m;
  }
};

BlockMask ClassifyBlock(stria_layout_t layout, bool causal, int world_size, int64_t local_len, int q_rank, int k_rank);

}  // namespace stria
