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
//
// The tensor-core kernels' forms (Log2ScoreOf) take tanh as a rational function (RationalTanh),
// for the same reason: tanhf branches inside too, around two exponentials, which with the
// softmax's own exponential made three special-function results a score, half again the tensor
// cores' time for a forward tile at head dim 128. The SIMT and decode kernels' form (Log2Score)
// keeps tanhf.
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/params.h"

namespace stria {
namespace cuda {

// tanh(x) without a branch and with one special-function result (a reciprocal): x·N(x²)/D(x²) with
// N and D of degree 4 in x², both 1 at 0 (small x keep their relative precision), fitted to tanh on
// [-9, 9] for the least largest absolute error (scripts/fit_rational_tanh.py), x clamped to that
// interval (tanh(9) rounds to 1 in float). Within 4e-7 of tanh everywhere, absolute and relative
// (a few float ulps near 1); a NaN passes through the clamp's comparison. The one-instruction
// alternative, tanh.approx.f32 (relative error up to 2^-11; FlashAttention-2 and -3 cap with it),
// moves a logit near a cap of 30 by up to 0.015: the kernels' test with such logits
// (softcap_near_the_cap) passes with a tanh of that error and fails with one of 2^-10, too thin a
// margin for the 2e-2 bar.
STRIA_DEVICE float RationalTanh(float x) {
  constexpr float kClamp = 9.f;
  const float c = fabsf(x) > kClamp ? copysignf(kClamp, x) : x, u = c * c;
  const float num =
      (((1.333802757e-08f * u + 2.059610597e-05f) * u + 3.494762117e-03f) * u + 1.338032186e-01f) * u + 1.f;
  const float den =
      (((7.769457966e-07f * u + 3.284308768e-04f) * u + 2.587380819e-02f) * u + 4.671363831e-01f) * u + 1.f;
  return fast_div(c * num, den);
}

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
    return c.cap_log2 * RationalTanh(s * c.cap_in);
  } else {
    (void)c;
    return s * scale_log2;
  }
}

// The forwards' form, which keeps an uncapped score raw until its exponential (FlashAttention-3's
// order): the row max is taken over these values and multiplied into the log2 domain, and each
// probability is exp2(value · factor - that max), the factor's multiply inside the exponential's
// multiply-add. Uncapped the value is the raw score and the factor the scale in log2 units, which
// is positive (the ABI's validation of the softmax scale), so that the max of the raw scores,
// scaled, is the max of the scaled ones; capped, the tanh needs the scaled score, so the value is
// the capped score in log2 units already and the factor 1. One multiply a score fewer than
// scaling each score first.
template <bool kCapped>
STRIA_DEVICE float RawOrCapped(float s, const Softcap& c) {
  if constexpr (kCapped) {
    return Log2ScoreOf<true>(s, 0.f, c);  // the capped score does not read the scale
  } else {
    (void)c;
    return s;
  }
}

// Log2Score with the slope, the test made at compile time; without a cap the slope is 1, which the
// compiler folds away.
template <bool kCapped>
STRIA_DEVICE float Log2ScoreOf(float s, float scale_log2, const Softcap& c, float* slope) {
  if constexpr (kCapped) {
    const float t = RationalTanh(s * c.cap_in);
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
