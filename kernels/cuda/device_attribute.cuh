// An attribute of the current device, for launchers that size their work by it (the persistent
// grids by the SMs, the head groups by the L2). Host code.
#pragma once

#include <cuda_runtime.h>

namespace stria {
namespace cuda {

// `attr` of the current device, or `fallback` where the runtime cannot say. Its record of that
// failure is dropped (the caller only loses an optimisation: nothing to report), and a caller's
// pending error of another kind is left as it was.
inline int CurrentDeviceAttribute(cudaDeviceAttr attr, int fallback) {
  int device = 0, value = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e == cudaSuccess) e = cudaDeviceGetAttribute(&value, attr, device);
  if (e != cudaSuccess) {
    if (cudaPeekAtLastError() == e) (void)cudaGetLastError();
    return fallback;
  }
  return value;
}

}  // namespace cuda
}  // namespace stria
