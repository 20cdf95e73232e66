// The Hopper wgmma forward and backward entry points (kernels/cuda/wgmma_*.cu, tma_*.cu) for the
// emulator.
#include "cuda/tma_bwd_bf16.cu"
#include "cuda/tma_bwd_f16.cu"
#include "cuda/tma_fwd_bf16.cu"
#include "cuda/tma_fwd_f16.cu"
#include "cuda/wgmma_bwd_bf16.cu"
#include "cuda/wgmma_bwd_det_bf16.cu"
#include "cuda/wgmma_bwd_det_f16.cu"
#include "cuda/wgmma_bwd_f16.cu"
#include "cuda/wgmma_fwd_bf16.cu"
#include "cuda/wgmma_fwd_f16.cu"
