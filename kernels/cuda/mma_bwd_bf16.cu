#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(MmaBackwardBF16, LaunchMmaBackward, BFloat, BwdParams)
