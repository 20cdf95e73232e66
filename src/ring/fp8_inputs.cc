#include "ring/fp8_inputs.h"

#include <algorithm>
#include <utility>

#include "ring/ring_common.h"

namespace stria {
namespace {

// A descale: NULL, or float32 [1] or [H] (H: the heads of the tensor it scales), contiguous.
Status CheckDescale(Context& ctx, const DLTensor* t, const char* name, int64_t heads, const char* heads_name,
                    TensorView* view, const TensorView** out) {
  *out = nullptr;
  if (t == nullptr) return Status::Ok();
  if (t->ndim != 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has ndim %d, expected 1 ([1] or [%s])", name, t->ndim, heads_name);
  STRIA_RETURN_IF_ERROR(AttentionTensor(t, name, 1, ctx.device(), true, view));
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckMemory(view->data, name));
  if (view->shape[0] != 1 && view->shape[0] != heads)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "%s has shape [%lld]: a descale is [1] (the tensor's) or [%s] = [%lld] (one per head)", name,
                 static_cast<long long>(view->shape[0]), heads_name, static_cast<long long>(heads));
  *out = view;
  return Status::Ok();
}

// q, k or v as FP8 input: 4-D float8_e4m3fn, last dimension contiguous, in the context's memory.
Status CheckFp8Input(Context& ctx, const DLTensor* t, const char* name, TensorView* view) {
  if (t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  if (t->ndim != 4)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has ndim %d, expected 4 ([B, L, H, D])", name, t->ndim);
  STRIA_RETURN_IF_ERROR(ViewOf(t, name, ctx.device(), view));
  if (!IsFloat8E4M3(t->dtype)) {
    char b[32];
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "%s has dtype %s but q is float8_e4m3fn: FP8 inputs are q, k and v together", name,
                 DLDataTypeName(t->dtype, b, sizeof b));
  }
  if (view->numel() > 0 && view->shape[3] > 1 && view->strides[3] != 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has stride %lld in its last dimension; it must be contiguous (1)",
                 name, static_cast<long long>(view->strides[3]));
  return ctx.backend().CheckMemory(view->data, name);
}

// The slots of the widened q, k and v (Context::RingBuffer; ring_common.h lists the others).
constexpr int kWidenedSlot = 18;

}  // namespace

Status WidenFp8Inputs(Context& ctx, const ForwardCall& call, WidenedInputs* w, ForwardCall* widened_call) {
  *widened_call = call;
  if (call.q != nullptr && !IsFloat8E4M3(call.q->dtype)) {
    char b[32];
    for (const auto& [t, name] : {std::pair{call.k, "k"}, {call.v, "v"}})
      if (t != nullptr && IsFloat8E4M3(t->dtype))
        return Error(STRIA_ERROR_INVALID_ARGUMENT,
                     "%s has dtype float8_e4m3fn but q is %s: FP8 inputs are q, k and v together", name,
                     DLDataTypeName(call.q->dtype, b, sizeof b));
  }
  if (call.q == nullptr || !IsFloat8E4M3(call.q->dtype) || call.params == nullptr) return Status::Ok();
  const stria_attention_params_t* p = call.params;
  const bool descales = p->struct_size >= sizeof(stria_attention_params_t);
  TensorView views[3], out;
  const char* names[3] = {"q", "k", "v"};
  const DLTensor* inputs[3] = {call.q, call.k, call.v};
  for (int i = 0; i < 3; ++i) STRIA_RETURN_IF_ERROR(CheckFp8Input(ctx, inputs[i], names[i], &views[i]));
  STRIA_RETURN_IF_ERROR(AttentionTensor(call.out, "out", 4, ctx.device(), false, &out));
  // The shape the widened call will have, for the backend's judgement of it and of the stream
  // before anything is queued on that stream (shapes that do not match fail in the call's checks).
  AttentionShape s;
  s.B = views[0].shape[0];
  s.L = views[0].shape[1];
  s.Hq = views[0].shape[2];
  s.D = views[0].shape[3];
  s.Hkv = views[1].shape[2];
  s.dtype = out.dtype;
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckSupported(s, call.stream));
  TensorView scale_views[3];
  const TensorView* scales[3] = {nullptr, nullptr, nullptr};
  if (descales) {
    const DLTensor* given[3] = {p->q_descale, p->k_descale, p->v_descale};
    const char* scale_names[3] = {"params->q_descale", "params->k_descale", "params->v_descale"};
    const char* heads_names[3] = {"Hq", "Hkv", "Hkv"};
    for (int i = 0; i < 3; ++i)
      STRIA_RETURN_IF_ERROR(
          CheckDescale(ctx, given[i], scale_names[i], views[i].shape[2], heads_names[i], &scale_views[i], &scales[i]));
  }
  // A backend that takes them as they are (the Hopper FP8 kernel) gets them so, on a plain ring.
  if (ctx.ulysses_size() == 1 && ctx.backend().TakesFp8(s, views[0])) {
    Fp8Inputs& f = widened_call->fp8;
    f.on = true;
    const float** data[3] = {&f.q_descale, &f.k_descale, &f.v_descale};
    int* step[3] = {&f.q_step, &f.k_step, &f.v_step};
    for (int i = 0; i < 3; ++i) {
      *data[i] = scales[i] != nullptr ? static_cast<const float*>(scales[i]->data) : nullptr;
      *step[i] = scales[i] != nullptr && scales[i]->shape[0] > 1 ? 1 : 0;  // [H]: one a head
    }
    widened_call->fp8_mode = ForwardCall::Fp8::kNative;
    return Status::Ok();
  }
  DLTensor* widened[3] = {&w->q, &w->k, &w->v};
  for (int i = 0; i < 3; ++i) {
    const size_t bytes = static_cast<size_t>(views[i].numel()) * static_cast<size_t>(DTypeSize(out.dtype));
    void* dst = nullptr;
    STRIA_RETURN_IF_ERROR(ctx.RingBuffer(kWidenedSlot + i, std::max<size_t>(1, bytes), &dst));
    STRIA_RETURN_IF_ERROR(ctx.backend().WidenFp8(views[i], scales[i], out.dtype, dst, call.stream));
    std::copy(views[i].shape, views[i].shape + 4, w->shape[i]);
    DLTensor& t = *widened[i];
    t = DLTensor{};
    t.data = dst;
    t.device = ctx.device();
    t.ndim = 4;
    t.dtype = out.dl_dtype;
    t.shape = w->shape[i];
  }
  widened_call->q = &w->q;
  widened_call->k = &w->k;
  widened_call->v = &w->v;
  widened_call->fp8_mode = ForwardCall::Fp8::kWidened;
  return Status::Ok();
}

}  // namespace stria
