// Makes a device current for a scope and gives the thread its own device back afterwards, for
// the CUDA backend and the NCCL transport alike: the engine's thread, or one calling
// stria_context_abort, may be working with another GPU, and some NCCL calls (ncclCommAbort)
// switch devices themselves, so the destructor restores whatever the scope ended on.
// A thread that never chose a device has no current context, yet cudaGetDevice reports 0 for it;
// setting that 0 back would create device 0's primary context (hundreds of MiB there) for a thread
// that never used it: a process of a multi-GPU job would then hold memory on GPU 0 whenever it
// aborts or destroys a context from a fresh thread. So such a thread keeps the scope's device.
// Header-only: each module (libstria-cuda, libstria-nccl) compiles its own copy.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace stria {

// Whether the calling thread has a current CUDA context: the driver's cuCtxGetCurrent, found
// through the runtime so that the modules link only cudart. True where it cannot be found.
inline bool ThreadHasCudaContext() {
  using GetCurrent = int (*)(void**);  // CUresult cuCtxGetCurrent(CUcontext*)
  static const GetCurrent get_current = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t e = cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &found);
    if (e != cudaSuccess) (void)cudaGetLastError();  // this lookup's own error (see tensor_map.cu)
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) fn = nullptr;
    return reinterpret_cast<GetCurrent>(fn);
  }();
  void* ctx = nullptr;
  return get_current == nullptr || (get_current(&ctx) == 0 && ctx != nullptr);
}

class DeviceScope {
 public:
  explicit DeviceScope(int device) : restore_(ThreadHasCudaContext()) {
    cudaError_t e = cudaGetDevice(&previous_);
    if (e == cudaSuccess && previous_ != device) e = cudaSetDevice(device);
    if (e != cudaSuccess)
      status_ = Error(STRIA_ERROR_CUDA, "cudaSetDevice(%d) failed: %s (%s)", device, cudaGetErrorString(e),
                      cudaGetErrorName(e));
  }
  ~DeviceScope() {
    int now = -1;
    if (status_.ok() && restore_ && cudaGetDevice(&now) == cudaSuccess && now != previous_)
      (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  Status status() const { return status_; }

 private:
  const bool restore_;  // the thread had a device of its own to go back to
  int previous_ = -1;
  Status status_;
};

}  // namespace stria
