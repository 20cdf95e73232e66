#include "cuda/wgmma_launch.cuh"
STRIA_MMA_ENTRY(WgmmaBackwardDqBF16, LaunchWgmmaBackwardDq, BFloat, BwdParams)
