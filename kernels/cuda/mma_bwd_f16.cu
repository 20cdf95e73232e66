#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(MmaBackwardF16, LaunchMmaBackward, Half, BwdParams)
