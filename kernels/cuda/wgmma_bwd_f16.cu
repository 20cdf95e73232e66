#include "cuda/wgmma_launch.cuh"
STRIA_MMA_ENTRY(WgmmaBackwardF16, LaunchWgmmaBackward, Half, BwdParams)
STRIA_MMA_ENTRY(WgmmaBackwardKvF16, LaunchWgmmaBackwardKv, Half, BwdParams)
