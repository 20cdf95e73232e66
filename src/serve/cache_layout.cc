#include "serve/cache_layout.h"

#include <algorithm>

namespace stria {

bool CacheSlot(stria_layout_t layout, int world_size, int64_t capacity, int64_t pos, int* rank, int64_t* slot) {
  const int64_t n = world_size;
  if (pos < 0 || capacity <= 0 || pos >= n * capacity) return false;
  switch (layout) {
    case STRIA_LAYOUT_STRIPED:
      *rank = static_cast<int>(pos % n);
      *slot = pos / n;
      return true;
    case STRIA_LAYOUT_CONTIGUOUS:
      *rank = static_cast<int>(pos / capacity);
      *slot = pos % capacity;
      return true;
    case STRIA_LAYOUT_ZIGZAG: {
      const int64_t half = capacity / 2, chunk = pos / half;
      *rank = static_cast<int>(chunk < n ? chunk : 2 * n - 1 - chunk);
      *slot = (chunk < n ? 0 : half) + pos % half;
      return true;
    }
  }
  return false;
}

int CacheRuns(stria_layout_t layout, int world_size, int rank, int64_t capacity, int64_t len, CacheRun runs[2],
              int64_t first) {
  const int64_t n = world_size, r = rank;
  int count = 0;
  auto add = [&](int64_t slot0, int64_t pos0, int64_t pos_stride, int64_t keys) {
    // A run's positions grow with its slots: it starts at its first at or past `first`.
    const int64_t skip = first > pos0 ? std::min(keys, (first - pos0 + pos_stride - 1) / pos_stride) : 0;
    if (keys > skip) runs[count++] = CacheRun{slot0 + skip, keys - skip, pos0 + skip * pos_stride, pos_stride};
  };
  switch (layout) {
    case STRIA_LAYOUT_STRIPED:
      add(0, r, n, len > r ? (len - r + n - 1) / n : 0);
      break;
    case STRIA_LAYOUT_CONTIGUOUS:
      add(0, r * capacity, 1, std::clamp<int64_t>(len - r * capacity, 0, capacity));
      break;
    case STRIA_LAYOUT_ZIGZAG: {
      const int64_t half = capacity / 2;
      add(0, r * half, 1, std::clamp<int64_t>(len - r * half, 0, half));
      const int64_t back = (2 * n - 1 - r) * half;
      add(half, back, 1, std::clamp<int64_t>(len - back, 0, half));
      break;
    }
  }
  return count;
}

}  // namespace stria
