// The shared-memory opt-in every launcher needs: kernels with more than 48 KB of dynamic shared
// memory must raise their limit first. The attribute belongs to the current device, and ranks of
// one process may sit on several GPUs, so launchers set it at every launch (a host-side call of
// about a microsecond, against kernels of milliseconds).
#pragma once

#include <cuda_runtime.h>

namespace stria {
namespace cuda {

#if !defined(STRIA_CUDA_EMULATE)
// Raises `kernel`'s dynamic shared-memory limit on the current device to `bytes` without touching
// the thread's last runtime error (smem_optin.cu says why not cudaFuncSetAttribute).
cudaError_t RaiseSmemLimit(const void* kernel, int bytes);
#endif

template <typename Kernel>
cudaError_t AllowSmem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
#if defined(STRIA_CUDA_EMULATE)
  // The runtime model's C entry point (the templated overload exists only for nvcc).
  return cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                              bytes);
#else
  return RaiseSmemLimit(reinterpret_cast<const void*>(kernel), bytes);
#endif
}

}  // namespace cuda
}  // namespace stria
