// The host side of AllowSmem (smem_optin.cuh). Measured on an H200 (CUDA 13 runtime, driver 580):
// cudaFuncSetAttribute resets the thread's last error even when it succeeds, so a stria call that
// set a kernel's shared-memory limit that way cleared an error the caller had left pending
// (CudaErrors.ACallersPendingErrorIsNeitherReportedNorCleared failed on the wgmma and TMA
// families, whose kernels need more than 48 KB; mma.sync's and SIMT's did not). cudaGetKernel
// (the kernel's context-independent handle) and the driver's cuKernelSetAttribute, for one
// device, leave that error alone; cudaFuncSetAttribute stays the fallback where the driver lacks
// the function.
#include <cuda.h>
#include <cuda_runtime.h>

#include <dlfcn.h>

#include "cuda/smem_optin.cuh"

namespace stria {
namespace cuda {
namespace {

using SetKernelAttribute = CUresult (*)(CUfunction_attribute, int, CUkernel, CUdevice);

// libcuda's cuKernelSetAttribute (CUDA 12.0 and newer), looked up once per process in the driver
// library the runtime has loaded (as tensor_map.cu does); null where it is not there.
SetKernelAttribute KernelAttributeSetter() {
  static const SetKernelAttribute fn = [] {
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    return reinterpret_cast<SetKernelAttribute>(driver != nullptr ? dlsym(driver, "cuKernelSetAttribute") : nullptr);
  }();
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
