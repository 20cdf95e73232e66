// The shared-memory opt-in every launcher needs: kernels with more than 48 KB of dynamic shared
// memory must raise their limit first. The attribute belongs to the current device, and ranks of
// one process may sit on several GPUs, so launchers set it at every launch (a host-side call of
// about a microsecond, against kernels of milliseconds).
#pragma once

#include <cuda_runtime.h>

namespace stria {
namespace cuda {

template <typename Kernel>
cudaError_t AllowSmem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  // The runtime's C entry point (the templated overload exists only for nvcc; the host build of
  // the emulator's tests calls this one too).
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
}

}  // namespace cuda
}  // namespace stria
