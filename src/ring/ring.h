// The ring collectives (DESIGN.md, "The ring"): written once against the Backend and Transport
// interfaces. At step s rank r holds the K/V block of rank (r - s) mod N; the transfer of the
// next block is posted before the current block's compute, into the other of two buffers, so
// communication hides behind compute.
#pragma once

#include "engine/context.h"

namespace stria {

// A call's mask, unchecked: document boundaries and a sliding window. The _documents and _window
// entry points pass theirs here; every other call carries it in params (0.4), which CheckParams
// (arguments.cc) reads into the same form, refusing a mask given both ways.
struct DocumentsArg {
  bool given = false;  // false: one document per batch row
  const int64_t* cu_seqlens = nullptr;
  int64_t num_seqs = 0;
  int64_t window_left = -1, window_right = -1;  // -1: unbounded (the plain and _documents calls)
};

struct ForwardCall {
  const stria_attention_params_t* params;
  const DLTensor *q, *k, *v;
  DLTensor *out, *lse;
  void* stream;
  DocumentsArg documents{};
  // float8_e4m3fn inputs (fp8_inputs.h): kWidened, q, k and v are their widened copies; kNative,
  // they are the caller's, which the backend takes as they are, with `fp8` their descales.
  enum class Fp8 { kNone, kWidened, kNative } fp8_mode = Fp8::kNone;
  Fp8Inputs fp8{};
};

struct BackwardCall {
  const stria_attention_params_t* params;
  const DLTensor *q, *k, *v, *out, *lse, *dout;
  DLTensor *dq, *dk, *dv;
  void* stream;
  DocumentsArg documents{};
};

Status RingForward(Context& ctx, const ForwardCall& call);
Status RingBackward(Context& ctx, const BackwardCall& call);

}  // namespace stria
