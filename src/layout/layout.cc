#include "layout/layout.h"

#include <algorithm>

namespace stria {

const char* LayoutName(stria_layout_t layout) {
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:
      return "contiguous";
    case STRIA_LAYOUT_STRIPED:
      return "striped";
    case STRIA_LAYOUT_ZIGZAG:
      return "zigzag";
  }
  return "unknown";
}

Status CheckLayout(stria_layout_t layout, int64_t seq_len, int world_size, int rank) {
  if (layout != STRIA_LAYOUT_CONTIGUOUS && layout != STRIA_LAYOUT_STRIPED && layout != STRIA_LAYOUT_ZIGZAG)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "unknown layout %d (expected 0 contiguous, 1 striped, 2 zigzag)",
                 static_cast<int>(layout));
  if (world_size < 1) return Error(STRIA_ERROR_INVALID_ARGUMENT, "world_size %d is not positive", world_size);
  if (rank < 0 || rank >= world_size)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "rank %d is out of range for world_size %d", rank, world_size);
  if (seq_len < 1) return Error(STRIA_ERROR_INVALID_ARGUMENT, "seq_len %lld is not positive", (long long)seq_len);
  int64_t unit = layout == STRIA_LAYOUT_ZIGZAG ? 2 * static_cast<int64_t>(world_size) : world_size;
  if (seq_len % unit != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "the %s layout needs seq_len divisible by %lld, got seq_len %lld",
                 LayoutName(layout), (long long)unit, (long long)seq_len);
  return Status::Ok();
}

int64_t GlobalPosition(stria_layout_t layout, int64_t local_len, int world_size, int rank, int64_t i) {
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:
      return rank * local_len + i;
    case STRIA_LAYOUT_STRIPED:
      return i * world_size + rank;
    case STRIA_LAYOUT_ZIGZAG: {
      int64_t c = local_len / 2;
      return i < c ? rank * c + i : (2 * static_cast<int64_t>(world_size) - 1 - rank) * c + (i - c);
    }
  }
  return -1;
}

int64_t LocalCountBelow(stria_layout_t layout, int64_t local_len, int world_size, int rank, int64_t pos) {
  auto clamp = [](int64_t x, int64_t hi) { return std::min(std::max<int64_t>(x, 0), hi); };
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:
      return clamp(pos - rank * local_len, local_len);
    case STRIA_LAYOUT_STRIPED:
      // Local token i sits at i·N + rank < pos  <=>  i < (pos - rank) / N, rounded up.
      return pos <= rank ? 0 : clamp((pos - rank + world_size - 1) / world_size, local_len);
    case STRIA_LAYOUT_ZIGZAG: {
      // The early chunk [rank·C, rank·C + C), then the late one, which lies after it.
      const int64_t c = local_len / 2;
      const int64_t late = (2 * static_cast<int64_t>(world_size) - 1 - rank) * c;
      return clamp(pos - rank * c, c) + clamp(pos - late, c);
    }
  }
  return 0;
}

bool BlockMask::empty() const {
  if (q_begin >= q_end || k_begin >= k_end) return true;
  // The last query sees the most keys under a diagonal.
  return diagonal && q_end - 1 + offset < k_begin;
}

BlockMask ClassifyBlock(stria_layout_t layout, bool causal, int world_size, int64_t local_len, int q_rank, int k_rank) {
  BlockMask m;
  m.q_end = local_len;
  m.k_end = local_len;
  if (!causal) return m;
  const int r = q_rank, k = k_rank;
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:
      if (k == r) {
        m.diagonal = true;
      } else if (k > r) {
        m.q_end = 0;  // the whole block lies in the future
      }
      break;
    case STRIA_LAYOUT_STRIPED:
      // Key j of rank k sits at j·N + k; query i of rank r at i·N + r. k <= r: j <= i; k > r: j < i.
      m.diagonal = true;
      m.offset = k <= r ? 0 : -1;
      break;
    case STRIA_LAYOUT_ZIGZAG: {
      const int64_t half = local_len / 2;
      if (k == r) {
        m.diagonal = true;
      } else if (k < r) {
        m.k_end = half;  // every query sees rank k's early chunk, none of its late one
      } else {
        m.q_begin = half;  // only r's late chunk sees rank k, and all of it
      }
      break;
    }
  }
  (void)world_size;
  return m;
}

}  // namespace stria
