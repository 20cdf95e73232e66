// Host entry points of the decode kernels (decode.cu), called by the CUDA backend
// (src/backend/cuda/cuda_decode.cc); each enqueues on `stream` and returns the launch's status.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/decode_params.h"
#include "cuda/launch.h"

namespace stria {
namespace cuda {

// The items' states of `items` work items, their merge into partial records, and new tokens' rows
// into a cache (elem_bytes: 2 or 4).
cudaError_t LaunchDecode(Elem e, const DecodeArgs& a, int64_t items, cudaStream_t s);
// The same states on the tensor cores (decode_mma.cuh): 16-bit dtypes, D 64 or 128, every piece
// rows16; cudaErrorInvalidValue otherwise.
cudaError_t LaunchDecodeMma(Elem e, const DecodeArgs& a, int64_t items, cudaStream_t s);
cudaError_t LaunchDecodeMerge(const DecodeMergeArgs& a, cudaStream_t s);
// A world of one: the items' merge writes the call's out and lse (f's outputs and sinks) itself.
cudaError_t LaunchDecodeMergeFinish(Elem e, const DecodeMergeArgs& a, const DecodeFinishArgs& f, cudaStream_t s);
// The call's result from every rank's partial records, merged on the device (DecodeFinishArgs).
cudaError_t LaunchDecodeFinish(Elem e, const DecodeFinishArgs& a, cudaStream_t s);
cudaError_t LaunchStoreTokens(int elem_bytes, const TokenCopy* copies, int64_t n, int Hkv, int D, cudaStream_t s);

}  // namespace cuda
}  // namespace stria
