// Decode over a sharded KV cache on one GPU (the CUDA backend's Backend::Decode, StoreTokens and
// DecodeMerge): the work items planned on the host, the kernels of kernels/cuda/decode.cuh
// on the call's stream, and the merge of every rank's records, which the engine gathers into
// device memory, by one kernel (in double and in rank order, as the CPU backend's merge on the
// host) writing the call's out and lse: a decode step never waits for a copy to the host. Its
// device buffers are reused from call to call: the backend orders each call after the previous
// one on the device, whatever their streams (CudaBackend's OnStream), and the host waits for
// neither.
#pragma once

#include <cuda_runtime_api.h>

#include <initializer_list>
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
  // Stores work.appends, then attends: `partial` (device memory) gets this rank's records, or with
  // w.finish_out (a world of one) the call's out and lse are written directly.
  Status Decode(const DecodeWork& w, float* partial);
  // Every rank's records (`all`, device memory, world_size of DecodePartialFloats each) merged
  // with the sinks into out and lse (if given) by one kernel on `stream`.
  Status MergeOnDevice(const DecodeWork& w, const float* all, int world_size, const TensorView* sinks,
                       const TensorView& out, const TensorView* lse, cudaStream_t stream);

 private:
  // A table of the call's upload: `bytes` from `src` to offset `at` (Layout's).
  struct Table {
    size_t at;
    const void* src;
    size_t bytes;
  };
  size_t Layout(size_t bytes);
  Status Stage(std::initializer_list<Table> tables);
  Status UploadTables(cudaStream_t stream);
  // The appends as the store kernel's copies (copies_), laid out in the call's tables.
  size_t CollectCopies(const std::vector<CacheAppend>& appends);
  Status LaunchStore(const DecodeShape& s, size_t copies_at, cudaStream_t stream);
  int SmCount();

  const int device_;
  const bool tensor_cores_;
  int sms_ = 0;
  std::vector<cuda::DecodePiece> pieces_;
  std::vector<cuda::DecodeItem> items_;
  std::vector<int64_t> first_item_;
  std::vector<cuda::TokenCopy> copies_;
  // The call's tables, back to back (staged_ bytes), in page-locked memory: the upload's source
  // (`slot_`, the call's), a buffer whose last upload has run (StagingPool), so that the host never
  // waits for the calls before: it may queue a call while the device runs the previous ones.
  StagingPool staging_{8};
  StagingPool::Slot* slot_ = nullptr;
  size_t staged_ = 0;
  DeviceBuffer tables_dev_, states_;
};

}  // namespace stria
