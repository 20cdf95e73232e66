// Where a sharded KV cache keeps each cached position (stria.h, stria_kv_cache_t): the layouts of
// the training calls, read for a cache that grows. A rank's slots of one sequence form at most two
// runs, each mapping consecutive slots to positions a fixed stride apart.
#pragma once

#include <cstdint>

#include "stria/stria.h"

namespace stria {

struct CacheRun {
  int64_t slot0 = 0, count = 0;  // slots [slot0, slot0 + count)
  int64_t pos0 = 0, pos_stride = 1;
};

// The rank and slot of cached position `pos` (>= 0) with per-rank capacity `capacity`; false if it
// does not fit (pos >= world_size * capacity).
bool CacheSlot(stria_layout_t layout, int world_size, int64_t capacity, int64_t pos, int* rank, int64_t* slot);

// Rank `rank`'s runs holding positions [first, len) (len <= world_size * capacity): writes up to
// two into runs[] (in slot order, none empty) and returns how many. A window's calls start at the
// first position any query sees (its keys before are neither read, nor sent, nor looked up).
int CacheRuns(stria_layout_t layout, int world_size, int rank, int64_t capacity, int64_t len, CacheRun runs[2],
              int64_t first = 0);

// The first cached position a call's new tokens see, the first of them at position `len`: its
// window's start under a window (window_left >= 0), else 0. What CacheRuns' `first` takes.
inline int64_t FirstSeenPosition(int64_t len, int64_t window_left) {
  return window_left >= 0 ? len - window_left : 0;
}

}  // namespace stria
