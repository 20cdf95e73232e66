// The host entry points of the FP8 forward (tma_forward_fp8.cuh: float8_e4m3fn q, k and v, head
// dim 128, sm_90a), apart from launch.h, which every kernel unit includes.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/launch.h"

namespace stria {
namespace cuda {

// A tensor's descale as the kernels read it: NULL (1), or float32 with one value (step 0) or one
// per head (step 1).
struct Descale {
  const float* data = nullptr;
  int step = 0;
};

// Bytes of a block's e4m3 ring message (K rows, then V transposed: tma_forward_fp8.cuh).
int64_t Fp8KvWireBytes(const Dims& d);
// The message of the caller's k and v ([B, L, Hkv, 128] e4m3 views) into `wire`.
cudaError_t LaunchPackKvE4m3(const Dims& d, RowsArg k, RowsArg v, void* wire, cudaStream_t s);
// One ring block: p.q the caller's e4m3 queries, p.k the message (p.v unused), the state and
// outputs in dtype e. cudaErrorNotSupported when TMA cannot describe q (strides not 16-byte
// multiples, an unaligned start): the caller takes another path before the call starts.
cudaError_t LaunchFp8ForwardBlock(Elem e, const FwdParams& p, Descale q, Descale k, cudaStream_t s);
// Whether TMA can describe the e4m3 view q of `d`'s shape (the condition LaunchFp8ForwardBlock
// needs), without launching anything.
bool Fp8QueriesMappable(const RowsArg& q, const Dims& d);
// The call's outputs times v's descale of each row's K/V head (an elementwise kernel: launch.cu).
cudaError_t LaunchScaleRowsByHead(Elem e, const Dims& d, Descale v, RowsOut out, cudaStream_t s);

}  // namespace cuda
}  // namespace stria
