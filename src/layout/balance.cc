#include "layout/balance.h"

#include <algorithm>

namespace stria {

namespace {

// a / b rounded down (b != 0), for negative a too (C++ division truncates toward zero).
int64_t FloorDiv(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
int64_t CeilDiv(int64_t a, int64_t b) {
  return -FloorDiv(-a, b);
}

// Width of the run of whole tiles (tile boundaries at multiples of `tile`, the last tile cut at
// `len`) that covers [begin, end); begin < end <= len. Written without begin + tile so that a
// huge tile cannot overflow.
int64_t TileSpan(int64_t begin, int64_t end, int64_t len, int64_t tile) {
  const int64_t first = begin / tile * tile;
  const int64_t last = (end - 1) / tile * tile;
  return last + std::min(tile, len - last) - first;
}

Status CheckBalanceArgs(stria_layout_t layout, int64_t seq_len, int world_size, int64_t tile, const void* out,
                        const char* out_name) {
  if (out == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "balance analysis: %s is NULL", out_name);
  STRIA_RETURN_IF_ERROR(CheckLayout(layout, seq_len, world_size, 0));
  if (world_size > kMaxBalanceWorldSize)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "balance analysis: world_size %d exceeds the supported maximum %d",
                 world_size, kMaxBalanceWorldSize);
  if (tile < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "balance analysis: tile %lld is not positive (1 counts exact pairs)",
                 static_cast<long long>(tile));
  return Status::Ok();
}

// The work of a block depends only on how the key owner k compares with the query owner r:
// DESIGN.md ("The ring", normative) defines every layout's visible set by k < r, k = r, k > r
// alone. So three block works describe the whole ring, and the analysis costs
// O(N) (O(N²) only to fill the per-step table) instead of O(N² · L / tile).
// The masks still come from ClassifyBlock, the one place that knows the layouts.
struct RelationWork {
  double same = 0.0;    // k == r: the step-0 block of every rank
  double past = 0.0;    // k < r: keys from earlier ranks
  double future = 0.0;  // k > r: keys from later ranks
};

RelationWork ComputeRelationWork(stria_layout_t layout, bool causal, int64_t seq_len, int world_size, int64_t tile) {
  const int64_t local_len = seq_len / world_size;
  RelationWork w;
  w.same = BlockWork(ClassifyBlock(layout, causal, world_size, local_len, 0, 0), local_len, tile);
  if (world_size > 1) {
    w.past = BlockWork(ClassifyBlock(layout, causal, world_size, local_len, 1, 0), local_len, tile);
    w.future = BlockWork(ClassifyBlock(layout, causal, world_size, local_len, 0, 1), local_len, tile);
  }
  return w;
}

}  // namespace

double BlockWork(const BlockMask& mask, int64_t local_len, int64_t tile) {
  const int64_t len = local_len, T = tile;
  const int64_t qb = std::max<int64_t>(mask.q_begin, 0), qe = std::min(mask.q_end, len);
  const int64_t kb = std::max<int64_t>(mask.k_begin, 0), ke = std::min(mask.k_end, len);
  if (qb >= qe || kb >= ke) return 0.0;
  // Sums are kept in double: every term is an integer, and the totals stay exact below 2^53
  // (far beyond any real sequence), where int64 products of L x L could overflow first.
  if (!mask.diagonal) {
    // A dense rectangle: every tile it touches is computed whole.
    return static_cast<double>(TileSpan(qb, qe, len, T)) * static_cast<double>(TileSpan(kb, ke, len, T));
  }
  // Under "j <= i + offset" every query row sees a prefix [kb, hi) of the key range, growing with
  // i, so the keys a tile-row touches are the prefix of its last masked row. Tile-row m (rows
  // [mT, mT + T)) costs T x TileSpan(kb, hi(m)); row_work is that, for any m.
  const int64_t offset = mask.offset;
  auto row_work = [&](int64_t m) {
    const int64_t row = m * T, height = std::min(T, len - row);
    const int64_t last_row = std::min(row + height, qe) - 1;
    const int64_t hi = std::min(ke, last_row + offset + 1);
    return hi > kb ? static_cast<double>(height) * static_cast<double>(TileSpan(kb, hi, len, T)) : 0.0;
  };
  const int64_t m_first = qb / T, m_last = (qe - 1) / T;
  double total = row_work(m_last);  // the one tile-row the query range may cut short
  // The others, m in [m_first, m_last), are whole: hi(m) = min(ke, mT + T + offset). By hi they
  // fall into three runs, each summed in closed form, so that the cost does not grow with L
  // (2^40 tokens at exact-pair granularity took half an hour row by row): rows that see no key,
  // rows whose prefix still grows (its last key tile starts at mT + c: an arithmetic series),
  // and rows that see all of [kb, ke) (a constant).
  const int64_t a = m_first, b = m_last;
  if (a < b) {
    const int64_t m_visible = FloorDiv(kb - T - offset, T) + 1;  // first m with hi(m) > kb
    const int64_t m_saturated = CeilDiv(ke - T - offset, T);     // first m with hi(m) >= ke
    const int64_t u0 = std::clamp(m_visible, a, b), u1 = std::clamp(m_saturated, u0, b);
    // Growing rows: TileSpan = last + min(T, len - last) - first, with last = mT + c, linear in m
    // while the last key tile is whole (last + T <= len); at most one row reaches a cut one.
    const int64_t first = kb / T * T, c = FloorDiv(T + offset - 1, T) * T;
    const int64_t l1 = std::clamp(FloorDiv(len - T - c, T) + 1, u0, u1);
    const __int128 count = l1 - u0, sum_m = (static_cast<__int128>(u0) + l1 - 1) * count / 2;
    total += static_cast<double>(T) * (static_cast<double>(T) * static_cast<double>(sum_m) +
                                       static_cast<double>(c + T - first) * static_cast<double>(count));
    for (int64_t m = l1; m < u1; ++m) total += row_work(m);
    total += static_cast<double>(T) * static_cast<double>(TileSpan(kb, ke, len, T)) * static_cast<double>(b - u1);
  }
  return total;
}

Status BalanceSteps(stria_layout_t layout, bool causal, int64_t seq_len, int world_size, int64_t tile, double* work) {
  STRIA_RETURN_IF_ERROR(CheckBalanceArgs(layout, seq_len, world_size, tile, work, "work"));
  const RelationWork w = ComputeRelationWork(layout, causal, seq_len, world_size, tile);
  const int64_t n = world_size;
  for (int64_t s = 0; s < n; ++s) {
    double* row = work + s * n;
    // At step s rank r holds k = (r - s) mod N: k = r at step 0; otherwise k < r exactly when
    // r >= s (no wrap-around), and k > r for the ranks r < s whose index wrapped.
    for (int64_t r = 0; r < n; ++r) row[r] = s == 0 ? w.same : (r >= s ? w.past : w.future);
  }
  return Status::Ok();
}

Status AnalyzeBalance(stria_layout_t layout, bool causal, int64_t seq_len, int world_size, int64_t tile,
                      stria_balance_t* out) {
  STRIA_RETURN_IF_ERROR(CheckBalanceArgs(layout, seq_len, world_size, tile, out, "out"));
  const RelationWork w = ComputeRelationWork(layout, causal, seq_len, world_size, tile);
  const int64_t n = world_size;
  // Step 0: every rank works on its own block. Step s > 0: s ranks hold a later rank's keys
  // and N - s an earlier rank's, so both kinds occur and the step lasts as long as the larger.
  double total = static_cast<double>(n) * w.same, latency = w.same;
  for (int64_t s = 1; s < n; ++s) {
    total += static_cast<double>(s) * w.future + static_cast<double>(n - s) * w.past;
    latency += std::max(w.past, w.future);
  }
  out->total_work = total;
  out->ring_latency = latency;
  // No work at all cannot happen for valid inputs (the diagonal block always has some), but the
  // ratios must not become NaN if it ever did.
  out->speedup = latency > 0.0 ? total / latency : 0.0;
  out->imbalance = total > 0.0 ? latency / (total / static_cast<double>(n)) : 0.0;
  return Status::Ok();
}

double IdealLatency(bool causal, int64_t seq_len, int world_size, int64_t tile) {
  BlockMask all;
  all.q_end = all.k_end = seq_len;
  all.diagonal = causal;
  return BlockWork(all, seq_len, tile) / static_cast<double>(world_size);
}

}  // namespace stria
