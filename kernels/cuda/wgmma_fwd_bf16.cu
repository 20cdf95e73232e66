#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(WgmmaForwardBF16, LaunchWgmmaForward, BFloat, FwdParams)
