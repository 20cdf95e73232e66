// Helpers of the GPU tests: device copies of host test tensors, and the skip when no GPU is there.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "test_util.h"

namespace stria_test {

// Empty when a GPU is usable; otherwise why not (the tests skip with it).
inline std::string NoGpuReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  if (n == 0) return "no CUDA device";
  return "";
}

#define STRIA_REQUIRE_GPU()                                          \
  do {                                                               \
    const std::string why_ = ::stria_test::NoGpuReason();            \
    if (!why_.empty()) GTEST_SKIP() << "GPU test skipped: " << why_; \
  } while (0)

// Defined by tests/cuda_host's model of the CUDA runtime only.
extern "C" __attribute__((weak)) int stria_cuda_runtime_model(void);

// Also the model's: from a nonzero seed on, every launch runs its CTAs in a random order drawn
// from the seed and the launch's number (0: index order again).
extern "C" __attribute__((weak)) void stria_cuda_runtime_model_shuffle_blocks(uint64_t seed);
// And how many kernel launches, copies to the device and copies to the host the process has
// queued so far.
extern "C" __attribute__((weak)) void stria_cuda_runtime_model_counts(uint64_t* launches, uint64_t* to_device,
                                                                      uint64_t* to_host);

extern "C" __attribute__((weak)) void stria_cuda_runtime_model_priority_launches(uint64_t* least, uint64_t* greatest);
// And how often the host has waited for a stream's work (its synchronization, an event's, the
// device's, a copy to or from pageable memory).
extern "C" __attribute__((weak)) uint64_t stria_cuda_runtime_model_host_waits(cudaStream_t stream);

// What a stretch of work queued on the runtime model, by ModelCounts::Now() before and after.
// least and greatest: the launches on streams created with the device's least and greatest
// priority.
struct ModelCounts {
  uint64_t launches = 0, to_device = 0, to_host = 0, least = 0, greatest = 0;
  static bool Available() {
    return stria_cuda_runtime_model_counts != nullptr && stria_cuda_runtime_model_priority_launches != nullptr;
  }
  static ModelCounts Now() {
    ModelCounts c;
    stria_cuda_runtime_model_counts(&c.launches, &c.to_device, &c.to_host);
    stria_cuda_runtime_model_priority_launches(&c.least, &c.greatest);
    return c;
  }
  ModelCounts operator-(const ModelCounts& o) const {
    return ModelCounts{launches - o.launches, to_device - o.to_device, to_host - o.to_host, least - o.least,
                       greatest - o.greatest};
  }
};

// True when the suite runs on that model, where every kernel runs on the warp emulator, thousands
// of times slower than a GPU: a test whose shape is long only to keep a real GPU busy uses a
// shorter one there.
inline bool OnRuntimeModel() {
  return stria_cuda_runtime_model != nullptr;
}

// For a scope, CTAs in a random order at every launch on the runtime model (a GPU's order is its
// own): what a result must not depend on. Nothing when `on` is false or on a GPU.
class ShuffledBlocks {
 public:
  explicit ShuffledBlocks(bool on) : on_(on && stria_cuda_runtime_model_shuffle_blocks != nullptr) {
    if (on_) stria_cuda_runtime_model_shuffle_blocks(0x5eed);
  }
  ~ShuffledBlocks() {
    if (on_) stria_cuda_runtime_model_shuffle_blocks(0);
  }
  ShuffledBlocks(const ShuffledBlocks&) = delete;
  ShuffledBlocks& operator=(const ShuffledBlocks&) = delete;

 private:
  const bool on_;
};

// A device copy of a host Tensor (same shape, dtype and strides) on the calling thread's current
// device, freed at scope exit.
struct DeviceTensor {
  void* ptr = nullptr;
  size_t bytes = 0;
  std::vector<int64_t> shape, strides;
  DLTensor dl{};

  explicit DeviceTensor(const Tensor& host) : shape(host.shape), strides(host.strides) {
    int device = 0;
    EXPECT_EQ(cudaGetDevice(&device), cudaSuccess);
    bytes = host.storage.size();
    EXPECT_EQ(cudaMalloc(&ptr, bytes ? bytes : 16), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr, host.storage.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
    dl = host.dl;
    dl.data = ptr;
    dl.device = DLDevice{kDLCUDA, device};
    dl.shape = shape.data();
    dl.strides = strides.data();
  }
  DeviceTensor(const DeviceTensor&) = delete;
  DeviceTensor& operator=(const DeviceTensor&) = delete;
  ~DeviceTensor() { cudaFree(ptr); }

  // All bytes 0xFF: NaN in float32, float16 and bfloat16.
  void Poison() { EXPECT_EQ(cudaMemset(ptr, 0xFF, bytes), cudaSuccess); }
  void CopyTo(Tensor* host) const {
    ASSERT_EQ(host->storage.size(), bytes);
    ASSERT_EQ(cudaMemcpy(host->storage.data(), ptr, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
};

// n int64 values in device memory of the current GPU (document boundaries), freed at scope exit.
struct DeviceInt64s {
  int64_t* ptr = nullptr;
  explicit DeviceInt64s(size_t n) {
    EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&ptr), (n ? n : 1) * sizeof(int64_t)), cudaSuccess);
  }
  DeviceInt64s(const DeviceInt64s&) = delete;
  DeviceInt64s& operator=(const DeviceInt64s&) = delete;
  ~DeviceInt64s() { cudaFree(ptr); }
};

// A local group of CUDA contexts on one GPU, destroyed at scope exit.
struct CudaGroup {
  std::vector<stria_context_t> ctx;
  stria_status_t status;
  explicit CudaGroup(int n, int device = 0, double timeout_s = 120.0) : ctx(static_cast<size_t>(n), nullptr) {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.device = DLDevice{kDLCUDA, device};
    cfg.timeout_s = timeout_s;
    status = stria_context_create_local_group(&cfg, n, ctx.data());
  }
  // Rank r on CUDA device ordinals[r] (stria_context_create_local_group_on_devices).
  explicit CudaGroup(const std::vector<int>& ordinals, double timeout_s = 120.0) : ctx(ordinals.size(), nullptr) {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.timeout_s = timeout_s;
    std::vector<DLDevice> devices;
    for (int d : ordinals) devices.push_back(DLDevice{kDLCUDA, d});
    status =
        stria_context_create_local_group_on_devices(&cfg, devices.data(), static_cast<int>(devices.size()), ctx.data());
  }
  ~CudaGroup() {
    for (auto c : ctx)
      if (c) stria_context_destroy(c);
  }
};

}  // namespace stria_test
