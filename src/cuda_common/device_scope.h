// Makes a device current for a scope and gives the thread its own device back afterwards, for
// the CUDA backend and the NCCL transport alike: the engine's thread, or one calling
// stria_context_abort, may be working with another GPU, and some NCCL calls (ncclCommAbort)
// switch devices themselves, so the destructor restores whatever the scope ended on.
// Header-only: each module (libstria-cuda, libstria-nccl) compiles its own copy.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace stria {

class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    cudaError_t e = cudaGetDevice(&previous_);
    if (e == cudaSuccess && previous_ != device) e = cudaSetDevice(device);
    if (e != cudaSuccess)
      status_ = Error(STRIA_ERROR_CUDA, "cudaSetDevice(%d) failed: %s (%s)", device, cudaGetErrorString(e),
                      cudaGetErrorName(e));
  }
  ~DeviceScope() {
    int now = -1;
    if (status_.ok() && cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  Status status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

}  // namespace stria
