#include "cuda/tma_launch.cuh"
STRIA_MMA_ENTRY(TmaForwardF16, LaunchTmaForward, Half, FwdParams)
