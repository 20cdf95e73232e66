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

// Page-locked host memory that grows and is then reused: the source of a call's small uploads.
// A copy from pageable memory makes the driver stage it through a buffer of its own, and it may
// wait for the stream first; from page-locked memory the copy is queued and the call goes on.
// The caller keeps the contents until the copies that read them have run.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer() { Release(); }

  // Grows to `bytes` if smaller (the contents are not kept); no copy may still read it.
  Status Reserve(size_t bytes, const char* what) {
    if (bytes <= bytes_) return Status::Ok();
    Release();
    const cudaError_t e = cudaMallocHost(&ptr_, bytes);
    if (e != cudaSuccess) {
      ptr_ = nullptr;
      cudaGetLastError();
      return Error(e == cudaErrorMemoryAllocation ? STRIA_ERROR_OUT_OF_MEMORY : STRIA_ERROR_CUDA,
                   "cudaMallocHost of %zu bytes for %s failed: %s", bytes, what, cudaGetErrorString(e));
    }
    bytes_ = bytes;
    return Status::Ok();
  }
  void Release() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  char* data() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace stria
