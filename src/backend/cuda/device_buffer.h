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
  ~DeviceBuffer() { Release(); }

  // Grows to `bytes` if smaller. The old allocation is freed only after `last_use` (an event
  // recorded after the last work that may read it; null: none is queued).
  Status Reserve(size_t bytes, const char* what, cudaEvent_t last_use) {
    if (bytes <= bytes_) return Status::Ok();
    if (ptr_ != nullptr && last_use != nullptr) STRIA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(last_use));
    Release();
    STRIA_RETURN_IF_ERROR(DeviceMalloc(bytes, what, &ptr_));
    bytes_ = bytes;
    return Status::Ok();
  }
  // Frees the allocation now. The caller's device must be the buffer's, and no queued work may
  // still use it.
  void Release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  float* f32() const { return static_cast<float*>(ptr_); }
  void* data() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace stria
