// The ring collectives (DESIGN.md, "The ring"): written once against the Backend and Transport
// interfaces. At step s rank r holds the K/V block of rank (r - s) mod N; the transfer of the
// next block is posted before the current block's compute, into the other of two buffers, so
// communication hides behind compute.
#pragma once

#include "engine/context.h"

namespace stria {

struct ForwardCall {
  const stria_attention_params_t* params;
  const DLTensor *q, *k, *v;
  DLTensor *out, *lse;
  void* stream;
};

struct BackwardCall {
  const stria_attention_params_t* params;
  const DLTensor *q, *k, *v, *out, *lse, *dout;
  DLTensor *dq, *dk, *dv;
  void* stream;
};

Status RingForward(Context& ctx, const ForwardCall& call);
Status RingBackward(Context& ctx, const BackwardCall& call);

}  // namespace stria
