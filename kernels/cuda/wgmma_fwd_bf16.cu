#include "cuda/wgmma_launch.cuh"
STRIA_MMA_ENTRY(WgmmaForwardBF16, LaunchWgmmaForward, BFloat, FwdParams)
