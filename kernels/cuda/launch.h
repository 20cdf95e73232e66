// Host entry points of the CUDA kernels, called by the CUDA backend (src/backend/cuda). Each
// enqueues work on `stream` and returns the launch's cudaError_t; nothing here synchronizes.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/params.h"

namespace stria {
namespace cuda {

enum class Elem { kF32, kF16, kBF16 };

// Head dims some tensor-core kernel is built for: every pass has 64 and 128, every forward and the
// Hopper backward 256 too (kernel_matrix.h). A pass without the call's head dim (and float32) takes
// the SIMT kernels.
bool TensorCoreHeadDim(int D);
// The widest head dim: the SIMT kernels' wide build (simt_attention.cuh), and the decode kernels'.
constexpr int kMaxHeadDim = 512;
// Head dims above this take the SIMT kernels' wide build, which needs SimtSharedMemoryBytes(D) of
// shared memory a block: the caller checks the device gives it (CudaBackend::CheckSupported).
constexpr int kNarrowHeadDim = 256;
int SimtSharedMemoryBytes(int D);

// The kernel family of a ring block. kMma (mma.sync, sm_80 on), kWgmma (wgmma, sm_90a only) and
// kTma (kWgmma's products with their loads by TMA in warp-specialised CTAs) need 16-bit dtypes,
// TensorCoreHeadDim and 16-byte aligned rows, and kWgmma and kTma a device of compute capability 9.0:
// the caller checks. kSimt runs everything.
enum class Kernels { kSimt, kMma, kWgmma, kTma };
const char* KernelsName(Kernels k);
// The query tile of family k's forward at head dim D on 16-bit inputs, as the environment chooses
// it now (tma_schedule.h, TmaForwardRows): the rows a list of its busy tiles is made for
// (MaskArgs::tile_rows). The FP8 forward's is kForwardTileRows. A launch whose kernel has tiles of
// another size (a TMA launch that takes the cp.async wgmma kernel, TmaMapFailures) ignores the
// list and runs over every tile: the same result.
int ForwardTileRows(Kernels k, int D);

cudaError_t LaunchForwardBlock(Elem e, Kernels k, const FwdParams& p, cudaStream_t s);
// kTma blocks that took the cp.async wgmma forward because their tensor maps could not be made
// (tma_api.cuh, EncodeRowsMap), in this process: what a TMA benchmark must show is zero.
uint64_t TmaMapFailures();
// deterministic: the same bits from every run (the SIMT kernels always give them; the TMA family
// then orders its dQ adds in its one pass, ordered_dq.cuh, where its kernel runs; other tensor-core
// families run their dK/dV pass without dQ, then a dQ pass that adds dQ without atomics).
cudaError_t LaunchBackwardBlock(Elem e, Kernels k, bool deterministic, const BwdParams& p, cudaStream_t s);

cudaError_t LaunchPackRows(int elem_bytes, Dims d, int H, RowsArg src, void* dst, cudaStream_t s);
cudaError_t LaunchFill(float* p, int64_t n, float v, cudaStream_t s);
cudaError_t LaunchAccumulate(float* dst, const float* src, int64_t n, cudaStream_t s);
cudaError_t LaunchForwardFinish(Elem e, Dims d, const float* acc, const float* m, const float* l, RowsOut out,
                                float* lse, int64_t lb, int64_t lh, int64_t li, cudaStream_t s);
cudaError_t LaunchBackwardPrep(Elem e, Dims d, RowsArg out, RowsArg dout, const float* lse, int64_t lb, int64_t lh,
                               int64_t li, float* lse2, float* delta, cudaStream_t s);
// Attention sinks: folded into the finished rows (SinksForwardKernel), and their gradient over this
// rank's rows from the backward's lse2 and delta (SinksGradKernel); sinks and dsinks [Hq] float32.
cudaError_t LaunchSinksForward(Elem e, Dims d, const float* sinks, RowsOut out, float* lse, int64_t lb, int64_t lh,
                               int64_t li, cudaStream_t s);
cudaError_t LaunchSinksGrad(Dims d, const float* sinks, const float* lse2, const float* delta, float* dsinks,
                            int64_t ds, cudaStream_t s);
cudaError_t LaunchDqFinish(Elem e, Dims d, const float* dq_acc, float scale, RowsOut dq, cudaStream_t s);
cudaError_t LaunchKvGradFinish(Elem e, Dims d, const float* src, RowsOut dst, cudaStream_t s);
cudaError_t LaunchShard(const ShardArgs& a, cudaStream_t s);
cudaError_t LaunchBoxSum(Elem e, const BoxArgs& a, cudaStream_t s);

}  // namespace cuda
}  // namespace stria
