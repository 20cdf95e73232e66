// Decode over a sharded KV cache on one GPU (the CUDA backend's Backend::Decode, StoreTokens and
// DecodeMergeOnDevice): the work items planned on the host, the kernels of kernels/cuda/decode.cuh
// on the call's stream, and the merge of every rank's records, which the engine gathers into
// device memory, by one kernel (in double and in rank order, as the CPU backend's merge on the
// host) writing the call's out and lse: a decode step never waits for a copy to the host.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "backend/backend.h"
#include "backend/cuda/device_buffer.h"
#include "cuda/decode_params.h"

namespace stria {

class CudaDecoder {
 public:
  // tensor_cores: the tensor-core decode kernel where the call allows it (16-bit rows of whole
  // 16-byte chunks, D 64 or 128), else the SIMT one; false: SIMT always (STRIA_CUDA_KERNELS=simt).
  CudaDecoder(int device, bool tensor_cores) : device_(device), tensor_cores_(tensor_cores) {}
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // The call's new tokens into the cache, on `stream`.
  Status StoreTokens(const DecodeShape& s, const std::vector<CacheAppend>& appends, cudaStream_t stream);
  // Stores work.appends, then attends: `partial` (device memory) gets this rank's records.
  Status Decode(const DecodeWork& w, float* partial);
  // Every rank's records (`all`, device memory, world_size of DecodePartialFloats each; a world of
  // one: its own) merged with the sinks into out and lse (if given) by one kernel on `stream`.
  Status MergeOnDevice(const DecodeWork& w, const float* all, int world_size, const TensorView* sinks,
                       const TensorView& out, const TensorView* lse, cudaStream_t stream);
  // Marks the end of the call's work on `stream`: the next call reuses the buffers after it.
  Status Done(cudaStream_t stream);

 private:
  Status WaitForPreviousCall();
  Status QueueStore(const DecodeShape& s, const std::vector<CacheAppend>& appends, cudaStream_t stream);
  Status Upload(DeviceBuffer* dst, const void* src, size_t bytes, const char* what, cudaStream_t stream);
  int SmCount();

  const int device_;
  const bool tensor_cores_;
  int sms_ = 0;
  cudaEvent_t done_ = nullptr;  // recorded at the end of the last call's work (Done)
  // Host sources of the uploads, the call's own copies: a copy from pageable memory may read its
  // source when it runs rather than when it is queued (the runtime model's copies do), so they live
  // until the call's work is done.
  std::vector<cuda::DecodePiece> pieces_;
  std::vector<cuda::DecodeItem> items_;
  std::vector<int64_t> first_item_;
  std::vector<char> tables_;  // the tables of DecodeArgs and DecodeMergeArgs, back to back
  std::vector<cuda::TokenCopy> copies_;
  DeviceBuffer tables_dev_, states_, copies_dev_;
};

}  // namespace stria
