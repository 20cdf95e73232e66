// Logit softcapping (stria.h, params->softcap) in the CPU kernels, shared by the float32 and the
// bf16 tile kernels.
#pragma once

#include "cpu/simd.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

// Logit softcapping of a row's scores in the log2 domain: x = in_scale * s becomes
// c2 * tanh(x / c2), c2 = softcap * log2(e) (the natural-domain cap·tanh(s / cap), times log2 e).
// Masked scores (-inf) stay -inf. `slope`, when given, gets 1 - tanh², the backward's dS factor.
// kFast: TanhFast, for the bf16 kernels (their probabilities are rounded to bf16 right after).
template <bool kFast = false>
inline void SoftcapRow(float* row, int64_t n, float in_scale, float c2, float* slope = nullptr) {
  const vf k = Splat(in_scale / c2), cv = Splat(c2), ninf = Splat(kNegInf);
  for (int64_t c = 0; c < n; c += VL) {
    const vf raw = Load(row + c);
    const vf t = kFast ? TanhFast(raw * k) : Tanh(raw * k);
    Store(row + c, raw == ninf ? ninf : cv * t);
    if (slope != nullptr) Store(slope + c, Splat(1.0f) - t * t);
  }
}

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
