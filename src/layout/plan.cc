#include "layout/plan.h"

#include <algorithm>

#include "layout/documents.h"

namespace stria {
namespace {

// Tokens of `run` at positions below x.
int64_t CountBelow(const Plan::Run& run, int64_t x) {
  if (x <= run.first) return 0;
  return std::min(run.count, (x - run.first + run.stride - 1) / run.stride);
}

// The local slot of the first token at or after position x among the runs [begin, end) of one
// document on one rank (sorted by position, on consecutive slots but for padding after the last).
int64_t SlotOf(const Plan::Run* begin, const Plan::Run* end, int64_t x) {
  const Plan::Run* run =
      std::partition_point(begin, end, [x](const Plan::Run& r) { return r.first + (r.count - 1) * r.stride < x; });
  if (run == end) return end[-1].local_begin + end[-1].count;
  return run->local_begin + CountBelow(*run, x);
}

// The key runs of `run`'s document among a rank's runs `kr`, both in (segment, document) order:
// [*k0, the returned end), *k0 first moved past the earlier documents (a walk along the query runs
// passes each key run once).
size_t KeyRunsOf(const std::vector<Plan::Run>& kr, const Plan::Run& run, size_t* k0) {
  auto before = [&run](const Plan::Run& k) {
    return k.segment < run.segment || (k.segment == run.segment && k.doc < run.doc);
  };
  while (*k0 < kr.size() && before(kr[*k0])) ++*k0;
  size_t k1 = *k0;
  while (k1 < kr.size() && kr[k1].segment == run.segment && kr[k1].doc == run.doc) ++k1;
  return k1;
}

// The positions [start, end) a query at position p of the document [a, b) may see.
void VisibleRange(int64_t p, int64_t a, int64_t b, const MaskSpec& mask, int64_t* start, int64_t* end) {
  *start = mask.window_left >= 0 ? std::max(a, p - mask.window_left) : a;
  *end = mask.causal ? p + 1 : (mask.window_right >= 0 ? std::min(b, p + mask.window_right + 1) : b);
}

}  // namespace

Status Plan::Create(const int64_t* cu_seqlens, int64_t batch, int64_t num_seqs, int64_t seq_len, const Options& options,
                    std::unique_ptr<Plan>* out) {
  out->reset();
  if (options.world_size < 1 || options.world_size > kMaxPlanWorldSize)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan: world_size %d is out of range 1..%d", options.world_size,
                 kMaxPlanWorldSize);
  if (options.tile < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan: tile %lld is not positive (the tile size of the kernels)",
                 static_cast<long long>(options.tile));
  if (options.mask.window_left < -1 || options.mask.window_right < -1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan: window_left %lld and window_right %lld must be >= 0 or -1",
                 static_cast<long long>(options.mask.window_left), static_cast<long long>(options.mask.window_right));
  if (batch < 1 || batch > (int64_t{1} << 24))
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan: batch %lld is out of range 1..2^24",
                 static_cast<long long>(batch));
  if (seq_len < 1) return Error(STRIA_ERROR_INVALID_ARGUMENT, "plan: seq_len %lld is not positive", (long long)seq_len);
  if (options.strategy == Strategy::kLayout)
    STRIA_RETURN_IF_ERROR(CheckLayout(options.layout, seq_len, options.world_size, 0));
  // The same checks as a _documents call's boundaries, with the same messages.
  Documents check;
  STRIA_RETURN_IF_ERROR(check.Set(cu_seqlens, num_seqs, batch, seq_len));

  std::unique_ptr<Plan> plan(new Plan());
  plan->options_ = options;
  plan->batch_ = batch;
  plan->num_seqs_ = num_seqs;
  plan->seq_len_ = seq_len;
  plan->cu_.assign(cu_seqlens, cu_seqlens + batch * (num_seqs + 1));
  plan->runs_.resize(static_cast<size_t>(batch * options.world_size));
  if (options.strategy == Strategy::kLayout) {
    plan->BuildFromLayout();
  } else {
    plan->BuildBalanced();
  }
  STRIA_RETURN_IF_ERROR(plan->Finish());
  plan->hash_ = plan->ComputeHash();
  *out = std::move(plan);
  return Status::Ok();
}

void Plan::BuildFromLayout() {
  const int n = options_.world_size;
  const int64_t L = seq_len_ / n, row = num_seqs_ + 1;  // CheckLayout: S divides
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t* cu = cu_.data() + b * row;
    for (int r = 0; r < n; ++r) {
      std::vector<Run>& out = runs_[static_cast<size_t>(b * n + r)];
      // The rank's positions as arithmetic progressions in sequence order (the layout's local
      // order), cut at the document boundaries.
      struct Span {
        int64_t first, stride, count;
      };
      std::vector<Span> spans;
      switch (options_.layout) {
        case STRIA_LAYOUT_CONTIGUOUS:
          spans.push_back({r * L, 1, L});
          break;
        case STRIA_LAYOUT_STRIPED:
          spans.push_back({r, n, L});
          break;
        case STRIA_LAYOUT_ZIGZAG: {
          const int64_t c = L / 2;
          spans.push_back({r * c, 1, c});
          spans.push_back({(2 * int64_t{n} - 1 - r) * c, 1, c});
          break;
        }
      }
      for (const Span& sp : spans) {
        const int64_t last = sp.first + (sp.count - 1) * sp.stride;
        // The documents the span meets: from the one holding its first position to its last's.
        int64_t d = std::upper_bound(cu, cu + row, sp.first) - cu - 1;
        for (; d < num_seqs_ && cu[d] <= last; ++d) {
          if (cu[d + 1] <= cu[d]) continue;
          Run run{d, 0, 0, sp.stride, 0, 0};
          const Run whole{d, 0, sp.first, sp.stride, sp.count, 0};
          const int64_t below_a = CountBelow(whole, cu[d]), below_b = CountBelow(whole, cu[d + 1]);
          if (below_b <= below_a) continue;
          run.first = sp.first + below_a * sp.stride;
          run.count = below_b - below_a;
          out.push_back(run);
        }
      }
    }
  }
}

void Plan::BuildBalanced() {
  const int n = options_.world_size;
  const int64_t row = num_seqs_ + 1;
  std::vector<std::vector<Run>> per_rank;
  for (int64_t b = 0; b < batch_; ++b) {
    SolvePlan(cu_.data() + b * row, num_seqs_, seq_len_, n, options_.tile, options_.mask, options_.local_len,
              &per_rank);
    for (int r = 0; r < n; ++r) runs_[static_cast<size_t>(b * n + r)] = std::move(per_rank[static_cast<size_t>(r)]);
  }
}

Status Plan::Finish() {
  local_len_ = (seq_len_ + options_.world_size - 1) / options_.world_size;
  int64_t needed = 0;
  for (auto& rank_runs : runs_) {
    int64_t slot = 0;
    for (Run& run : rank_runs) {
      run.local_begin = slot;
      slot += run.count + run.pad_after;
    }
    needed = std::max(needed, slot);
  }
  if (options_.local_len > 0 && options_.local_len < needed)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "plan: local_len %lld is too small: these documents need %lld slots on some rank (0: as many as "
                 "needed)",
                 static_cast<long long>(options_.local_len), static_cast<long long>(needed));
  local_len_ = std::max({local_len_, needed, options_.local_len});
  return Status::Ok();
}

uint64_t Plan::ComputeHash() const {
  // A word at a time (the boundaries of a million-token batch are tens of thousands of words):
  // multiply and fold, the finaliser of splitmix64 on each step. The boundaries go through four
  // independent lanes, folded at the end: one lane's chain of multiplies would be most of the cost.
  auto step = [](uint64_t h, int64_t x) {
    h ^= static_cast<uint64_t>(x) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
    return h ^ (h >> 31);
  };
  uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h, &step](int64_t x) { h = step(h, x); };
  mix(options_.world_size);
  mix(options_.tile);
  mix(options_.mask.causal ? 1 : 0);
  mix(options_.mask.window_left);
  mix(options_.mask.window_right);
  mix(static_cast<int64_t>(options_.strategy));
  mix(static_cast<int64_t>(options_.layout));
  mix(options_.local_len);
  mix(batch_);
  mix(num_seqs_);
  mix(seq_len_);
  uint64_t lane[4] = {1, 2, 3, 4};
  const size_t n = cu_.size();
  size_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int l = 0; l < 4; ++l) lane[l] = step(lane[l], cu_[i + static_cast<size_t>(l)]);
  for (; i < n; ++i) lane[0] = step(lane[0], cu_[i]);
  for (uint64_t x : lane) mix(static_cast<int64_t>(x));
  return h == 0 ? 1 : h;
}

bool Plan::SameBoundaries(const int64_t* cu_seqlens, int64_t batch, int64_t num_seqs) const {
  if (batch != batch_ || num_seqs != num_seqs_) return false;
  return std::equal(cu_.begin(), cu_.end(), cu_seqlens);
}

int64_t Plan::count(int64_t b, int rank) const {
  int64_t n = 0;
  for (const Run& run : runs(b, rank)) n += run.count;
  return n;
}

int64_t Plan::used(int64_t b, int rank) const {
  const std::vector<Run>& r = runs(b, rank);
  return r.empty() ? 0 : r.back().local_begin + r.back().count + r.back().pad_after;
}

int64_t Plan::HomeBegin(int rank, int64_t align) const {
  auto round_up = [align](int64_t x) { return (x + align - 1) / align * align; };
  // Past every shared document's slots, on a multiple of `align`: segment 0, and the pieces of a
  // document that no rank had room for whole, which the solver cuts across ranks inside segment 1
  // (a run shorter than its document)...
  int64_t h = 0;
  for (int64_t b = 0; b < batch_; ++b) {
    const int64_t* cu = cu_.data() + b * (num_seqs_ + 1);
    for (const Run& run : runs(b, rank))
      if (run.segment == 0 || run.count < cu[run.doc + 1] - cu[run.doc])
        h = std::max(h, run.local_begin + run.count + run.pad_after);
  }
  h = round_up(h);
  // ...and past every kept document that would cross it. Moving h on can make it cross another
  // batch row's document, hence the repetition (each pass only moves it on).
  for (bool moved = true; moved && h < local_len_;) {
    moved = false;
    for (int64_t b = 0; b < batch_; ++b)
      for (const Run& run : runs(b, rank))
        if (run.local_begin < h && h < run.local_begin + run.count) {
          h = round_up(run.local_begin + run.count);
          moved = true;
        }
  }
  if (h >= local_len_) return local_len_;
  for (int64_t b = 0; b < batch_; ++b)
    for (const Run& run : runs(b, rank))
      if (run.count > 0 && run.local_begin >= h) return h;  // a kept token past it
  return local_len_;
}

void Plan::Positions(int64_t b, int rank, int64_t* positions) const {
  int64_t i = 0;
  for (const Run& run : runs(b, rank)) {
    for (int64_t j = 0; j < run.count; ++j) positions[i++] = run.first + j * run.stride;
    for (int64_t j = 0; j < run.pad_after; ++j) positions[i++] = -1;
  }
  std::fill(positions + i, positions + local_len_, int64_t{-1});
}

bool Plan::Bounds(int64_t b, int q_rank, int k_rank, const MaskSpec& mask, int64_t* lo, int64_t* hi) const {
  const std::vector<Run>& qr = runs(b, q_rank);
  const std::vector<Run>& kr = runs(b, k_rank);
  const int64_t* cu = cu_.data() + b * (num_seqs_ + 1);
  // Both ranks' runs are in (segment, document) order: one walk pairs each query run with the key
  // runs of its document. A query with no visible key gets the empty interval at `top`, the highest
  // end so far, which keeps both bounds non-decreasing (later documents' keys lie after it).
  int64_t top = 0, extent = 0, i = 0;
  size_t k0 = 0;
  for (const Run& run : qr) {
    const size_t k1 = KeyRunsOf(kr, run, &k0);
    if (k1 == k0) {
      std::fill(lo + i, lo + i + run.count + run.pad_after, top);
      std::fill(hi + i, hi + i + run.count + run.pad_after, top);
      i += run.count + run.pad_after;
      continue;
    }
    const Run* keys = kr.data() + k0;
    const Run* keys_end = kr.data() + k1;
    const int64_t a = cu[run.doc], e = cu[run.doc + 1];
    for (int64_t j = 0; j < run.count; ++j, ++i) {
      int64_t start, end;
      VisibleRange(run.first + j * run.stride, a, e, mask, &start, &end);
      const int64_t l = SlotOf(keys, keys_end, start);
      const int64_t h = std::max(l, SlotOf(keys, keys_end, end));
      lo[i] = l;
      hi[i] = h;
      if (h > l) extent = std::max(extent, h);
      top = std::max(top, h);
    }
    std::fill(lo + i, lo + i + run.pad_after, top);
    std::fill(hi + i, hi + i + run.pad_after, top);
    i += run.pad_after;
  }
  std::fill(lo + i, lo + local_len_, top);
  std::fill(hi + i, hi + local_len_, top);
  // An empty interval may sit past every key some query sees (a causal cut or a window inside a
  // key run), in rows that a trimmed message never carries (KeyExtent). The kernels take a tile
  // whose span meets any row's interval, empty or not, and would read those rows; whatever a
  // receive buffer holds there (another call's bytes, NaN among them) times a probability of 0 is
  // not 0. Clamped to the extent, the empty intervals keep both bounds non-decreasing and lead no
  // kernel past the last visible key.
  for (int64_t x = 0; x < local_len_; ++x) {
    lo[x] = std::min(lo[x], extent);
    hi[x] = std::min(hi[x], extent);
  }
  return extent > 0;
}

bool Plan::Reaches(int q_rank, int k_rank, const MaskSpec& mask) const {
  std::vector<int64_t> lo, hi;
  for (int64_t b = 0; b < batch_; ++b) {
    // Only a document with runs on both ranks can join them: a walk over the runs (both in
    // (segment, document) order) finds one, or rules the pair out without the O(L) bounds (a plan
    // that keeps every document whole rules out every pair but a rank's own).
    const std::vector<Run>& qr = runs(b, q_rank);
    const std::vector<Run>& kr = runs(b, k_rank);
    bool shared = false;
    for (size_t x = 0, y = 0; x < qr.size() && y < kr.size() && !shared;) {
      if (qr[x].segment == kr[y].segment && qr[x].doc == kr[y].doc) {
        shared = true;
      } else if (qr[x].segment < kr[y].segment || (qr[x].segment == kr[y].segment && qr[x].doc < kr[y].doc)) {
        ++x;
      } else {
        ++y;
      }
    }
    if (!shared) continue;
    lo.resize(static_cast<size_t>(local_len_));
    hi.resize(static_cast<size_t>(local_len_));
    if (Bounds(b, q_rank, k_rank, mask, lo.data(), hi.data())) return true;
  }
  return false;
}

int Plan::RingSteps(const MaskSpec& mask) const {
  {
    std::lock_guard<std::mutex> lock(steps_mu_);
    for (const StepsEntry& e : steps_)
      if (e.mask.causal == mask.causal && e.mask.window_left == mask.window_left &&
          e.mask.window_right == mask.window_right)
        return e.steps;
  }
  const int n = options_.world_size;
  int steps = 1;
  for (int step = n - 1; step > 0 && steps == 1; --step)
    for (int q = 0; q < n; ++q)
      if (Reaches(q, (q - step + n) % n, mask)) {
        steps = step + 1;
        break;
      }
  std::lock_guard<std::mutex> lock(steps_mu_);
  if (steps_.size() < 16) steps_.push_back({mask, steps});
  return steps;
}

int64_t Plan::KeyExtent(int64_t b, int q_rank, int k_rank, const MaskSpec& mask) const {
  const std::vector<Run>& qr = runs(b, q_rank);
  const std::vector<Run>& kr = runs(b, k_rank);
  const int64_t* cu = cu_.data() + b * (num_seqs_ + 1);
  int64_t extent = 0;
  size_t k0 = 0;
  // The walk of Bounds, keeping only the highest end. Along a query run both ends of the visible
  // slots never decrease, so the last query that sees anything has the run's highest end; without
  // a left window every query's keys start at its document's start, so the last query sees the
  // most and one look settles the run.
  for (const Run& run : qr) {
    const size_t k1 = KeyRunsOf(kr, run, &k0);
    if (k1 == k0) continue;
    const Run* keys = kr.data() + k0;
    const Run* keys_end = kr.data() + k1;
    const int64_t a = cu[run.doc], e = cu[run.doc + 1];
    for (int64_t j = run.count - 1; j >= 0; --j) {
      int64_t start, end;
      VisibleRange(run.first + j * run.stride, a, e, mask, &start, &end);
      const int64_t l = SlotOf(keys, keys_end, start);
      const int64_t h = std::max(l, SlotOf(keys, keys_end, end));
      if (h <= extent) break;  // the earlier queries of the run end no higher
      if (h > l) {
        extent = h;
        break;
      }
      if (mask.window_left < 0) break;
    }
  }
  return extent;
}

void Plan::RowsStillNeeded(int k_rank, int step, const MaskSpec& mask, int64_t* rows) const {
  std::shared_ptr<const RowsEntry> entry;
  {
    std::lock_guard<std::mutex> lock(rows_mu_);
    for (const auto& e : rows_)
      if (e->mask.causal == mask.causal && e->mask.window_left == mask.window_left &&
          e->mask.window_right == mask.window_right)
        entry = e;
  }
  if (entry == nullptr) {
    auto made = std::make_shared<RowsEntry>();
    made->mask = mask;
    made->steps = RingSteps(mask);
    const int n = options_.world_size;
    const int64_t cells = static_cast<int64_t>(n) * made->steps * batch_;
    if (cells <= (int64_t{1} << 22)) {
      made->rows.assign(static_cast<size_t>(cells), 0);
      for (int k = 0; k < n; ++k)
        for (int64_t b = 0; b < batch_; ++b) {
          // rows(k, s) = max over the later steps t > s of the extent at rank k + t: a suffix max.
          int64_t need = 0;
          for (int s = made->steps - 1; s >= 0; --s) {
            made->rows[static_cast<size_t>((static_cast<int64_t>(k) * made->steps + s) * batch_ + b)] = need;
            if (s > 0) need = std::max(need, KeyExtent(b, (k + s) % n, k, mask));
          }
        }
    }
    std::lock_guard<std::mutex> lock(rows_mu_);
    if (rows_.size() >= 16) rows_.erase(rows_.begin());
    rows_.push_back(made);
    entry = made;
  }
  if (entry->rows.empty()) {  // no table: every row travels
    std::fill(rows, rows + batch_, local_len_);
  } else if (step >= entry->steps) {  // past the last step: the block goes nowhere
    std::fill(rows, rows + batch_, int64_t{0});
  } else {
    const int64_t* row = entry->rows.data() + (static_cast<int64_t>(k_rank) * entry->steps + step) * batch_;
    std::copy(row, row + batch_, rows);
  }
}

}  // namespace stria
