#include "layout/documents.h"

#include <algorithm>

namespace stria {

Status Documents::CheckCount(const int64_t* cu_seqlens, int64_t num_seqs, int64_t seq_len) {
  // No more documents than tokens: a bound on the copies of the boundaries, and on nonsense.
  if (num_seqs < 1 || num_seqs > seq_len)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "num_seqs %lld must be in 1..S (documents per batch row; S = L * world_size = %lld)",
                 static_cast<long long>(num_seqs), static_cast<long long>(seq_len));
  if (cu_seqlens == nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "cu_seqlens is NULL (num_seqs %lld)", static_cast<long long>(num_seqs));
  return Status::Ok();
}

Status Documents::Set(const int64_t* cu_seqlens, int64_t num_seqs, int64_t batch, int64_t seq_len) {
  num_seqs_ = 0;
  cu_.clear();
  STRIA_RETURN_IF_ERROR(CheckCount(cu_seqlens, num_seqs, seq_len));
  const int64_t row = num_seqs + 1;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* cu = cu_seqlens + b * row;
    if (cu[0] != 0)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "cu_seqlens row %lld starts at %lld, not 0", static_cast<long long>(b),
                   static_cast<long long>(cu[0]));
    for (int64_t d = 0; d < num_seqs; ++d) {
      if (cu[d + 1] < cu[d])
        return Error(STRIA_ERROR_INVALID_ARGUMENT,
                     "cu_seqlens row %lld decreases at entry %lld (%lld after %lld): boundaries must never "
                     "decrease",
                     static_cast<long long>(b), static_cast<long long>(d + 1), static_cast<long long>(cu[d + 1]),
                     static_cast<long long>(cu[d]));
    }
    if (cu[num_seqs] != seq_len)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "cu_seqlens row %lld ends at %lld, not at the sequence length S = L * world_size = %lld",
                   static_cast<long long>(b), static_cast<long long>(cu[num_seqs]), static_cast<long long>(seq_len));
  }
  cu_.assign(cu_seqlens, cu_seqlens + batch * row);
  num_seqs_ = num_seqs;
  batch_ = batch;
  return Status::Ok();
}

Status Documents::SetWindow(int64_t left, int64_t right, int64_t batch, int64_t seq_len) {
  window_left_ = window_right_ = -1;
  if (left < -1 || right < -1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "window_left %lld and window_right %lld must be >= 0 (keys that far before and after the query), "
                 "or -1 (unbounded)",
                 static_cast<long long>(left), static_cast<long long>(right));
  // A side at least as long as the sequence cuts nothing: unbounded (the plain call's path and
  // numbers, and p +- w cannot overflow).
  if (left >= seq_len - 1) left = -1;
  if (right >= seq_len - 1) right = -1;
  if (left == -1 && right == -1) return Status::Ok();
  if (!active()) {  // one document a row
    cu_.clear();
    for (int64_t b = 0; b < batch; ++b) cu_.insert(cu_.end(), {0, seq_len});
    num_seqs_ = 1;
    batch_ = batch;
  }
  window_left_ = left;
  window_right_ = right;
  return Status::Ok();
}

uint64_t Documents::Hash() const {
  if (!active()) return 0;
  uint64_t h = 1469598103934665603ull;  // FNV-1a over num_seqs and the boundaries' bytes
  auto mix = [&h](int64_t x) {
    for (int byte = 0; byte < 8; ++byte) {
      h ^= static_cast<uint64_t>(x >> (8 * byte)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  mix(num_seqs_);
  for (int64_t x : cu_) mix(x);
  if (window_left_ != -1 || window_right_ != -1) {
    mix(window_left_);
    mix(window_right_);
  }
  return h == 0 ? 1 : h;
}

void Documents::Apply(stria_layout_t layout, int world_size, int64_t local_len, int q_rank, int k_rank, Bounds* bounds,
                      BlockMask* mask) const {
  if (!active()) return;
  const size_t n = static_cast<size_t>(batch_ * local_len);
  bounds->lo.resize(n);
  bounds->hi.resize(n);
  int64_t k_lo = local_len, k_hi = 0;
  const int64_t row = num_seqs_ + 1;
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t* cu = cu_.data() + b * row;
    int64_t* lo = bounds->lo.data() + b * local_len;
    int64_t* hi = bounds->hi.data() + b * local_len;
    int64_t d = 0;  // the document of the current query: positions grow with i, so d only moves on
    for (int64_t i = 0; i < local_len; ++i) {
      const int64_t p = GlobalPosition(layout, local_len, world_size, q_rank, i);
      while (cu[d + 1] <= p) ++d;
      // Both ends grow with p: the document's, and the window's.
      const int64_t first = window_left_ < 0 ? cu[d] : std::max(cu[d], p - window_left_);
      const int64_t end = window_right_ < 0 ? cu[d + 1] : std::min(cu[d + 1], p + window_right_ + 1);
      lo[i] = LocalCountBelow(layout, local_len, world_size, k_rank, first);
      hi[i] = LocalCountBelow(layout, local_len, world_size, k_rank, end);
    }
    // The bounds never decrease, so the mask's first query has the lowest and its last the highest.
    if (mask->q_begin < mask->q_end) {
      k_lo = std::min(k_lo, lo[mask->q_begin]);
      k_hi = std::max(k_hi, hi[mask->q_end - 1]);
    }
  }
  mask->doc_lo = bounds->lo.data();
  mask->doc_hi = bounds->hi.data();
  mask->doc_batch_stride = local_len;
  mask->k_begin = std::max(mask->k_begin, k_lo);
  mask->k_end = std::min(mask->k_end, k_hi);
}

bool Documents::Reaches(stria_layout_t layout, int world_size, int64_t local_len, int q_rank, int k_rank,
                        const BlockMask& mask) const {
  if (mask.empty()) return false;
  if (!active()) return true;
  // Every query's visible keys lie between the first query's bounds' start and the last one's end.
  const int64_t first = GlobalPosition(layout, local_len, world_size, q_rank, mask.q_begin);
  const int64_t last = GlobalPosition(layout, local_len, world_size, q_rank, mask.q_end - 1);
  const int64_t row = num_seqs_ + 1;
  int64_t k_lo = local_len, k_hi = 0;  // over the batch rows
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t* cu = cu_.data() + b * row;
    // The document of a position: the last boundary at or before it (S, the row's end, lies beyond).
    auto document = [&](int64_t p) { return std::upper_bound(cu, cu + row, p) - cu - 1; };
    int64_t start = cu[document(first)], end = cu[document(last) + 1];
    if (window_left_ >= 0) start = std::max(start, first - window_left_);
    if (window_right_ >= 0) end = std::min(end, last + window_right_ + 1);
    k_lo = std::min(k_lo, LocalCountBelow(layout, local_len, world_size, k_rank, start));
    k_hi = std::max(k_hi, LocalCountBelow(layout, local_len, world_size, k_rank, end));
  }
  BlockMask reach = mask;
  reach.k_begin = std::max(reach.k_begin, k_lo);
  reach.k_end = std::min(reach.k_end, k_hi);
  return !reach.empty();
}

}  // namespace stria
