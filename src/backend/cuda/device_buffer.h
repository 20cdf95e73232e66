// Device workspace that grows and is then reused across calls: after the first call of a given
// size no cudaMalloc happens on the call path.
#pragma once

#include <cstddef>

#include "cuda_common/cuda_status.h"

namespace stria {

// cudaMalloc as a Status: OUT_OF_MEMORY when the device is full, CUDA otherwise; the runtime's
// error is cleared (allocation failures are not sticky).
inline Status DeviceMalloc(size_t bytes, const char* what, void** out) {
  const cudaError_t e = cudaMalloc(out, bytes ? bytes : 256);
  if (e == cudaSuccess) return Status::Ok();
  *out = nullptr;
  cudaGetLastError();
  return Error(e == cudaErrorMemoryAllocation ? STRIA_ERROR_OUT_OF_MEMORY : STRIA_ERROR_CUDA,
               "cudaMalloc of %zu bytes for %s failed: %s", bytes, what, cudaGetErrorString(e));
}

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr_); }

  Status Reserve(size_t bytes, const char* what) {
    if (bytes <= bytes_) return Status::Ok();
    cudaFree(ptr_);  // synchronizes the device: only on growth
    ptr_ = nullptr;
    bytes_ = 0;
    STRIA_RETURN_IF_ERROR(DeviceMalloc(bytes, what, &ptr_));
    bytes_ = bytes;
    return Status::Ok();
  }
  float* f32() const { return static_cast<float*>(ptr_); }
  void* data() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace stria
