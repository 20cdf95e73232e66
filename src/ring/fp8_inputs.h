// FP8 inputs of a forward (stria.h, params->q_descale, k_descale, v_descale): q, k and v of dtype
// float8_e4m3fn are widened, each value times its head's descale, into tensors of out's dtype in
// the context's memory, and the call then runs on those as any other. Widening first is what lets
// every backend, family, transport, layout and plan take FP8 inputs; the K/V blocks travel the ring
// in out's dtype. A backend with a kernel for e4m3 operands (the CUDA backend on Hopper, head dim
// 128) takes them as they are instead, its K/V messages in e4m3 (docs/design/extensions.md,
// "FP8 inputs").
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
// float32, float16 or bfloat16, each descale NULL or float32 [1] or [H] in the context's memory).
// Where the backend takes such inputs as they are (Backend::TakesFp8: the Hopper FP8 kernel, on a
// ring without a grid), *widened_call is `call` marked kNative with the descales; otherwise q, k
// and v are widened into out's dtype and *widened_call is `call` on the widened tensors
// (kWidened). Without FP8 inputs *widened_call is `call` (CheckParams then refuses any descale).
Status WidenFp8Inputs(Context& ctx, const ForwardCall& call, WidenedInputs* widened, ForwardCall* widened_call);

}  // namespace stria
