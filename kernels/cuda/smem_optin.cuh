// The shared-memory opt-in every launcher needs: kernels with more than 48 KB of dynamic shared
// memory must raise their limit first. The attribute belongs to the current device, and ranks of
// one process may sit on several GPUs, so launchers set it at every launch (host-side calls of
// a few microseconds, against kernels of milliseconds).
#pragma once

#include <cuda_runtime_api.h>

namespace stria {
namespace cuda {

// Raises `kernel`'s dynamic shared-memory limit on the current device to `bytes`, leaving the
// thread's last runtime error as it was (smem_optin.cu: why not cudaFuncSetAttribute).
cudaError_t RaiseSmemLimit(const void* kernel, int bytes);

template <typename Kernel>
cudaError_t AllowSmem(Kernel kernel, int bytes) {
  if (bytes <= 48 * 1024) return cudaSuccess;
  return RaiseSmemLimit(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace cuda
}  // namespace stria
