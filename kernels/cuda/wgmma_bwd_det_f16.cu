#include "cuda/wgmma_launch.cuh"
STRIA_MMA_ENTRY(WgmmaBackwardDqF16, LaunchWgmmaBackwardDq, Half, BwdParams)
