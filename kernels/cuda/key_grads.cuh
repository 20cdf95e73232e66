// The backward's dK/dV of a ring block: fp32 partials (BwdParams::dk, ::dv, [B, L, Hkv, D]) that
// the ring adds up, or, when the block's are the call's whole result (a world of one), the
// caller's dK and dV themselves (BwdParams::dk_out, ::dv_out), so that no fp32 copy is written
// and read back only to be converted. The launch's grid covers the key tiles of all L rows, and
// the CTA of a key tile owns its rows whole: it writes every row, zeros included, so the
// backend does not clear the partials before the launch. A CTA whose keys no query of the block
// sees returns before its first barrier, and writes its zeros with ZeroKeyGrads.
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/elem_access.cuh"
#include "cuda/params.h"
#include "cuda/tile_mask.cuh"

namespace stria {
namespace cuda {

// Column c of key row j's dK (already times the softmax scale) and dV, K/V head hk of batch row b.
template <typename T>
STRIA_DEVICE void StoreKeyGrad(const BwdParams& p, int b, int hk, int64_t j, int c, float dk, float dv) {
  if (p.dk_out.data != nullptr) {
    StoreElem<T>(p.dk_out.data, b * p.dk_out.sb + j * p.dk_out.sl + hk * p.dk_out.sh + c, dk);
    StoreElem<T>(p.dv_out.data, b * p.dv_out.sb + j * p.dv_out.sl + hk * p.dv_out.sh + c, dv);
    return;
  }
  const int64_t at = ((static_cast<int64_t>(b) * p.dims.L + j) * p.dims.Hkv + hk) * p.dims.D + c;
  p.dk[at] = dk;
  p.dv[at] = dv;
}

// Zeros as the dK/dV rows [j0, j0 + rows) of K/V head hk of batch row b; each of `threads`
// threads calls it with its own index `thread` among them (a persistent kernel's consumers: not
// the CTA's thread index).
template <typename T>
STRIA_DEVICE void ZeroKeyGrads(const BwdParams& p, int b, int hk, int64_t j0, int rows, int thread, int threads) {
  const int D = p.dims.D;
  const int64_t n = MaxI(MinI(j0 + rows, p.dims.L) - j0, 0) * D;
  for (int64_t x = thread; x < n; x += threads)
    StoreKeyGrad<T>(p, b, hk, j0 + x / D, static_cast<int>(x % D), 0.f, 0.f);
}
// Every thread of the CTA.
template <typename T>
STRIA_DEVICE void ZeroKeyGrads(const BwdParams& p, int b, int hk, int64_t j0, int rows, int threads) {
  ZeroKeyGrads<T>(p, b, hk, j0, rows, static_cast<int>(threadIdx.x), threads);
}

}  // namespace cuda
}  // namespace stria
