#include "ring/arguments.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "core/raw_enum.h"
#include "core/struct_size.h"
#include "engine/plan_registry.h"
#include "ring/grid.h"
#include "ring/grid_heads.h"

namespace stria {
namespace {

// The params struct grew at its end: `plan` in 0.3, the mask and score fields from `cu_seqlens`
// on in 0.4, the FP8 descales in 0.7. A caller built against an older header passes the smaller
// struct, whose fields then keep their defaults.
constexpr size_t kParamsV1 = offsetof(stria_attention_params_t, plan);
constexpr size_t kParamsV2 = offsetof(stria_attention_params_t, cu_seqlens);
constexpr size_t kParamsV3 = offsetof(stria_attention_params_t, q_descale);

}  // namespace

// Reads params: its layout, causal flag, plan, softcap and sinks into *c, and its mask (documents
// and window) into *mask, merged with the one a _documents or _window call passes as arguments.
Status CheckParams(const stria_attention_params_t* p, const DocumentsArg& args, ValidatedCall* c, DocumentsArg* mask) {
  if (p == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "params is NULL (use stria_attention_params_init)");
  const size_t size = p->struct_size, full = sizeof(stria_attention_params_t);
  if (size != kParamsV1 && size != kParamsV2 && size != kParamsV3 && size < full)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->struct_size is %zu, the size of no stria_attention_params_t (%zu, %zu, %zu or %zu): set "
                 "it with stria_attention_params_init",
                 size, kParamsV1, kParamsV2, kParamsV3, full);
  STRIA_RETURN_IF_ERROR(CheckStructSize(p, size, std::min(size, full), "params", "stria_attention_params_init"));
  c->plan.reset();
  if (size > kParamsV1 && p->plan != nullptr) {
    c->plan = LookupPlan(p->plan);
    if (!c->plan)
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "params->plan %p is not a live plan (destroyed already?)",
                   static_cast<void*>(p->plan));
  }
  if (!ValidLayout(RawEnum(p->layout)))
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "params->layout %d is not a layout (0 contiguous, 1 striped, 2 zigzag)",
                 RawEnum(p->layout));
  if (!std::isfinite(p->softmax_scale) || p->softmax_scale < 0.f)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "params->softmax_scale %g must be finite and >= 0 (0: 1/sqrt(D))",
                 static_cast<double>(p->softmax_scale));
  c->layout = p->layout;
  c->causal = p->causal != 0;
  c->shape.softcap = 0.f;
  c->sinks_given = false;
  c->dsinks_given = false;
  *mask = args;
  if (size < kParamsV3) return Status::Ok();
  if (!std::isfinite(p->softcap) || p->softcap < 0.f)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "params->softcap %g must be finite and >= 0 (0: no softcapping)",
                 static_cast<double>(p->softcap));
  c->shape.softcap = p->softcap;
  c->sinks_given = p->sinks != nullptr;
  c->dsinks_given = p->dsinks != nullptr;
  const bool documents = p->cu_seqlens != nullptr || p->num_seqs != 0;
  const bool window = p->window_left != -1 || p->window_right != -1;
  if (documents || window) {
    if (args.given || args.window_left != -1 || args.window_right != -1)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "params sets %s and the call passes its mask as arguments too: give it one way (the "
                   "_documents and _window calls take params without a mask)",
                   documents ? "cu_seqlens/num_seqs" : "a window");
    *mask = DocumentsArg{documents, p->cu_seqlens, p->num_seqs, p->window_left, p->window_right};
  }
  // The descales belong to FP8 inputs, which a forward has handled before it gets here (widened,
  // or marked for a backend that takes them as they are: fp8_inputs.h).
  if (size >= full && !c->fp8_inputs)
    for (const auto& [t, name] :
         {std::pair{p->q_descale, "q_descale"}, {p->k_descale, "k_descale"}, {p->v_descale, "v_descale"}})
      if (t != nullptr)
        return Error(STRIA_ERROR_INVALID_ARGUMENT,
                     "params->%s is set, but descales are for float8_e4m3fn inputs, which only "
                     "stria_attention_forward takes: pass NULL",
                     name);
  return Status::Ok();
}

namespace {
std::string Dims(const TensorView& v) {
  return ShapeString(v);
}
}  // namespace

Status ExpectShape(const TensorView& v, const char* name, std::initializer_list<int64_t> want, const char* what) {
  size_t i = 0;
  bool same = static_cast<size_t>(v.ndim) == want.size();
  for (int64_t w : want) {
    if (same && v.shape[i] != w) same = false;
    ++i;
  }
  if (same) return Status::Ok();
  std::string ws = "[";
  i = 0;
  for (int64_t w : want) ws += (i++ ? ", " : "") + std::to_string(w);
  ws += "]";
  return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has shape %s, expected %s (%s)", name, Dims(v).c_str(), ws.c_str(),
               what);
}

Status ExpectDType(const TensorView& v, const char* name, DType want) {
  if (v.dtype == want) return Status::Ok();
  return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s is %s but q is %s: all attention tensors share one dtype", name,
               DTypeName(v.dtype), DTypeName(want));
}

namespace {

// The shapes shared by forward and backward: q, k, v and the derived attention shape.
Status CheckQKV(Context& ctx, const DLTensor* q, const DLTensor* k, const DLTensor* v,
                const stria_attention_params_t* p, const DocumentsArg& args, void* stream, ValidatedCall* c,
                const DType* fp8_as = nullptr) {
  const DLDevice dev = ctx.device();
  DocumentsArg documents;
  STRIA_RETURN_IF_ERROR(CheckParams(p, args, c, &documents));
  STRIA_RETURN_IF_ERROR(AttentionTensor(q, "q", 4, dev, false, &c->q, fp8_as));
  STRIA_RETURN_IF_ERROR(AttentionTensor(k, "k", 4, dev, false, &c->k, fp8_as));
  STRIA_RETURN_IF_ERROR(AttentionTensor(v, "v", 4, dev, false, &c->v, fp8_as));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(c->q.data, "q"));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(c->k.data, "k"));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(c->v.data, "v"));
  AttentionShape& s = c->shape;
  s.B = c->q.shape[0];
  s.L = c->q.shape[1];
  s.Hq = c->q.shape[2];
  s.D = c->q.shape[3];
  s.Hkv = c->k.shape[2];
  s.dtype = c->q.dtype;
  // D is the backend's to judge (UNSUPPORTED naming what it supports); the others must be >= 1.
  if (s.B < 1 || s.L < 1 || s.Hq < 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "q has shape %s: B, L and Hq of [B, L, Hq, D] must be >= 1",
                 Dims(c->q).c_str());
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckSupported(s, stream));
  c->stream = stream;
  if (s.Hkv < 1 || s.Hq % s.Hkv != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "k has %lld heads, which must divide q's %lld heads (GQA/MQA)",
                 static_cast<long long>(s.Hkv), static_cast<long long>(s.Hq));
  STRIA_RETURN_IF_ERROR(ExpectShape(c->k, "k", {s.B, s.L, s.Hkv, s.D}, "[B, L, Hkv, D] with q's B, L and D"));
  STRIA_RETURN_IF_ERROR(ExpectShape(c->v, "v", {s.B, s.L, s.Hkv, s.D}, "like k"));
  STRIA_RETURN_IF_ERROR(ExpectDType(c->k, "k", s.dtype));
  STRIA_RETURN_IF_ERROR(ExpectDType(c->v, "v", s.dtype));
  const Plan* plan = c->plan.get();
  int64_t seq_len = s.L * ctx.world_size();
  if (plan != nullptr) {
    seq_len = plan->seq_len();
    // On a grid the plan places tokens on the ring of groups, each group's slots cut into U pieces.
    const int U = ctx.ulysses_size();
    if (plan->world_size() != ctx.ring_size())
      return U == 1 ? Error(STRIA_ERROR_INVALID_ARGUMENT, "params->plan is for world_size %d, but the context's is %d",
                            plan->world_size(), ctx.world_size())
                    : Error(STRIA_ERROR_INVALID_ARGUMENT,
                            "params->plan is for world_size %d, but the context's grid is a ring of %d groups of %d "
                            "(a plan on a grid is made for the ring of groups)",
                            plan->world_size(), ctx.ring_size(), U);
    if (plan->local_len() % U != 0 || plan->local_len() / U != s.L || plan->batch() != s.B)
      return Error(
          STRIA_ERROR_INVALID_ARGUMENT,
          "q has shape %s, but params->plan wants B = %lld batch rows of local_len = %lld slots (its "
          "stria_plan_get_info)%s",
          Dims(c->q).c_str(), static_cast<long long>(plan->batch()), static_cast<long long>(plan->local_len()),
          U == 1 ? ""
                 : Format(", of which each member of a group of %d holds local_len / %d (a multiple of %d)", U, U, U)
                       .c_str());
  } else {
    // On a grid the layout is the ring's: R positions, this rank's group at g (DESIGN.md).
    STRIA_RETURN_IF_ERROR(CheckLayout(c->layout, seq_len, ctx.ring_size(), ctx.ring_rank()));
  }
  if (ctx.ulysses_size() > 1) STRIA_RETURN_IF_ERROR(CheckGridHeads(ctx.ulysses_size(), s));
  if (documents.given) {
    // On a CUDA context the boundaries may be a device tensor: read once here, on the call's stream.
    STRIA_RETURN_IF_ERROR(Documents::CheckCount(documents.cu_seqlens, documents.num_seqs, seq_len));
    const size_t count = static_cast<size_t>(s.B * (documents.num_seqs + 1));
    std::vector<int64_t> staged;
    const int64_t* host = nullptr;
    STRIA_RETURN_IF_ERROR(ctx.backend().ReadOnHost(documents.cu_seqlens, count, stream, "cu_seqlens", &staged, &host));
    if (plan != nullptr) {
      if (!plan->SameBoundaries(host, s.B, documents.num_seqs))
        return Error(STRIA_ERROR_INVALID_ARGUMENT,
                     "cu_seqlens are not the boundaries params->plan was made from: a plan serves the documents it "
                     "was made for (the plain calls take them from the plan)");
    } else {
      STRIA_RETURN_IF_ERROR(c->documents.Set(host, documents.num_seqs, s.B, seq_len));
    }
  }
  if (plan != nullptr) {
    // The window as the layouts' path normalises it (Documents::SetWindow), checked the same way.
    Documents window;
    STRIA_RETURN_IF_ERROR(window.SetWindow(documents.window_left, documents.window_right, s.B, seq_len));
    c->mask.causal = c->causal;
    c->mask.window_left = documents.window_left >= seq_len - 1 ? -1 : documents.window_left;
    c->mask.window_right = documents.window_right >= seq_len - 1 ? -1 : documents.window_right;
  } else {
    STRIA_RETURN_IF_ERROR(c->documents.SetWindow(documents.window_left, documents.window_right, s.B, seq_len));
  }
  s.scale = p->softmax_scale > 0.f ? p->softmax_scale : 1.0f / std::sqrt(static_cast<float>(s.D));
  return Status::Ok();
}

}  // namespace

Status CheckWritable(const TensorView& v, const char* name, Role role) {
  return role == Role::kInput ? Status::Ok() : CheckNoBroadcast(v, name);
}

namespace {

Status CheckLse(Context& ctx, const DLTensor* t, const char* name, const AttentionShape& s, Role role,
                TensorView* out) {
  STRIA_RETURN_IF_ERROR(AttentionTensor(t, name, 3, ctx.device(), true, out));
  STRIA_RETURN_IF_ERROR(CheckWritable(*out, name, role));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(out->data, name));
  return ExpectShape(*out, name, {s.B, s.Hq, s.L}, "[B, Hq, L] float32");
}

Status CheckLike(Context& ctx, const DLTensor* t, const char* name, const TensorView& like, const char* like_name,
                 Role role, TensorView* out) {
  STRIA_RETURN_IF_ERROR(AttentionTensor(t, name, 4, ctx.device(), false, out));
  STRIA_RETURN_IF_ERROR(CheckWritable(*out, name, role));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(out->data, name));
  std::string what = std::string("like ") + like_name;
  STRIA_RETURN_IF_ERROR(
      ExpectShape(*out, name, {like.shape[0], like.shape[1], like.shape[2], like.shape[3]}, what.c_str()));
  return ExpectDType(*out, name, like.dtype);
}

// What ranks compare of a plan's call: the plan (its boundaries and config) and the window.
uint64_t PlanCallHash(const Plan& plan, const MaskSpec& mask) {
  uint64_t h = plan.Hash();
  for (int64_t x : {mask.window_left, mask.window_right}) h = (h ^ static_cast<uint64_t>(x)) * 0x100000001b3ull;
  return h == 0 ? 1 : h;
}

}  // namespace

BlockMask MaskOfBlock(const ValidatedCall& c, int world_size, int q_rank, int k_rank, Documents::Bounds* bounds) {
  if (c.plan != nullptr) {
    // Every block of a plan is a document mask over the whole rectangle: the plan's bounds carry the
    // causal cut and the padding as well.
    const int64_t B = c.shape.B, L = c.shape.L;
    BlockMask mask;
    mask.q_end = mask.k_end = L;
    bounds->lo.resize(static_cast<size_t>(B * L));
    bounds->hi.resize(static_cast<size_t>(B * L));
    bool any = false;
    int64_t k_lo = L, k_hi = 0;
    for (int64_t b = 0; b < B; ++b) {
      int64_t* lo = bounds->lo.data() + b * L;
      int64_t* hi = bounds->hi.data() + b * L;
      if (!c.plan->Bounds(b, q_rank, k_rank, c.mask, lo, hi)) continue;
      any = true;
      k_lo = std::min(k_lo, lo[0]);  // both bounds never decrease along the queries
      k_hi = std::max(k_hi, hi[L - 1]);
    }
    if (!any) {
      mask.q_end = 0;  // empty
      return mask;
    }
    mask.doc_lo = bounds->lo.data();
    mask.doc_hi = bounds->hi.data();
    mask.doc_batch_stride = L;
    mask.k_begin = k_lo;
    mask.k_end = k_hi;
    return mask;
  }
  BlockMask mask = ClassifyBlock(c.layout, c.causal, world_size, c.shape.L, q_rank, k_rank);
  if (!mask.empty()) c.documents.Apply(c.layout, world_size, c.shape.L, q_rank, k_rank, bounds, &mask);
  return mask;
}

int RingSteps(const ValidatedCall& c, int world_size) {
  if (c.plan != nullptr) return c.plan->RingSteps(c.mask);
  if (!c.documents.active()) return world_size;  // every step has work somewhere
  // At step s rank q holds the block of rank q - s: the last step some rank's block is reached at.
  for (int step = world_size - 1; step > 0; --step)
    for (int q = 0; q < world_size; ++q) {
      const int k = (q - step + world_size) % world_size;
      const BlockMask mask = ClassifyBlock(c.layout, c.causal, world_size, c.shape.L, q, k);
      if (c.documents.Reaches(c.layout, world_size, c.shape.L, q, k, mask)) return step + 1;
    }
  return 1;
}

namespace {

RingMessage MessageOf(std::vector<WirePiece> pieces, size_t whole_bytes) {
  RingMessage m;
  m.bytes = PiecesBytes(pieces);
  m.whole = m.bytes == whole_bytes;  // pieces never overlap: every byte
  m.pieces = m.whole ? std::vector<WirePiece>{{0, whole_bytes}} : std::move(pieces);
  return m;
}

}  // namespace

RingMessage KVMessage(const ValidatedCall& c, const Backend& be, bool backward, size_t wire_bytes, int holder,
                      int step) {
  if (c.plan == nullptr) return MessageOf({{0, wire_bytes}}, wire_bytes);
  std::vector<int64_t> rows(static_cast<size_t>(c.shape.B));
  c.plan->RowsStillNeeded(holder, step, c.mask, rows.data());
  std::vector<WirePiece> pieces;
  be.KVWirePieces(c.shape, backward, rows.data(), &pieces);
  return MessageOf(std::move(pieces), wire_bytes);
}

RingMessage DKVMessage(const ValidatedCall& c, int holder, size_t dkv_bytes) {
  if (c.plan == nullptr) return MessageOf({{0, dkv_bytes}}, dkv_bytes);
  std::vector<int64_t> rows(static_cast<size_t>(c.shape.B));
  c.plan->RowsStillNeeded(holder, 0, c.mask, rows.data());
  return MessageOf(DKVPieces(c.shape, rows.data()), dkv_bytes);
}

// params->sinks and, in a backward, params->dsinks: float32 [Hq] in the context's memory.
Status CheckSinks(Context& ctx, const stria_attention_params_t* p, bool backward, ValidatedCall* c) {
  if (c->sinks_given) {
    STRIA_RETURN_IF_ERROR(AttentionTensor(p->sinks, "params->sinks", 1, ctx.device(), true, &c->sinks));
    STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(c->sinks.data, "params->sinks"));
    STRIA_RETURN_IF_ERROR(
        ExpectShape(c->sinks, "params->sinks", {c->shape.Hq}, "[Hq] float32, a logit per query head"));
  }
  if (!backward || !c->dsinks_given) return Status::Ok();
  if (!c->sinks_given)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->dsinks is set but params->sinks is NULL: the sinks' gradient needs the forward's sinks");
  STRIA_RETURN_IF_ERROR(AttentionTensor(p->dsinks, "params->dsinks", 1, ctx.device(), true, &c->dsinks));
  STRIA_RETURN_IF_ERROR(CheckWritable(c->dsinks, "params->dsinks", Role::kOutput));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(c->dsinks.data, "params->dsinks"));
  return ExpectShape(c->dsinks, "params->dsinks", {c->shape.Hq}, "like params->sinks");
}

Status ValidateForward(Context& ctx, const ForwardCall& call, ValidatedCall* c) {
  c->fp8_inputs = call.fp8_mode != ForwardCall::Fp8::kNone;
  // FP8 inputs the backend takes as they are: views of out's dtype over the e4m3 tensors.
  DType out_dtype = DType::kF32;
  const bool native =
      call.fp8_mode == ForwardCall::Fp8::kNative && call.out != nullptr && DTypeFromDL(call.out->dtype, &out_dtype);
  STRIA_RETURN_IF_ERROR(CheckQKV(ctx, call.q, call.k, call.v, call.params, call.documents, call.stream, c,
                                 native ? &out_dtype : nullptr));
  if (native) c->shape.fp8 = call.fp8;
  STRIA_RETURN_IF_ERROR(CheckSinks(ctx, call.params, false, c));
  STRIA_RETURN_IF_ERROR(CheckLike(ctx, call.out, "out", c->q, "q", Role::kOutput, &c->out));
  return CheckLse(ctx, call.lse, "lse", c->shape, Role::kOutput, &c->lse);
}

Status ValidateBackward(Context& ctx, const BackwardCall& call, ValidatedCall* c) {
  STRIA_RETURN_IF_ERROR(CheckQKV(ctx, call.q, call.k, call.v, call.params, call.documents, call.stream, c));
  STRIA_RETURN_IF_ERROR(CheckSinks(ctx, call.params, true, c));
  STRIA_RETURN_IF_ERROR(CheckLike(ctx, call.out, "out", c->q, "q", Role::kInput, &c->out));
  STRIA_RETURN_IF_ERROR(CheckLse(ctx, call.lse, "lse", c->shape, Role::kInput, &c->lse));
  STRIA_RETURN_IF_ERROR(CheckLike(ctx, call.dout, "dout", c->q, "q", Role::kInput, &c->dout));
  STRIA_RETURN_IF_ERROR(CheckLike(ctx, call.dq, "dq", c->q, "q", Role::kOutput, &c->dq));
  STRIA_RETURN_IF_ERROR(CheckLike(ctx, call.dk, "dk", c->k, "k", Role::kOutput, &c->dk));
  return CheckLike(ctx, call.dv, "dv", c->k, "k", Role::kOutput, &c->dv);
}

Status AgreeOnCall(Context& ctx, RingOp op, const Status& local, const ValidatedCall& c, uint64_t* seq) {
  *seq = ctx.NextCallSeq();
  const uint64_t tag = ctx.TakeCallTag();
  if (ctx.world_size() == 1) return local;
  CallSignature sig;
  InitSignature(op, *seq, tag, &sig);
  if (!local.ok()) {
    MarkFailed(local, &sig);
  } else {
    sig.layout = c.plan != nullptr ? STRIA_LAYOUT_STRIPED : c.layout;  // a plan's call has no layout
    sig.causal = c.causal ? 1 : 0;
    sig.scale = c.shape.scale;
    sig.dtype = static_cast<int32_t>(c.shape.dtype);
    sig.B = c.shape.B;
    sig.L = c.shape.L;
    sig.Hq = c.shape.Hq;
    sig.Hkv = c.shape.Hkv;
    sig.D = c.shape.D;
    // Ranks whose backends lay out K/V blocks differently (a CPU and a GPU rank, say) would
    // exchange messages of different sizes and meanings: agree on the format too.
    sig.kv_wire = static_cast<uint32_t>(ctx.backend().KVWireFor(c.shape, op == RingOp::kBackward).format);
    sig.documents = op == RingOp::kDecode || op == RingOp::kPrefill ? c.call_hash
                    : c.plan != nullptr                             ? PlanCallHash(*c.plan, c.mask)
                                                                    : c.documents.Hash();
    sig.softcap = c.shape.softcap;
    sig.sinks = c.sinks_given ? 1 : 0;
    sig.grid = ctx.ulysses_size();
    if (sig.grid > 1 && (op == RingOp::kForward || op == RingOp::kBackward))
      sig.grid_chunks = GridChunkCount(ctx, c.shape);
  }
  std::vector<CallSignature> all(static_cast<size_t>(ctx.world_size()));
  const std::string what = Format("%s call #%llu", RingOpName(op), static_cast<unsigned long long>(*seq));
  Status s = ctx.transport().AllGather(&sig, all.data(), sizeof sig, ctx.timeout_s(), what.c_str());
  if (!s.ok()) return ctx.Fail(s);
  if (!local.ok()) return local;
  return CheckAgreement(all.data(), ctx.world_size(), ctx.rank());
}

}  // namespace stria
