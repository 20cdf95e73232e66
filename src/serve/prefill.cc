// Prefill with a sharded cache: P new tokens per sequence, L = P / N on each rank by the layout,
// attend to the cache (every rank's share) and to each other. Each query's result is the merge of N
// partial results, one per rank's keys (its share of the cache and the new tokens it holds): pass-KV
// brings every rank's keys to the queries around the ring (messages of the keys' size), pass-Q takes
// the queries to every rank's keys and sends each partial result home (messages of the queries' size
// and their results'). Either way the partials of a query are merged in the order of the ranks that
// own the keys, so the two give the same result to rounding, and every rank's queries the same
// merge they would get in the other.
//
// The attention of one query block against one rank's keys is Backend::Decode (the same kernel as a
// decode call, with L query tokens per sequence); the merge is Backend::DecodeMerge, where the
// partials lie.
#include "serve/prefill.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "ring/arguments.h"
#include "ring/ring_common.h"
#include "ring/ring_order.h"
#include "serve/cache_layout.h"
#include "serve/cache_view.h"
#include "serve/serving_common.h"

namespace stria {
namespace {

// Ring buffer slots: the travelling message (K/V or queries) 0 and 1; every rank's partial results
// 10; pass-Q: the partial results sent home 9, the new tokens' rows to their owners 11 and 12.
constexpr int kSentPartialsSlot = 9, kAllPartialsSlot = 10, kRowsOutSlot = 11, kRowsInSlot = 12;

// A run of a rank's new tokens: local tokens [i0, i0 + count) at chunk positions c0 + j * stride.
struct TokenRun {
  int64_t i0 = 0, count = 0, c0 = 0, stride = 1;
};

// The runs of rank `rank`'s L new tokens in the layout over P = L * N chunk positions.
std::vector<TokenRun> NewTokenRuns(stria_layout_t layout, int64_t L, int n, int rank) {
  std::vector<TokenRun> runs;
  for (int64_t i = 0; i < L; ++i) {
    const int64_t c = GlobalPosition(layout, L, n, rank, i);
    if (!runs.empty()) {
      TokenRun& r = runs.back();
      if (r.count == 1 && c > r.c0) {
        r.stride = c - r.c0;
        ++r.count;
        continue;
      }
      if (c == r.c0 + r.count * r.stride) {
        ++r.count;
        continue;
      }
    }
    runs.push_back(TokenRun{i, 1, c, 1});
  }
  return runs;
}

struct ValidatedPrefill {
  ValidatedCall call;  // shape (L: the local new tokens), params, sinks, out, lse
  CacheView cache;
  TensorView k, v;
  DecodeShape shape;
  int64_t P = 0;
  stria_prefill_t mode = STRIA_PREFILL_AUTO;
  bool lse_given = false;
  std::vector<std::vector<TokenRun>> runs;  // [rank]: its new tokens' runs
  std::vector<int64_t> rows;                // [rank][b]: its keys for sequence b (cache share + new tokens)
  int64_t max_rows = 0;
};

// Holder's cached keys of a sequence, from the first a new token sees (FirstSeenPosition).
int64_t CacheCount(const CacheView& cv, const DecodeShape& s, int holder, int64_t len) {
  CacheRun runs[2];
  const int nr =
      CacheRuns(cv.layout, cv.world_size, holder, cv.capacity, len, runs, FirstSeenPosition(len, s.window_left));
  int64_t n = 0;
  for (int i = 0; i < nr; ++i) n += runs[i].count;
  return n;
}

Status ValidatePrefill(Context& ctx, const PrefillCall& call, ValidatedPrefill* vp) {
  ValidatedCall& c = vp->call;
  Backend& be = ctx.backend();
  const int n = ctx.world_size();
  DocumentsArg mask;
  STRIA_RETURN_IF_ERROR(CheckServingParams(ctx, call.params, true, &c, &mask));
  if (call.mode < STRIA_PREFILL_AUTO || call.mode > STRIA_PREFILL_PASS_Q)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "mode %d is not a stria_prefill_t (0 automatic, 1 pass-KV, 2 pass-Q)",
                 call.mode);
  STRIA_RETURN_IF_ERROR(AttentionTensor(call.q, "q", 4, ctx.device(), false, &c.q));
  STRIA_RETURN_IF_ERROR(AttentionTensor(call.k, "k", 4, ctx.device(), false, &vp->k));
  STRIA_RETURN_IF_ERROR(AttentionTensor(call.v, "v", 4, ctx.device(), false, &vp->v));
  for (const auto& [t, name] : {std::pair<const TensorView*, const char*>{&c.q, "q"}, {&vp->k, "k"}, {&vp->v, "v"}})
    STRIA_RETURN_IF_ERROR(be.CheckMemory(t->data, name));
  DecodeShape& s = vp->shape;
  s.B = c.q.shape[0];
  s.T = c.q.shape[1];
  s.Hq = c.q.shape[2];
  s.D = c.q.shape[3];
  s.Hkv = vp->k.shape[2];
  s.dtype = c.q.dtype;
  if (s.B < 1 || s.T < 1 || s.Hq < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "q has shape %s: B, L and Hq of [B, L, Hq, D] must be >= 1",
                 ShapeString(c.q).c_str());
  AttentionShape& as = c.shape;
  as.B = s.B;
  as.L = s.T;
  as.Hq = s.Hq;
  as.Hkv = s.Hkv;
  as.D = s.D;
  as.dtype = s.dtype;
  STRIA_RETURN_IF_ERROR(be.CheckSupported(as, call.stream));
  c.stream = call.stream;
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "k has %lld heads, which must divide q's %lld heads (GQA/MQA)",
                 static_cast<long long>(s.Hkv), static_cast<long long>(s.Hq));
  STRIA_RETURN_IF_ERROR(ExpectShape(vp->k, "k", {s.B, s.T, s.Hkv, s.D}, "[B, L, Hkv, D] with q's B, L and D"));
  STRIA_RETURN_IF_ERROR(ExpectShape(vp->v, "v", {s.B, s.T, s.Hkv, s.D}, "like k"));
  STRIA_RETURN_IF_ERROR(ExpectDType(vp->k, "k", s.dtype));
  STRIA_RETURN_IF_ERROR(ExpectDType(vp->v, "v", s.dtype));
  vp->P = s.T * n;
  STRIA_RETURN_IF_ERROR(CheckLayout(c.layout, vp->P, n, ctx.rank()));
  CacheView& cv = vp->cache;
  STRIA_RETURN_IF_ERROR(ValidateCache(ctx, call.cache, c.layout, s.B, s.D, s.dtype, vp->P, call.stream, &cv));
  if (cv.heads != s.Hkv)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache->k has %lld heads but k has %lld",
                 static_cast<long long>(cv.heads), static_cast<long long>(s.Hkv));
  STRIA_RETURN_IF_ERROR(CheckSinks(ctx, call.params, false, &c));
  STRIA_RETURN_IF_ERROR(CheckServingOutputs(ctx, call.out, call.lse, c.q, &c.out, &c.lse));
  vp->lse_given = call.lse != nullptr;

  s.scale = as.scale =
      call.params->softmax_scale > 0.f ? call.params->softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  s.softcap = as.softcap;
  s.causal = c.causal;
  s.window_left = mask.window_left;
  vp->runs.resize(static_cast<size_t>(n));
  vp->rows.assign(static_cast<size_t>(n * s.B), 0);
  for (int h = 0; h < n; ++h) {
    vp->runs[static_cast<size_t>(h)] = NewTokenRuns(c.layout, s.T, n, h);
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t rows = CacheCount(cv, s, h, cv.lens[static_cast<size_t>(b)]) + s.T;
      vp->rows[static_cast<size_t>(h * s.B + b)] = rows;
      vp->max_rows = std::max(vp->max_rows, rows);
    }
  }
  // The mode: whichever moves fewer bytes per ring step (pass-Q's queries and their results coming
  // home, against pass-KV's keys and values).
  const int64_t esize = DTypeSize(s.dtype);
  const int64_t kv_bytes = 2 * s.B * vp->max_rows * s.Hkv * s.D * esize;
  const int64_t q_bytes = s.B * s.T * s.Hq * (s.D * esize + (s.D + 1) * 4);
  vp->mode = call.mode != STRIA_PREFILL_AUTO ? static_cast<stria_prefill_t>(call.mode)
             : q_bytes < kv_bytes            ? STRIA_PREFILL_PASS_Q
                                             : STRIA_PREFILL_PASS_KV;
  uint64_t hash = HashMix(cv.Hash(0x84222325cbf29ce4ull), static_cast<uint64_t>(s.window_left));
  hash = HashMix(hash, static_cast<uint64_t>(vp->mode));
  c.call_hash = hash == 0 ? 1 : hash;
  return Status::Ok();
}

// Holder h's keys for sequence b in its pass-KV message: its cache share's rows, then its new
// tokens', at `rows` rows of the message (Hkv * D elements each) from k_part / v_part.
void MessageSegments(const ValidatedPrefill& vp, int holder, char* k_part, char* v_part,
                     std::vector<CacheSegment>* out) {
  const DecodeShape& s = vp.shape;
  const CacheView& cv = vp.cache;
  const int64_t row = s.Hkv * s.D * DTypeSize(s.dtype), head = s.D * DTypeSize(s.dtype);
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t len = cv.lens[static_cast<size_t>(b)];
    int64_t at = b * vp.max_rows;
    auto add = [&](int64_t count, int64_t pos0, int64_t stride) {
      CacheSegment seg;
      seg.b = b;
      seg.k = k_part + at * row;
      seg.v = v_part + at * row;
      seg.k_row = seg.v_row = row;
      seg.k_head = seg.v_head = head;
      seg.count = count;
      seg.pos0 = pos0;
      seg.pos_stride = stride;
      out->push_back(seg);
      at += count;
    };
    CacheRun runs[2];
    const int nr =
        CacheRuns(cv.layout, cv.world_size, holder, cv.capacity, len, runs, FirstSeenPosition(len, s.window_left));
    for (int i = 0; i < nr; ++i) add(runs[i].count, runs[i].pos0, runs[i].pos_stride);
    for (const TokenRun& r : vp.runs[static_cast<size_t>(holder)]) add(r.count, len + r.c0, r.stride);
  }
}

// The segment's K (or V) rows at `base` as a box [count, Hkv, D] (element strides) of the call's
// dtype.
TensorView SegmentBox(const DecodeShape& s, const char* base, int64_t row_bytes, int64_t head_bytes, int64_t count) {
  TensorView box;
  const int64_t e = DTypeSize(s.dtype);
  box.data = const_cast<char*>(base);
  box.dtype = s.dtype;
  box.dl_dtype =
      DLDataType{static_cast<uint8_t>(s.dtype == DType::kBF16 ? kDLBfloat : kDLFloat), static_cast<uint8_t>(8 * e), 1};
  box.ndim = 3;
  box.shape[0] = count;
  box.shape[1] = s.Hkv;
  box.shape[2] = s.D;
  box.strides[0] = row_bytes / e;
  box.strides[1] = head_bytes / e;
  box.strides[2] = 1;
  return box;
}

// Copies `count` rows of Hkv * D elements from a segment's layout into a compact one, in the
// backend's memory on the call's stream (Backend::PackBox: the copy of a device backend is queued).
Status CopyRows(Backend& be, const DecodeShape& s, const CacheSegment& seg, char* k_dst, char* v_dst, void* stream) {
  if (seg.count == 0) return Status::Ok();
  STRIA_RETURN_IF_ERROR(be.PackBox(SegmentBox(s, seg.k, seg.k_row, seg.k_head, seg.count), k_dst, stream));
  return be.PackBox(SegmentBox(s, seg.v, seg.v_row, seg.v_head, seg.count), v_dst, stream);
}

// This rank's own keys where they are: its cache share in place, its new tokens in k and v.
Status OwnSegments(const ValidatedPrefill& vp, int rank, std::vector<CacheSegment>* out) {
  const DecodeShape& s = vp.shape;
  const int64_t ek = vp.k.elem_bytes(), ev = vp.v.elem_bytes();
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t len = vp.cache.lens[static_cast<size_t>(b)];
    STRIA_RETURN_IF_ERROR(vp.cache.AddSegments(b, len, out, FirstSeenPosition(len, s.window_left)));
    for (const TokenRun& r : vp.runs[static_cast<size_t>(rank)]) {
      CacheSegment seg;
      seg.b = b;
      seg.k = static_cast<const char*>(vp.k.data) + (b * vp.k.strides[0] + r.i0 * vp.k.strides[1]) * ek;
      seg.v = static_cast<const char*>(vp.v.data) + (b * vp.v.strides[0] + r.i0 * vp.v.strides[1]) * ev;
      seg.k_row = vp.k.strides[1] * ek;
      seg.v_row = vp.v.strides[1] * ev;
      seg.k_head = vp.k.strides[2] * ek;
      seg.v_head = vp.v.strides[2] * ev;
      seg.count = r.count;
      seg.pos0 = len + r.c0;
      seg.pos_stride = r.stride;
      out->push_back(seg);
    }
  }
  return Status::Ok();
}

// The positions of holder h's queries, [B][L].
std::vector<int64_t> QueryPositions(const ValidatedPrefill& vp, int holder) {
  const DecodeShape& s = vp.shape;
  std::vector<int64_t> pos(static_cast<size_t>(s.B * s.T));
  for (int64_t b = 0; b < s.B; ++b)
    for (const TokenRun& r : vp.runs[static_cast<size_t>(holder)])
      for (int64_t j = 0; j < r.count; ++j)
        pos[static_cast<size_t>(b * s.T + r.i0 + j)] = vp.cache.lens[static_cast<size_t>(b)] + r.c0 + j * r.stride;
  return pos;
}

Status RunPassKV(Context& ctx, const ValidatedPrefill& vp, uint64_t seq, void* kv[2], size_t kv_bytes, float* all) {
  Backend& be = ctx.backend();
  Transport& tr = ctx.transport();
  const DecodeShape& s = vp.shape;
  const int n = ctx.world_size(), r = ctx.rank(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  const int64_t esize = DTypeSize(s.dtype), row = s.Hkv * s.D * esize;
  const size_t part = kv_bytes / 2;
  const size_t records = DecodePartialFloats(s);
  // This rank's message: its cache share's rows, then its new tokens', per sequence.
  {
    std::vector<CacheSegment> own;
    STRIA_RETURN_IF_ERROR(OwnSegments(vp, r, &own));
    char* k_part = static_cast<char*>(kv[0]);
    char* v_part = k_part + part;
    int64_t b = -1, at = 0;
    for (const CacheSegment& seg : own) {
      if (seg.b != b) {
        b = seg.b;
        at = b * vp.max_rows;
      }
      const Status st = CopyRows(be, s, seg, k_part + at * row, v_part + at * row, vp.call.stream);
      if (!st.ok()) return ctx.Fail(st);
      at += seg.count;
    }
  }
  DecodeWork w;
  w.shape = s;
  w.q = vp.call.q;
  w.q_pos = QueryPositions(vp, r);
  w.stream = vp.call.stream;
  auto& times = ctx.step_times();
  times.assign(static_cast<size_t>(n), StepTime());
  RingOrder order(be, tr, ctx.timeout_s(), vp.call.stream);
  for (int step = 0; step < n; ++step) {
    order.Step(step);
    const int holder = (r - step + n) % n;
    RequestId send = 0, recv = 0;
    const bool forward = step < n - 1;
    if (forward) {
      // The message's packing (or the last step's kernels reading the other buffer) done first.
      Status st = order.BeforePosting();
      if (st.ok()) st = tr.Irecv(prev, RingTag(seq, step, MessageKind::kKV), kv[(step + 1) % 2], kv_bytes, &recv);
      if (st.ok()) st = tr.Isend(next, RingTag(seq, step, MessageKind::kKV), kv[step % 2], kv_bytes, &send);
      if (!st.ok()) return ctx.Fail(st);
      CountSent(kv_bytes, true, &ctx.traffic());
    }
    StepTimer timer(be);
    timer.ComputeBegin();
    char* k_part = static_cast<char*>(kv[step % 2]);
    char* v_part = k_part + part;
    w.segments.clear();
    w.appends.clear();
    MessageSegments(vp, holder, k_part, v_part, &w.segments);
    // The holder's new tokens this rank keeps: stored from the message as it passes.
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t len = vp.cache.lens[static_cast<size_t>(b)];
      const int64_t first = b * vp.max_rows + vp.rows[static_cast<size_t>(holder * s.B + b)] - s.T;
      for (const TokenRun& tr_run : vp.runs[static_cast<size_t>(holder)])
        for (int64_t j = 0; j < tr_run.count; ++j) {
          const int64_t at = first + tr_run.i0 + j;
          Status st = vp.cache.AddAppend(b, len + tr_run.c0 + j * tr_run.stride, k_part + at * row, v_part + at * row,
                                         s.D * esize, s.D * esize, &w.appends);
          if (!st.ok()) return ctx.Fail(st);
        }
    }
    Status st = be.Decode(w, all + static_cast<size_t>(holder) * records);
    if (st.ok()) st = ctx.CheckNotAborted();
    if (!st.ok()) return ctx.Fail(st);
    timer.ComputeEnd();
    if (forward) {
      const std::string what = Format("K/V block of prefill step %d", step);
      st = order.Arrived(recv, what);
      if (st.ok()) st = order.Arrived(send, what);
      if (!st.ok()) return ctx.Fail(st);
    }
    if (st = order.Retire(); !st.ok()) return ctx.Fail(st);
    times[static_cast<size_t>(step)] = timer.Finish();
  }
  const Status st = order.Finish();
  return st.ok() ? st : ctx.Fail(st);
}

Status RunPassQ(Context& ctx, const ValidatedPrefill& vp, uint64_t seq, void* qbuf[2], size_t q_bytes, float* all,
                float* sent, char* rows_out, char* rows_in) {
  Backend& be = ctx.backend();
  Transport& tr = ctx.transport();
  const DecodeShape& s = vp.shape;
  const int n = ctx.world_size(), r = ctx.rank(), next = (r + 1) % n, prev = (r - 1 + n) % n;
  const int64_t esize = DTypeSize(s.dtype);
  const size_t records = DecodePartialFloats(s);
  const size_t record_bytes = records * sizeof(float);
  // The results of this rank's queries against every other rank's keys come home: rank k = r + t
  // computes them at its step t. Each rank sends its step-t result at the start of step t + 1 (the
  // last step's after the loop), paired with the receive of the result that rank r + t computed for
  // it: every rank posts the same pairs in the same order, between two ranks the messages of each
  // direction go in the order of their tags (the ring's query blocks from r - 1 to r at steps
  // 0..N-2, then the partial of step N - 1), and a transport that matches in posting order and
  // launches a receive with a send (NCCL's) forms the same groups on every rank.
  std::vector<RequestId> homes;
  RingOrder order(be, tr, ctx.timeout_s(), vp.call.stream);
  auto exchange_partials = [&](int t, std::vector<RequestId>* sends) {
    if (t < 1) return Status::Ok();  // step 0's result is this rank's own
    const int k = (r + t) % n, to = (r - t + n) % n;
    RequestId id = 0;
    STRIA_RETURN_IF_ERROR(
        tr.Irecv(k, RingTag(seq, t, MessageKind::kPartial), all + static_cast<size_t>(k) * records, record_bytes, &id));
    homes.push_back(id);
    STRIA_RETURN_IF_ERROR(order.BeforePosting());  // the result computed
    STRIA_RETURN_IF_ERROR(tr.Isend(to, RingTag(seq, t, MessageKind::kPartial), sent + static_cast<size_t>(t) * records,
                                   record_bytes, &id));
    sends->push_back(id);
    CountSent(record_bytes, true, &ctx.traffic());
    return Status::Ok();
  };
  // This rank's queries, compact [B, L, Hq, D], start the ring.
  {
    const Status st = be.PackBox(vp.call.q, qbuf[0], vp.call.stream);
    if (!st.ok()) return ctx.Fail(st);
  }
  DecodeWork w;
  w.shape = s;
  w.q = vp.call.q;
  for (int d = 0; d < 4; ++d) w.q.shape[d] = d == 0 ? s.B : d == 1 ? s.T : d == 2 ? s.Hq : s.D;
  w.q.strides[3] = 1;
  w.q.strides[2] = s.D;
  w.q.strides[1] = s.Hq * s.D;
  w.q.strides[0] = s.T * s.Hq * s.D;
  w.stream = vp.call.stream;
  {
    Status st = OwnSegments(vp, r, &w.segments);
    if (!st.ok()) return ctx.Fail(st);
  }
  std::vector<RequestId> sends;
  auto& times = ctx.step_times();
  times.assign(static_cast<size_t>(n), StepTime());
  for (int step = 0; step < n; ++step) {
    order.Step(step);
    const int holder = (r - step + n) % n;  // whose queries this rank holds now
    RequestId send = 0, recv = 0;
    const bool forward = step < n - 1;
    {
      const Status st = exchange_partials(step - 1, &sends);
      if (!st.ok()) return ctx.Fail(st);
    }
    if (forward) {
      Status st = order.BeforePosting();
      if (st.ok()) st = tr.Irecv(prev, RingTag(seq, step, MessageKind::kKV), qbuf[(step + 1) % 2], q_bytes, &recv);
      if (st.ok()) st = tr.Isend(next, RingTag(seq, step, MessageKind::kKV), qbuf[step % 2], q_bytes, &send);
      if (!st.ok()) return ctx.Fail(st);
      CountSent(q_bytes, true, &ctx.traffic());
    }
    StepTimer timer(be);
    timer.ComputeBegin();
    w.q.data = qbuf[step % 2];
    w.q_pos = QueryPositions(vp, holder);
    float* result = holder == r ? all + static_cast<size_t>(r) * records : sent + static_cast<size_t>(step) * records;
    Status st = be.Decode(w, result);
    if (st.ok()) st = ctx.CheckNotAborted();
    if (!st.ok()) return ctx.Fail(st);
    timer.ComputeEnd();
    if (forward) {
      const std::string what = Format("query block of prefill step %d", step);
      st = order.Arrived(recv, what);
      if (st.ok()) st = order.Arrived(send, what);
      if (!st.ok()) return ctx.Fail(st);
    }
    if (st = order.Retire(); !st.ok()) return ctx.Fail(st);
    times[static_cast<size_t>(step)] = timer.Finish();
  }
  order.Step(n);
  {
    const Status st = exchange_partials(n - 1, &sends);
    if (!st.ok()) return ctx.Fail(st);
  }

  // The new tokens go to the ranks whose cache shares hold their positions: each rank sends every
  // other the rows it keeps (in sequence, token order), and stores those it keeps itself.
  const int64_t row = s.Hkv * s.D * esize, head = s.D * esize;
  std::vector<CacheAppend> mine;
  std::vector<int64_t> out_rows(static_cast<size_t>(n), 0), in_rows(static_cast<size_t>(n), 0);
  auto owner_of = [&](int64_t b, int64_t c) {
    int owner = 0;
    int64_t slot = 0;
    CacheSlot(vp.cache.layout, n, vp.cache.capacity, vp.cache.lens[static_cast<size_t>(b)] + c, &owner, &slot);
    return owner;
  };
  for (int h = 0; h < n; ++h)
    for (int64_t b = 0; b < s.B; ++b)
      for (const TokenRun& run : vp.runs[static_cast<size_t>(h)])
        for (int64_t j = 0; j < run.count; ++j) {
          const int owner = owner_of(b, run.c0 + j * run.stride);
          if (h == r && owner != r) ++out_rows[static_cast<size_t>(owner)];
          if (h != r && owner == r) ++in_rows[static_cast<size_t>(h)];
        }
  std::vector<int64_t> out_at(static_cast<size_t>(n + 1), 0), in_at(static_cast<size_t>(n + 1), 0);
  for (int p = 0; p < n; ++p) {
    out_at[static_cast<size_t>(p + 1)] = out_at[static_cast<size_t>(p)] + out_rows[static_cast<size_t>(p)];
    in_at[static_cast<size_t>(p + 1)] = in_at[static_cast<size_t>(p)] + in_rows[static_cast<size_t>(p)];
  }
  const int64_t out_total = out_at[static_cast<size_t>(n)], in_total = in_at[static_cast<size_t>(n)];
  std::vector<int64_t> fill = out_at;
  const int64_t ek = vp.k.elem_bytes(), ev = vp.v.elem_bytes();
  for (int64_t b = 0; b < s.B; ++b)
    for (const TokenRun& run : vp.runs[static_cast<size_t>(r)])
      for (int64_t j = 0; j < run.count; ++j) {
        const int64_t i = run.i0 + j, c = run.c0 + j * run.stride;
        const char* kr = static_cast<const char*>(vp.k.data) + (b * vp.k.strides[0] + i * vp.k.strides[1]) * ek;
        const char* vr = static_cast<const char*>(vp.v.data) + (b * vp.v.strides[0] + i * vp.v.strides[1]) * ev;
        const int owner = owner_of(b, c);
        if (owner == r) {
          Status st = vp.cache.AddAppend(b, vp.cache.lens[static_cast<size_t>(b)] + c, kr, vr, vp.k.strides[2] * ek,
                                         vp.v.strides[2] * ev, &mine);
          if (!st.ok()) return ctx.Fail(st);
          continue;
        }
        CacheSegment seg;
        seg.k = kr;
        seg.v = vr;
        seg.k_head = vp.k.strides[2] * ek;
        seg.v_head = vp.v.strides[2] * ev;
        seg.count = 1;
        const int64_t at = fill[static_cast<size_t>(owner)]++;
        const Status st = CopyRows(be, s, seg, rows_out + at * row, rows_out + (out_total + at) * row, vp.call.stream);
        if (!st.ok()) return ctx.Fail(st);
      }
  {
    const Status st = order.BeforePosting();  // the rows packed before they are sent
    if (!st.ok()) return ctx.Fail(st);
  }
  // In rounds, a shift of the ranks: at round i each rank receives from the rank i before it and
  // sends to the one i after it, keys then values, each receive posted with its send (messages of
  // no rows included, so that every rank posts the same pairs: see the partials above).
  std::vector<RequestId> row_ids;
  for (int i = 1; i < n; ++i) {
    const size_t from = static_cast<size_t>((r - i + n) % n), to = static_cast<size_t>((r + i) % n);
    for (int half = 0; half < 2; ++half) {
      RequestId id = 0;
      Status st =
          tr.Irecv(static_cast<int>(from), RingTag(seq, n + half, MessageKind::kKV),
                   rows_in + (half * in_total + in_at[from]) * row, static_cast<size_t>(in_rows[from] * row), &id);
      if (st.ok()) row_ids.push_back(id);
      if (st.ok())
        st = tr.Isend(static_cast<int>(to), RingTag(seq, n + half, MessageKind::kKV),
                      rows_out + (half * out_total + out_at[to]) * row, static_cast<size_t>(out_rows[to] * row), &id);
      if (!st.ok()) return ctx.Fail(st);
      row_ids.push_back(id);
      CountSent(static_cast<size_t>(out_rows[to] * row), true, &ctx.traffic());
    }
  }
  for (RequestId id : homes) {
    Status st = order.Arrived(id, "partial results of this rank's queries");
    if (!st.ok()) return ctx.Fail(st);
  }
  for (RequestId id : sends) {
    Status st = order.Arrived(id, "partial results sent home");
    if (!st.ok()) return ctx.Fail(st);
  }
  for (RequestId id : row_ids) {
    Status st = order.Arrived(id, "new tokens' rows for their cache shares");
    if (!st.ok()) return ctx.Fail(st);
  }
  // The rows received, in the sender's sequence and token order.
  for (int h = 0; h < n; ++h) {
    if (h == r) continue;
    int64_t at = in_at[static_cast<size_t>(h)];
    for (int64_t b = 0; b < s.B; ++b)
      for (const TokenRun& run : vp.runs[static_cast<size_t>(h)])
        for (int64_t j = 0; j < run.count; ++j) {
          const int64_t c = run.c0 + j * run.stride;
          if (owner_of(b, c) != r) continue;
          Status st = vp.cache.AddAppend(b, vp.cache.lens[static_cast<size_t>(b)] + c, rows_in + at * row,
                                         rows_in + (in_total + at) * row, head, head, &mine);
          if (!st.ok()) return ctx.Fail(st);
          ++at;
        }
  }
  Status st = be.StoreTokens(s, mine, vp.call.stream);
  if (st.ok()) st = order.Finish();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace

Status AttentionPrefill(Context& ctx, const PrefillCall& call) {
  STRIA_RETURN_IF_ERROR(ctx.Usable());
  ValidatedPrefill vp;
  Status local = ValidatePrefill(ctx, call, &vp);
  const int n = ctx.world_size();
  const DecodeShape& s = vp.shape;
  const int64_t esize = DTypeSize(s.dtype);
  void* msg[2] = {nullptr, nullptr};
  void* all = nullptr;
  void* sent = nullptr;
  void* rows[2] = {nullptr, nullptr};
  size_t msg_bytes = 0;
  const size_t records = DecodePartialFloats(s);
  if (local.ok()) {
    const bool pass_q = vp.mode == STRIA_PREFILL_PASS_Q;
    msg_bytes = pass_q ? static_cast<size_t>(s.B * s.T * s.Hq * s.D * esize)
                       : static_cast<size_t>(2 * s.B * vp.max_rows * s.Hkv * s.D * esize);
    local = ctx.RingBuffer(0, msg_bytes, &msg[0]);
    if (local.ok() && n > 1) local = ctx.RingBuffer(1, msg_bytes, &msg[1]);
    if (local.ok()) local = ctx.RingBuffer(kAllPartialsSlot, records * sizeof(float) * static_cast<size_t>(n), &all);
    if (local.ok() && pass_q) {
      // Out: this rank's new tokens that others keep (at most its L per sequence); in: the new tokens
      // of others that this rank keeps (with the contiguous layout, up to every one of them).
      const size_t row_bytes = static_cast<size_t>(2 * s.Hkv * s.D * esize);
      local = ctx.RingBuffer(kSentPartialsSlot, records * sizeof(float) * static_cast<size_t>(n), &sent);
      if (local.ok()) local = ctx.RingBuffer(kRowsOutSlot, row_bytes * static_cast<size_t>(s.B * s.T), &rows[0]);
      if (local.ok()) local = ctx.RingBuffer(kRowsInSlot, row_bytes * static_cast<size_t>(s.B * vp.P), &rows[1]);
    }
  }
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kPrefill, local, vp.call, &seq));
  ctx.traffic() = Traffic();
  Status st = vp.mode == STRIA_PREFILL_PASS_Q
                  ? RunPassQ(ctx, vp, seq, msg, msg_bytes, static_cast<float*>(all), static_cast<float*>(sent),
                             static_cast<char*>(rows[0]), static_cast<char*>(rows[1]))
                  : RunPassKV(ctx, vp, seq, msg, msg_bytes, static_cast<float*>(all));
  STRIA_RETURN_IF_ERROR(st);
  DecodeWork w;
  w.shape = s;
  w.stream = vp.call.stream;
  // Every query's partials lie in `all` (the backend's memory), merged there.
  st = ctx.backend().DecodeMerge(w, static_cast<const float*>(all), n, vp.call.sinks_given ? &vp.call.sinks : nullptr,
                                 vp.call.out, vp.lse_given ? &vp.call.lse : nullptr);
  if (st.ok()) st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria
