#include "cuda/tma_launch.cuh"
STRIA_MMA_ENTRY(TmaBackwardF16, LaunchTmaBackward, Half, BwdParams)
STRIA_MMA_ENTRY(TmaBackwardKvF16, LaunchTmaBackwardKv, Half, BwdParams)
