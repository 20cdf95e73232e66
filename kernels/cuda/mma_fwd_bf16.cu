#include "cuda/mma_launch.cuh"
STRIA_MMA_ENTRY(MmaForwardBF16, LaunchMmaForward, BFloat, FwdParams)
