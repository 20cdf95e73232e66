#include "cuda/tma_launch.cuh"
STRIA_MMA_ENTRY(TmaForwardBF16, LaunchTmaForward, BFloat, FwdParams)
