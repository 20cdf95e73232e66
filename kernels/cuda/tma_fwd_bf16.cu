#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(TmaForwardBF16, LaunchTmaForward, BFloat, FwdParams)
