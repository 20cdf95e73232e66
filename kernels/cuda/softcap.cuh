// Logit softcapping (stria.h, params->softcap) in the CUDA kernels: a score s = scale·q·k becomes
// cap·tanh(s / cap) before the mask. The kernels' softmax works in the log2 domain, so the capped
// score is cap·log2(e)·tanh(scale·q·k / cap) there.
//
// Whether a call caps is the same for every thread of a launch, and the tensor-core kernels test it
// once per tile (WithSoftcap), around loops compiled twice, never inside them: a test per element
// splits the unrolled loops into a block per element, which stops the compiler from interleaving
// their exponentials and multiplies and cost the uncapped kernels a third of their speed on an H200
// (the kernels' scores and the forward's online softmax, measured beside the same kernels without
// it). The per-element form (Log2Score) stays for the SIMT and decode kernels, whose loops are not
// unrolled across elements.
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

// Whether a loop caps, as a type: the argument WithSoftcap passes to its function.
template <bool kCap>
struct CapTag {
  static constexpr bool kCapped = kCap;
};

// f(CapTag<true>{}) when the call caps its scores, else f(CapTag<false>{}): f is a generic lambda
// whose loops read decltype(tag)::kCapped, so each is compiled once capped and once not.
template <typename F>
STRIA_DEVICE void WithSoftcap(const Softcap& c, F&& f) {
  if (c.cap_log2 > 0.f)
    f(CapTag<true>{});
  else
    f(CapTag<false>{});
}

// Log2Score with the test made at compile time.
template <bool kCapped>
STRIA_DEVICE float Log2ScoreOf(float s, float scale_log2, const Softcap& c) {
  if constexpr (kCapped) {
    return c.cap_log2 * tanhf(s * c.cap_in);
  } else {
    (void)c;
    return s * scale_log2;
  }
}

// Log2Score with the slope, the test made at compile time; without a cap the slope is 1, which the
// compiler folds away.
template <bool kCapped>
STRIA_DEVICE float Log2ScoreOf(float s, float scale_log2, const Softcap& c, float* slope) {
  if constexpr (kCapped) {
    const float t = tanhf(s * c.cap_in);
    *slope = 1.f - t * t;
    return c.cap_log2 * t;
  } else {
    (void)c;
    *slope = 1.f;
    return s * scale_log2;
  }
}

}  // namespace cuda
}  // namespace stria
