// The host side of AllowSmem (smem_optin.cuh), for the GPU build and for the runtime model of
// tests/cuda_host alike. Measured on an H200 (CUDA 13 runtime, driver 580;
// docs/gpu-runs/2026-11-28-h200/run2): cudaFuncSetAttribute resets the thread's last error even
// when it succeeds, so a stria call that raised a kernel's limit that way cleared an error the
// caller had left pending (CudaErrors.ACallersPendingErrorIsNeitherReportedNorCleared failed on
// the wgmma and TMA families, whose kernels need more than 48 KB, and passed on the others).
// cudaGetKernel (the kernel's handle, the same on every device) and the driver's
// cuKernelSetAttribute, for one device, left that error alone, as did the runtime's entry-point
// query. The runtime's cudaFuncSetAttribute stays the fallback where the driver lacks the function.
#include <cuda.h>
#include <cuda_runtime_api.h>

#include "cuda/driver_symbol.h"
#include "cuda/smem_optin.cuh"

namespace stria {
namespace cuda {
namespace {

using SetKernelAttribute = CUresult (*)(CUfunction_attribute, int, CUkernel, CUdevice);

// The driver's cuKernelSetAttribute (CUDA 12.0 and newer); null where this driver has none.
SetKernelAttribute KernelAttributeSetter() {
  static const auto fn = reinterpret_cast<SetKernelAttribute>(DriverSymbol("cuKernelSetAttribute"));
  return fn;
}

}  // namespace

cudaError_t RaiseSmemLimit(const void* kernel, int bytes) {
  const SetKernelAttribute set = KernelAttributeSetter();
  cudaKernel_t handle = nullptr;
  int device = 0;
  if (set != nullptr && cudaGetKernel(&handle, kernel) == cudaSuccess && cudaGetDevice(&device) == cudaSuccess &&
      set(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes, reinterpret_cast<CUkernel>(handle), device) ==
          CUDA_SUCCESS)
    return cudaSuccess;
  // The runtime's own call reports a failure as a cudaError_t (and records it, as any failed call).
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

}  // namespace cuda
}  // namespace stria
