// Argument checks the serving calls (decode, prefill) share.
#pragma once

#include "ring/arguments.h"

namespace stria {

// Whether the context's backend serves, then params as a serving call reads them (CheckParams): the
// layout places the cache (and a prefill's new tokens), a left window only; no plan, no documents.
Status CheckServingParams(Context& ctx, const stria_attention_params_t* params, bool prefill, ValidatedCall* c,
                          DocumentsArg* mask);
// out like q ([B, T, Hq, D], written) and lse: NULL, or [B, Hq, T] float32.
Status CheckServingOutputs(Context& ctx, DLTensor* out, DLTensor* lse, const TensorView& q, TensorView* out_view,
                           TensorView* lse_view);

}  // namespace stria
