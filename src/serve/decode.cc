// Decode over a sharded KV cache. The queries are few (a token or a handful per sequence) and
// every rank has them, while the cache is long and spread: so nothing of the cache moves. Each rank
// computes attention over its own share, and the shares' results, an output row and an LSE per
// query row, combine exactly (out = sum_r e^(lse_r - lse) out_r, lse = log sum_r e^(lse_r)) after a
// single all-gather of those records: B·T·Hq·(D + 1) floats per rank, a few hundred KB at most,
// against a cache of gigabytes. A host backend's records are all-gathered by the transport in host
// memory and merged there; a device backend's stay on the device: the transport gathers them in
// place, device to device (Transport::AllGatherInPlace), and one kernel merges them into out and
// lse, so a decode step never waits for a copy to the host (a world of one's decode writes out and
// lse itself).
#include "serve/decode.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ring/arguments.h"
#include "ring/ring_common.h"
#include "ring/ring_order.h"
#include "serve/cache_layout.h"
#include "serve/cache_view.h"
#include "serve/serving_common.h"

namespace stria {
namespace {

// Ring buffer slots of a decode call: this rank's partial records (where the host gathers them),
// and every rank's, rank by rank.
constexpr int kPartialSlot = 9, kAllPartialsSlot = 10;

// Everything a rank validates before the call's agreement; the work it will do.
struct ValidatedDecode {
  ValidatedCall call;  // the shape, params and sinks as the ring's calls read them (L is T)
  DecodeWork work;
  CacheView cache;
  bool lse_given = false;
};

Status ValidateDecode(Context& ctx, const DecodeCall& call, ValidatedDecode* vd) {
  ValidatedCall& c = vd->call;
  DecodeWork& w = vd->work;
  Backend& be = ctx.backend();
  DocumentsArg mask;
  STRIA_RETURN_IF_ERROR(CheckServingParams(ctx, call.params, false, &c, &mask));

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

  const bool append = call.k_new != nullptr || call.v_new != nullptr;
  const int64_t added = append ? s.T : 0;
  CacheView& cv = vd->cache;
  STRIA_RETURN_IF_ERROR(ValidateCache(ctx, call.cache, c.layout, s.B, s.D, s.dtype, added, call.stream, &cv));
  s.Hkv = as.Hkv = cv.heads;
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "cache->k has %lld heads, which must divide q's %lld heads (GQA/MQA)",
                 static_cast<long long>(s.Hkv), static_cast<long long>(s.Hq));
  TensorView k_new, v_new;
  if (append) {
    if (call.k_new == nullptr || call.v_new == nullptr)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "k_new and v_new go together: give both or neither (%s is NULL)",
                   call.k_new == nullptr ? "k_new" : "v_new");
    STRIA_RETURN_IF_ERROR(AttentionTensor(call.k_new, "k_new", 4, ctx.device(), false, &k_new));
    STRIA_RETURN_IF_ERROR(AttentionTensor(call.v_new, "v_new", 4, ctx.device(), false, &v_new));
    STRIA_RETURN_IF_ERROR(be.CheckMemory(k_new.data, "k_new"));
    STRIA_RETURN_IF_ERROR(be.CheckMemory(v_new.data, "v_new"));
    STRIA_RETURN_IF_ERROR(ExpectShape(k_new, "k_new", {s.B, s.T, s.Hkv, s.D}, "[B, T, Hkv, D] with q's B, T, D"));
    STRIA_RETURN_IF_ERROR(ExpectShape(v_new, "v_new", {s.B, s.T, s.Hkv, s.D}, "like k_new"));
    STRIA_RETURN_IF_ERROR(ExpectDType(k_new, "k_new", s.dtype));
    STRIA_RETURN_IF_ERROR(ExpectDType(v_new, "v_new", s.dtype));
  }

  STRIA_RETURN_IF_ERROR(CheckSinks(ctx, call.params, false, &c));
  STRIA_RETURN_IF_ERROR(CheckServingOutputs(ctx, call.out, call.lse, w.q, &c.out, &c.lse));
  vd->lse_given = call.lse != nullptr;

  s.scale = as.scale =
      call.params->softmax_scale > 0.f ? call.params->softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  s.softcap = as.softcap;
  s.causal = c.causal;
  s.window_left = mask.window_left;
  w.q_pos.resize(static_cast<size_t>(s.B * s.T));
  const int64_t ek = k_new.elem_bytes(), ev = v_new.elem_bytes();
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t len = cv.lens[static_cast<size_t>(b)];
    for (int64_t t = 0; t < s.T; ++t) w.q_pos[static_cast<size_t>(b * s.T + t)] = len + t;
    // This rank's keys of sequence b, the new ones included (they are stored first), from the
    // first that some query sees.
    STRIA_RETURN_IF_ERROR(cv.AddSegments(b, len + added, &w.segments, FirstSeenPosition(len, s.window_left)));
    for (int64_t t = 0; t < added; ++t) {
      const char* kr = static_cast<const char*>(k_new.data) + (b * k_new.strides[0] + t * k_new.strides[1]) * ek;
      const char* vr = static_cast<const char*>(v_new.data) + (b * v_new.strides[0] + t * v_new.strides[1]) * ev;
      STRIA_RETURN_IF_ERROR(cv.AddAppend(b, len + t, kr, vr, k_new.strides[2] * ek, v_new.strides[2] * ev, &w.appends));
    }
  }
  const uint64_t h = HashMix(HashMix(cv.Hash(0xcbf29ce484222325ull), static_cast<uint64_t>(s.window_left)),
                             static_cast<uint64_t>(added));
  c.call_hash = h == 0 ? 1 : h;
  return Status::Ok();
}

}  // namespace

Status AttentionDecode(Context& ctx, const DecodeCall& call) {
  STRIA_RETURN_IF_ERROR(ctx.Usable());
  ValidatedDecode vd;
  Status local = ValidateDecode(ctx, call, &vd);
  Backend& be = ctx.backend();
  const int n = ctx.world_size(), r = ctx.rank();
  const size_t floats = DecodePartialFloats(vd.work.shape), bytes = floats * sizeof(float);
  // Every rank's records, rank by rank, where the merge reads them: in the backend's memory where
  // it merges on its device, else in host memory (a host backend's ring buffer).
  const bool on_device = be.MergesOnDevice();
  void* all = nullptr;
  void* own = nullptr;
  if (local.ok() && (on_device || n > 1))
    local = ctx.RingBuffer(kAllPartialsSlot, bytes * static_cast<size_t>(n), &all);
  if (local.ok() && !on_device) local = ctx.RingBuffer(kPartialSlot, bytes, &own);
  uint64_t seq = 0;
  STRIA_RETURN_IF_ERROR(AgreeOnCall(ctx, RingOp::kDecode, local, vd.call, &seq));
  ctx.traffic() = Traffic();

  StepTimer timer(be);
  timer.ComputeBegin();
  vd.work.stream = vd.call.stream;
  float* mine = on_device ? static_cast<float*>(all) + static_cast<size_t>(r) * floats : static_cast<float*>(own);
  const TensorView* sinks = vd.call.sinks_given ? &vd.call.sinks : nullptr;
  const TensorView* lse = vd.lse_given ? &vd.call.lse : nullptr;
  if (n == 1) {  // a world of one: the decode writes the result itself
    vd.work.finish_out = &vd.call.out;
    vd.work.finish_lse = lse;
    vd.work.finish_sinks = sinks;
  }
  Status st = be.Decode(vd.work, mine);
  if (st.ok()) st = ctx.CheckNotAborted();
  if (!st.ok()) return ctx.Fail(st);
  // Over a transport that orders its transfers on the device (NCCL), the records are gathered
  // after the decode's kernels and merged after the gather without the host waiting for either
  // (ring_order.h); it waits for the gather only once the merge is queued.
  RingOrder order(be, ctx.transport(), ctx.timeout_s(), vd.call.stream);
  if (on_device && n > 1 && order.on_device()) {
    const std::string what = Format("decode partials of call #%llu", static_cast<unsigned long long>(seq));
    std::vector<RequestId> gather;
    st = order.BeforePosting();
    if (st.ok())
      st = ctx.transport().AllGatherInPlaceOnDevice(all, bytes, RingTag(seq, 1, MessageKind::kPartial), &gather);
    for (size_t i = 0; i < gather.size() && st.ok(); ++i) st = order.Arrived(gather[i], what);
    if (!st.ok()) return ctx.Fail(st);
    timer.ComputeEnd();
    ctx.traffic().messages = static_cast<uint64_t>(n - 1);
    ctx.step_times().assign(1, timer.Finish());
    st = be.DecodeMerge(vd.work, static_cast<const float*>(all), n, sinks, vd.call.out, lse);
    if (st.ok()) st = order.Finish();
    if (st.ok()) st = ctx.CheckNotAborted();
    return st.ok() ? st : ctx.Fail(st);
  }
  if (st.ok() && on_device && n > 1) st = be.SyncStream(vd.call.stream);  // the records written
  if (!st.ok()) return ctx.Fail(st);
  timer.ComputeEnd();
  if (n > 1) {
    // Every rank's records gathered into `all`: where they lie, device to device, on a device
    // backend (step 1: a partial's tag never has step 0, ring_common.h); else by the transport's
    // all-gather in host memory.
    const std::string what = Format("decode partials of call #%llu", static_cast<unsigned long long>(seq));
    st = on_device ? ctx.transport().AllGatherInPlace(all, bytes, RingTag(seq, 1, MessageKind::kPartial),
                                                      ctx.timeout_s(), what.c_str())
                   : ctx.transport().AllGather(mine, all, bytes, ctx.timeout_s(), what.c_str());
    if (!st.ok()) return ctx.Fail(st);
    ctx.traffic().messages = static_cast<uint64_t>(n - 1);
  }
  ctx.step_times().assign(1, timer.Finish());
  if (n > 1) st = be.DecodeMerge(vd.work, static_cast<const float*>(all), n, sinks, vd.call.out, lse);
  if (st.ok()) st = ctx.CheckNotAborted();
  return st.ok() ? st : ctx.Fail(st);
}

}  // namespace stria
