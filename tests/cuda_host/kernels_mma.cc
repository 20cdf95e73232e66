// The mma.sync forward and backward entry points (kernels/cuda/mma_*.cu) for the emulator.
#include "cuda/mma_bwd_bf16.cu"
#include "cuda/mma_bwd_det_bf16.cu"
#include "cuda/mma_bwd_det_f16.cu"
#include "cuda/mma_bwd_f16.cu"
#include "cuda/mma_fwd_bf16.cu"
#include "cuda/mma_fwd_f16.cu"
