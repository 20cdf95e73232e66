// The mma.sync forward and backward entry points (kernels/cuda/mma_*.cu) and the tensor-core decode
// (decode_mma.cu) for the emulator.
#include "cuda/decode_mma.cu"
#include "cuda/mma_bwd_bf16.cu"
#include "cuda/mma_bwd_det_bf16.cu"
#include "cuda/mma_bwd_det_f16.cu"
#include "cuda/mma_bwd_f16.cu"
#include "cuda/mma_fwd_bf16.cu"
#include "cuda/mma_fwd_f16.cu"
