// The mma.sync forward and backward entry points (kernels/cuda/flash_*.cu) for the emulator.
#include "cuda/flash_bwd_bf16.cu"
#include "cuda/flash_bwd_det_bf16.cu"
#include "cuda/flash_bwd_det_f16.cu"
#include "cuda/flash_bwd_f16.cu"
#include "cuda/flash_fwd_bf16.cu"
#include "cuda/flash_fwd_f16.cu"
