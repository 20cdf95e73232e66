#include "serve/serving_common.h"

namespace stria {

Status CheckServingParams(Context& ctx, const stria_attention_params_t* params, bool prefill, ValidatedCall* c,
                          DocumentsArg* mask) {
  STRIA_RETURN_IF_ERROR(ctx.backend().CheckServingSupported(prefill));
  STRIA_RETURN_IF_ERROR(CheckParams(params, DocumentsArg{}, c, mask));
  if (c->plan != nullptr)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->plan is set: a serving call's cache is spread by params->layout, not by a document plan");
  if (mask->given)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->cu_seqlens is set: a serving call attends each sequence to its own cache (no documents)");
  if (mask->window_right != -1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "params->window_right is %lld: a serving call takes window_left only (-1 for window_right)",
                 static_cast<long long>(mask->window_right));
  if (mask->window_left < -1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "params->window_left %lld must be >= 0, or -1 for no window",
                 static_cast<long long>(mask->window_left));
  return Status::Ok();
}

Status CheckServingOutputs(Context& ctx, DLTensor* out, DLTensor* lse, const TensorView& q, TensorView* out_view,
                           TensorView* lse_view) {
  Backend& be = ctx.backend();
  STRIA_RETURN_IF_ERROR(AttentionTensor(out, "out", 4, ctx.device(), false, out_view));
  STRIA_RETURN_IF_ERROR(CheckWritable(*out_view, "out", Role::kOutput));
  STRIA_RETURN_IF_ERROR(be.CheckMemory(out_view->data, "out"));
  STRIA_RETURN_IF_ERROR(ExpectShape(*out_view, "out", {q.shape[0], q.shape[1], q.shape[2], q.shape[3]}, "like q"));
  STRIA_RETURN_IF_ERROR(ExpectDType(*out_view, "out", q.dtype));
  if (lse == nullptr) return Status::Ok();
  STRIA_RETURN_IF_ERROR(AttentionTensor(lse, "lse", 3, ctx.device(), true, lse_view));
  STRIA_RETURN_IF_ERROR(CheckWritable(*lse_view, "lse", Role::kOutput));
  STRIA_RETURN_IF_ERROR(be.CheckMemory(lse_view->data, "lse"));
  return ExpectShape(*lse_view, "lse", {q.shape[0], q.shape[2], q.shape[1]}, "[B, Hq, T] float32");
}

}  // namespace stria
