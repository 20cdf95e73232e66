// FP8 inputs of a forward (stria.h, params->q_descale, k_descale, v_descale): q, k and v of dtype
// float8_e4m3fn are widened, each value times its head's descale, into tensors of out's dtype in
// the context's memory, and the call then runs on those as any other. Widening first is what lets
// every backend, family, transport, layout and plan take FP8 inputs; the K/V blocks travel the ring
// in out's dtype. (A Hopper kernel that multiplies e4m3 operands directly would take the inputs
// as they are; see docs/design/extensions.md, "FP8 inputs".)
#pragma once

#include "engine/context.h"
#include "ring/ring.h"

namespace stria {

// The widened tensors of one call: their DLTensors point into the context's FP8 slots.
struct WidenedInputs {
  DLTensor q{}, k{}, v{};
  int64_t shape[3][4] = {};
};

// If call's q is float8_e4m3fn, checks the FP8 arguments (q, k and v all float8_e4m3fn, out
// float32, float16 or bfloat16, each descale NULL or float32 [1] or [H] in the context's memory),
// widens q, k and v into out's dtype and sets *widened_call to `call` on the widened tensors.
// Otherwise *widened_call is `call` (CheckParams then refuses any descale).
Status WidenFp8Inputs(Context& ctx, const ForwardCall& call, WidenedInputs* widened, ForwardCall* widened_call);

}  // namespace stria
