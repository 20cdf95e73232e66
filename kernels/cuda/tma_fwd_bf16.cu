#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(TmaForwardBF16, LaunchTmaForward, BFloat, FwdParams)
