#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(WgmmaBackwardBF16, LaunchWgmmaBackward, BFloat, BwdParams)
STRIA_FLASH_ENTRY(WgmmaBackwardKvBF16, LaunchWgmmaBackwardKv, BFloat, BwdParams)
