#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(MmaBackwardKvBF16, LaunchMmaBackwardKv, BFloat, BwdParams)
STRIA_MMA_ENTRY(MmaBackwardDqBF16, LaunchMmaBackwardDq, BFloat, BwdParams)
