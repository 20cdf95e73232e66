#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(MmaForwardF16, LaunchMmaForward, Half, FwdParams)
