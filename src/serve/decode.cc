// Decode over a sharded KV cache. The queries are few (a token or a handful per sequence) and
// every rank has them, while the cache is long and spread: so nothing of the cache moves. Each rank
// computes attention over its own share, and the shares' results, an output row and an LSE per
// query row, combine exactly (out = sum_r e^(lse_r - lse) out_r, lse = log sum_r e^(lse_r)) after a
// single all-gather of those records: B·T·Hq·(D + 1) floats per rank, a few hundred KB at most,
// against a cache of gigabytes.
#include "serve/decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/struct_size.h"
#include "ring/arguments.h"
#include "ring/ring_common.h"
#include "serve/cache_layout.h"

namespace stria {
namespace {

// Ring buffer slots of a decode call: this rank's partial records, and every rank's.
constexpr int kPartialSlot = 9, kAllPartialsSlot = 10;

uint64_t Mix(uint64_t h, uint64_t x) {
  return (h ^ x) * 0x100000001b3ull;
}

// Everything a rank validates before the call's agreement; the work it will do.
struct ValidatedDecode {
  ValidatedCall call;  // the shape, params and sinks as the ring's calls read them (L is T)
  DecodeWork work;
  bool lse_given = false;
};

Status CheckCacheTensor(Context& ctx, DLTensor* t, const char* name, bool written, TensorView* out) {
  STRIA_RETURN_IF_ERROR(AttentionTensor(t, name, 4, ctx.device(), false, out));
  if (written) STRIA_RETURN_IF_ERROR(CheckWritable(*out, name, Role::kOutput));
  return ctx.backend().CheckMemory(out->data, name);
}

// The rows of `slot` of sequence b: its offset in elements in k and v (head 0).
struct SlotAddress {
  const TensorView *k, *v;
  const int32_t* table = nullptr;  // paged: [B] rows of table_stride entries (strides in elements)
  int64_t table_b = 0, table_i = 0, max_blocks = 0, block_size = 0, num_blocks = 0;

  // The offsets of slot s of sequence b, and how many slots from s on lie at the same stride (to the
  // end of its page); false (with *why) if the table names no block of the pool.
  bool Find(int64_t b, int64_t s, int64_t* k_off, int64_t* v_off, int64_t* run, Status* why) const {
    if (table == nullptr) {
      *k_off = b * k->strides[0] + s * k->strides[1];
      *v_off = b * v->strides[0] + s * v->strides[1];
      *run = k->shape[1] - s;
      return true;
    }
    const int64_t i = s / block_size;
    const int64_t block = table[b * table_b + i * table_i];
    if (block < 0 || block >= num_blocks) {
      *why = Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "cache->block_table[%lld][%lld] is %lld, which is not a block of the pool (0..%lld): slot %lld of "
                   "sequence %lld needs it",
                   static_cast<long long>(b), static_cast<long long>(i), static_cast<long long>(block),
                   static_cast<long long>(num_blocks - 1), static_cast<long long>(s), static_cast<long long>(b));
      return false;
    }
    const int64_t row = s % block_size;
    *k_off = block * k->strides[0] + row * k->strides[1];
    *v_off = block * v->strides[0] + row * v->strides[1];
    *run = block_size - row;
    return true;
  }
};

Status ValidateDecode(Context& ctx, const DecodeCall& call, ValidatedDecode* vd) {
  ValidatedCall& c = vd->call;
  DecodeWork& w = vd->work;
  Backend& be = ctx.backend();
  const int n = ctx.world_size(), rank = ctx.rank();
  DocumentsArg mask;
  STRIA_RETURN_IF_ERROR(CheckParams(call.params, DocumentsArg{}, &c, &mask));
  if (c.plan != nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->plan is set: a decode call's cache is spread by params->layout, not by a document plan");
  if (mask.given)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->cu_seqlens is set: a decode call attends each sequence to its own cache (no documents)");
  if (mask.window_right != -1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->window_right is %lld: a decode call takes window_left only (-1 for window_right)",
                 static_cast<long long>(mask.window_right));
  if (mask.window_left < -1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "params->window_left %lld must be >= 0, or -1 for no window",
                 static_cast<long long>(mask.window_left));

  STRIA_RETURN_IF_ERROR(AttentionTensor(call.q, "q", 4, ctx.device(), false, &w.q));
  STRIA_RETURN_IF_ERROR(be.CheckMemory(w.q.data, "q"));
  DecodeShape& s = w.shape;
  s.B = w.q.shape[0];
  s.T = w.q.shape[1];
  s.Hq = w.q.shape[2];
  s.D = w.q.shape[3];
  s.dtype = w.q.dtype;
  if (s.B < 1 || s.T < 1 || s.Hq < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "q has shape %s: B, T and Hq of [B, T, Hq, D] must be >= 1",
                 ShapeString(w.q).c_str());
  AttentionShape& as = c.shape;
  as.B = s.B;
  as.L = s.T;
  as.Hq = s.Hq;
  as.D = s.D;
  as.dtype = s.dtype;
  STRIA_RETURN_IF_ERROR(be.CheckSupported(as, call.stream));
  c.stream = call.stream;

  const stria_kv_cache_t* cache = call.cache;
  if (cache == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache is NULL (use stria_kv_cache_init)");
  STRIA_RETURN_IF_ERROR(
      CheckStructSize(cache, cache->struct_size, sizeof(stria_kv_cache_t), "cache", "stria_kv_cache_init"));
  const bool append = call.k_new != nullptr || call.v_new != nullptr;
  STRIA_RETURN_IF_ERROR(CheckCacheTensor(ctx, cache->k, "cache->k", append, &w.k));
  STRIA_RETURN_IF_ERROR(CheckCacheTensor(ctx, cache->v, "cache->v", append, &w.v));
  s.Hkv = as.Hkv = w.k.shape[2];
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache->k has %lld heads, which must divide q's %lld heads (GQA/MQA)",
                 static_cast<long long>(s.Hkv), static_cast<long long>(s.Hq));
  STRIA_RETURN_IF_ERROR(ExpectDType(w.k, "cache->k", s.dtype));
  STRIA_RETURN_IF_ERROR(ExpectDType(w.v, "cache->v", s.dtype));
  const bool paged = cache->block_table != nullptr;
  SlotAddress addr{&w.k, &w.v};
  int64_t capacity = 0;
  TensorView table;
  if (paged) {
    STRIA_RETURN_IF_ERROR(ExpectShape(w.k, "cache->k", {w.k.shape[0], w.k.shape[1], s.Hkv, s.D},
                                      "a paged cache's pool [num_blocks, block_size, Hkv, D] with q's D"));
    STRIA_RETURN_IF_ERROR(ExpectShape(w.v, "cache->v", {w.k.shape[0], w.k.shape[1], s.Hkv, s.D}, "like cache->k"));
    STRIA_RETURN_IF_ERROR(ViewOf(cache->block_table, "cache->block_table", ctx.device(), &table));
    if (!(table.dl_dtype.code == kDLInt && table.dl_dtype.bits == 32 && table.dl_dtype.lanes == 1) || table.ndim != 2 ||
        table.shape[0] != s.B)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "cache->block_table must be an int32 tensor [B, max_blocks] with q's B = %lld (got %d dims, shape "
                   "%s)",
                   static_cast<long long>(s.B), table.ndim, ShapeString(table).c_str());
    if (ctx.device().device_type != kDLCPU)
      return Error(STRIA_ERROR_UNSUPPORTED, "a paged cache's block table on a GPU context is not supported yet");
    if (w.k.shape[1] < 1 || table.shape[1] < 1)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "a paged cache needs block_size >= 1 and max_blocks >= 1 (got %lld, %lld)",
                   static_cast<long long>(w.k.shape[1]), static_cast<long long>(table.shape[1]));
    addr.table = static_cast<const int32_t*>(table.data);
    addr.table_b = table.strides[0];
    addr.table_i = table.strides[1];
    addr.max_blocks = table.shape[1];
    addr.block_size = w.k.shape[1];
    addr.num_blocks = w.k.shape[0];
    capacity = addr.max_blocks * addr.block_size;
  } else {
    STRIA_RETURN_IF_ERROR(ExpectShape(w.k, "cache->k", {s.B, w.k.shape[1], s.Hkv, s.D},
                                      "a contiguous cache [B, capacity, Hkv, D] with q's B and D"));
    STRIA_RETURN_IF_ERROR(ExpectShape(w.v, "cache->v", {s.B, w.k.shape[1], s.Hkv, s.D}, "like cache->k"));
    capacity = w.k.shape[1];
  }
  if (capacity < 1) return Error(STRIA_ERROR_INVALID_ARGUMENT, "the cache holds no slot on this rank (capacity 0)");
  if (c.layout == STRIA_LAYOUT_ZIGZAG && capacity % 2 != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "a zigzag cache needs an even per-rank capacity (two halves); this rank's is %lld",
                 static_cast<long long>(capacity));

  if (append) {
    if (call.k_new == nullptr || call.v_new == nullptr)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "k_new and v_new go together: give both or neither (%s is NULL)",
                   call.k_new == nullptr ? "k_new" : "v_new");
    STRIA_RETURN_IF_ERROR(AttentionTensor(call.k_new, "k_new", 4, ctx.device(), false, &w.k_new));
    STRIA_RETURN_IF_ERROR(AttentionTensor(call.v_new, "v_new", 4, ctx.device(), false, &w.v_new));
    STRIA_RETURN_IF_ERROR(be.CheckMemory(w.k_new.data, "k_new"));
    STRIA_RETURN_IF_ERROR(be.CheckMemory(w.v_new.data, "v_new"));
    STRIA_RETURN_IF_ERROR(ExpectShape(w.k_new, "k_new", {s.B, s.T, s.Hkv, s.D}, "[B, T, Hkv, D] with q's B, T, D"));
    STRIA_RETURN_IF_ERROR(ExpectShape(w.v_new, "v_new", {s.B, s.T, s.Hkv, s.D}, "like k_new"));
    STRIA_RETURN_IF_ERROR(ExpectDType(w.k_new, "k_new", s.dtype));
    STRIA_RETURN_IF_ERROR(ExpectDType(w.v_new, "v_new", s.dtype));
  }

  STRIA_RETURN_IF_ERROR(CheckSinks(ctx, call.params, false, &c));
  TensorView out;
  STRIA_RETURN_IF_ERROR(AttentionTensor(call.out, "out", 4, ctx.device(), false, &out));
  STRIA_RETURN_IF_ERROR(CheckWritable(out, "out", Role::kOutput));
  STRIA_RETURN_IF_ERROR(be.CheckMemory(out.data, "out"));
  STRIA_RETURN_IF_ERROR(ExpectShape(out, "out", {s.B, s.T, s.Hq, s.D}, "like q"));
  STRIA_RETURN_IF_ERROR(ExpectDType(out, "out", s.dtype));
  c.out = out;
  vd->lse_given = call.lse != nullptr;
  if (vd->lse_given) {
    STRIA_RETURN_IF_ERROR(AttentionTensor(call.lse, "lse", 3, ctx.device(), true, &c.lse));
    STRIA_RETURN_IF_ERROR(CheckWritable(c.lse, "lse", Role::kOutput));
    STRIA_RETURN_IF_ERROR(be.CheckMemory(c.lse.data, "lse"));
    STRIA_RETURN_IF_ERROR(ExpectShape(c.lse, "lse", {s.B, s.Hq, s.T}, "[B, Hq, T] float32"));
  }

  if (cache->lens == nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache->lens is NULL: the cached length of each sequence is needed");
  std::vector<int64_t> staged;
  const int64_t* lens = nullptr;
  STRIA_RETURN_IF_ERROR(
      be.ReadOnHost(cache->lens, static_cast<size_t>(s.B), call.stream, "cache->lens", &staged, &lens));

  as.scale = call.params->softmax_scale > 0.f ? call.params->softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  s.scale = as.scale;
  s.softcap = as.softcap;
  s.causal = c.causal;
  s.window_left = mask.window_left;
  const int64_t added = append ? s.T : 0;
  uint64_t h = Mix(Mix(Mix(0xcbf29ce484222325ull, static_cast<uint64_t>(capacity)), paged ? 1 : 0),
                   static_cast<uint64_t>(s.window_left));
  h = Mix(h, static_cast<uint64_t>(added));
  w.q_pos.resize(static_cast<size_t>(s.B * s.T));
  Status why;
  for (int64_t b = 0; b < s.B; ++b) {
    if (lens[b] < 0 || lens[b] > n * capacity - added)
      return Error(
          STRIA_ERROR_INVALID_ARGUMENT,
          "cache->lens[%lld] is %lld, but the cache holds %lld positions (%d ranks of %lld slots)%s",
          static_cast<long long>(b), static_cast<long long>(lens[b]), static_cast<long long>(n * capacity), n,
          static_cast<long long>(capacity),
          added ? Format(", %lld of them for this call's new tokens", static_cast<long long>(added)).c_str() : "");
    h = Mix(h, static_cast<uint64_t>(lens[b]));
    for (int64_t t = 0; t < s.T; ++t) w.q_pos[static_cast<size_t>(b * s.T + t)] = lens[b] + t;
    // This rank's cached keys of sequence b, the new ones included, cut at page ends.
    CacheRun runs[2];
    const int nr = CacheRuns(c.layout, n, rank, capacity, lens[b] + added, runs);
    for (int i = 0; i < nr; ++i)
      for (int64_t j = 0; j < runs[i].count;) {
        CacheSegment seg;
        seg.b = b;
        int64_t run = 0;
        if (!addr.Find(b, runs[i].slot0 + j, &seg.k_offset, &seg.v_offset, &run, &why)) return why;
        seg.count = std::min(run, runs[i].count - j);
        seg.pos0 = runs[i].pos0 + j * runs[i].pos_stride;
        seg.pos_stride = runs[i].pos_stride;
        w.segments.push_back(seg);
        j += seg.count;
      }
    for (int64_t t = 0; t < added; ++t) {
      int owner = 0;
      int64_t slot = 0, run = 0;
      CacheSlot(c.layout, n, capacity, lens[b] + t, &owner, &slot);
      if (owner != rank) continue;
      CacheAppend a;
      a.b = b;
      a.t = t;
      if (!addr.Find(b, slot, &a.k_offset, &a.v_offset, &run, &why)) return why;
      w.appends.push_back(a);
    }
  }
  c.call_hash = h == 0 ? 1 : h;
  return Status::Ok();
}

}  // namespace

Status AttentionDecode(Context& ctx, const DecodeCall& call) {
  STRIA_RETURN_IF_ERROR(ctx.Usable());
  ValidatedDecode vd;
  Status local = ValidateDecode(ctx, call, &vd);
  Backend& be = ctx.backend();
  const int n = ctx.world_size();
  void* mine = nullptr;
  void* all = nullptr;
  const size_t bytes = DecodePartialFloats(vd.work.shape) * sizeof(float);
  if (local.ok()) local = ctx.RingBuffer(kPartialSlot, bytes, &mine);
  if (local.ok() && n > 1) local = ctx.RingBuffer(kAllPartialsSlot, bytes * static_cast<size_t>(n), &all);
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kDecode, local, vd.call, &seq));
  ctx.traffic() = Traffic();

  StepTimer timer(be);
  timer.ComputeBegin();
  Status st = be.Decode(vd.work, static_cast<float*>(mine));
  if (st.ok()) st = ctx.CheckNotAborted();
  if (!st.ok()) return ctx.Fail(st);
  timer.ComputeEnd();
  if (n > 1) {
    st = be.FenceBuffers();
    const std::string what = Format("decode partials of call #%llu", static_cast<unsigned long long>(seq));
    if (st.ok()) st = ctx.transport().AllGather(mine, all, bytes, ctx.timeout_s(), what.c_str());
    if (!st.ok()) return ctx.Fail(st);
    ctx.traffic().messages = static_cast<uint64_t>(n - 1);
  } else {
    all = mine;
  }
  ctx.step_times().assign(1, timer.Finish());
  st = be.DecodeMerge(vd.work, static_cast<const float*>(all), n, vd.call.sinks_given ? &vd.call.sinks : nullptr,
                      vd.call.out, vd.lse_given ? &vd.call.lse : nullptr);
  if (st.ok()) st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria
