#include "cuda/tma_launch.cuh"
STRIA_MMA_ENTRY(TmaBackwardBF16, LaunchTmaBackward, BFloat, BwdParams)
STRIA_MMA_ENTRY(TmaBackwardKvBF16, LaunchTmaBackwardKv, BFloat, BwdParams)
