#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(MmaBackwardKvF16, LaunchMmaBackwardKv, Half, BwdParams)
STRIA_MMA_ENTRY(MmaBackwardDqF16, LaunchMmaBackwardDq, Half, BwdParams)
