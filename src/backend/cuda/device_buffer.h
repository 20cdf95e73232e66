// Device workspace that grows and is then reused across calls: after the first call of a given
// size no cudaMalloc happens on the call path.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

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

// Page-locked buffers that a call's uploads copy from, each handed out again only once its last
// copy has run (an event recorded after it): the first one whose copy has, in turn, or a new one
// while there are fewer than `max`, or else the oldest, waited for. The host, which may queue
// calls ahead of the device, then refills none a copy may still read and seldom waits. The
// caller's device must be current in Take, Copied and Release.
class StagingPool {
 public:
  struct Slot {
    PinnedBuffer buffer;
    cudaEvent_t copied = nullptr;  // recorded after the last copy out of `buffer`
  };
  explicit StagingPool(size_t max) : max_(max < 1 ? 1 : max) {}
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;
  ~StagingPool() { Release(); }

  // A slot of at least `bytes` whose last copy has run.
  Status Take(size_t bytes, const char* what, Slot** out) {
    Slot* slot = nullptr;
    for (size_t k = 0; k < slots_.size() && slot == nullptr; ++k) {
      const size_t i = (next_ + k) % slots_.size();
      if (Done(*slots_[i])) {
        slot = slots_[i].get();
        next_ = (i + 1) % slots_.size();
      }
    }
    if (slot == nullptr && slots_.size() < max_) {
      slots_.push_back(std::make_unique<Slot>());
      slot = slots_.back().get();
      next_ = 0;
    }
    if (slot == nullptr) {  // every copy still queued: the oldest's
      slot = slots_[next_].get();
      next_ = (next_ + 1) % slots_.size();
      STRIA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(slot->copied));
    }
    if (slot->copied == nullptr)
      STRIA_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&slot->copied, cudaEventDisableTiming));
    STRIA_RETURN_IF_ERROR(slot->buffer.Reserve(bytes < 16 ? 16 : bytes, what));
    *out = slot;
    return Status::Ok();
  }
  // After the copy out of `slot` was queued on `stream`.
  static Status Copied(Slot* slot, cudaStream_t stream) {
    STRIA_CUDA_RETURN_IF_ERROR(cudaEventRecord(slot->copied, stream));
    return Status::Ok();
  }
  // Waits for every copy, then frees the buffers.
  void Release() {
    for (auto& slot : slots_) {
      if (slot->copied != nullptr) {
        cudaEventSynchronize(slot->copied);
        cudaEventDestroy(slot->copied);
      }
      slot->buffer.Release();
    }
    slots_.clear();
    next_ = 0;
  }

 private:
  static bool Done(const Slot& slot) {
    if (slot.copied == nullptr) return true;
    const cudaError_t q = cudaEventQuery(slot.copied);
    if (q == cudaErrorNotReady) ForgetError(q);
    return q == cudaSuccess;
  }
  std::vector<std::unique_ptr<Slot>> slots_;
  size_t next_ = 0;
  const size_t max_;
};

}  // namespace stria
