#include "cuda/wgmma_launch.cuh"
STRIA_MMA_ENTRY(WgmmaBackwardBF16, LaunchWgmmaBackward, BFloat, BwdParams)
STRIA_MMA_ENTRY(WgmmaBackwardKvBF16, LaunchWgmmaBackwardKv, BFloat, BwdParams)
