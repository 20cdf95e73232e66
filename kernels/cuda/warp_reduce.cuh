// Reductions across the 32 lanes of a warp, every lane getting the result.
#pragma once

#include "cuda/device_api.cuh"

namespace stria {
namespace cuda {

// fmaxf passes over NaN: a caller that must propagate one looks for it itself.
STRIA_DEVICE float WarpMax(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, shfl_xor(v, o));
  return v;
}
STRIA_DEVICE float WarpSum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += shfl_xor(v, o);
  return v;
}

}  // namespace cuda
}  // namespace stria
