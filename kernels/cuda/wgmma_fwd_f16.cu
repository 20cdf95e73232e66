#include "cuda/wgmma_launch.cuh"
STRIA_MMA_ENTRY(WgmmaForwardF16, LaunchWgmmaForward, Half, FwdParams)
