// Logit softcapping (stria.h, params->softcap) in the CUDA kernels: a score s = scale·q·k becomes
// cap·tanh(s / cap) before the mask. The kernels' softmax works in the log2 domain, so the capped
// score is cap·log2(e)·tanh(scale·q·k / cap) there. The test of whether a call caps is the same for
// every thread of a launch: a uniform branch, and the uncapped path keeps its single multiply.
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/params.h"

namespace stria {
namespace cuda {

// The raw score q·k in the log2 domain: scale·log2(e)·s, or capped.
STRIA_DEVICE float Log2Score(float s, float scale_log2, const Softcap& c) {
  return c.cap_log2 > 0.f ? c.cap_log2 * tanhf(s * c.cap_in) : s * scale_log2;
}

// Log2Score for the backward, with the factor the capped score's gradient takes on its way back to
// q·k (beside the softmax scale, which the kernels apply to dQ and dK as they always do): 1 - tanh²,
// or 1 without softcapping.
STRIA_DEVICE float Log2Score(float s, float scale_log2, const Softcap& c, float* slope) {
  if (c.cap_log2 <= 0.f) {
    *slope = 1.f;
    return s * scale_log2;
  }
  const float t = tanhf(s * c.cap_in);
  *slope = 1.f - t * t;
  return c.cap_log2 * t;
}

}  // namespace cuda
}  // namespace stria
