// What every backend's decode shares: the split of a rank's keys into work items (flash-decoding's
// split, so that one long sequence still spreads over every thread or SM) and the exact merge of
// the ranks' partial records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/backend.h"

namespace stria {

// Keys [j0, j0 + count) of work.segments[seg].
struct DecodeKeyPiece {
  int64_t seg, j0, count;
};
// Pieces [first, last) of sequence b: a work item (one per K/V head in a kernel).
struct DecodeWorkItem {
  int64_t b, first, last;
};

// Work items of about `target` keys each: long segments are cut, short ones (the pages of a paged
// cache) joined, never across sequences. Items come sequence by sequence, in key order.
void PlanDecodeItems(const DecodeWork& w, int64_t target, std::vector<DecodeKeyPiece>* pieces,
                     std::vector<DecodeWorkItem>* items);

// The keys a rank holds for a call.
int64_t DecodeKeyCount(const DecodeWork& w);

// Record `at` (the floats of (b, t, h) in DecodePartialFloats's layout) of every rank, `stride`
// floats apart in `all`, merged in rank order and in double, so every rank gets the same bits:
// out[D] the merged output, the return value its natural-log LSE. `sink` (nullptr: none) joins
// the denominator once: lse' = log(e^lse + e^z), out *= e^(lse - lse'); a row that saw no key gets
// out 0 and LSE z (-inf without a sink). A NaN anywhere reaches the row.
double MergeDecodeRecord(const float* all, size_t stride, int world_size, int64_t D, size_t at, const double* sink,
                         float* out);

}  // namespace stria
