// The keys a decode CTA's query rows may see, shared by the SIMT (decode.cuh) and tensor-core
// (decode_mma.cuh) decode kernels. Plain integer logic, so that the emulator tests and the host
// can use it as the kernels do.
#pragma once

#include <cstdint>

#include "cuda/decode_params.h"
#include "cuda/device_api.cuh"
#include "cuda/tile_mask.cuh"

namespace stria {
namespace cuda {

// The positions the CTA's rows may see: none past the last row's (causal), none more than
// window_left before the first row's.
struct DecodeSpan {
  int64_t q_first, q_last;

  // Of a tile's n keys at positions pos_first + j * stride (stride >= 1), the range [*lo, *hi)
  // that holds every key some row sees (empty: a tile neither loaded nor computed). A key outside
  // it is hidden from every row: its probability is 0 in every row, and the product with V must
  // not take its row at all, since 0 times an infinite V is NaN (and a cache's slots past the
  // window may hold anything).
  STRIA_HD void SeenKeys(const DecodeArgs& a, int64_t pos_first, int64_t stride, int n, int* lo, int* hi) const {
    int64_t l = 0, h = n;
    if (a.causal) h = q_last < pos_first ? 0 : MinI(h, (q_last - pos_first) / stride + 1);
    if (a.window_left >= 0) {
      const int64_t first = q_first - a.window_left;  // the earliest position a row sees
      if (first > pos_first) l = MinI(h, (first - pos_first + stride - 1) / stride);
    }
    *lo = static_cast<int>(MinI(l, h));
    *hi = static_cast<int>(h);
  }
};

}  // namespace cuda
}  // namespace stria
