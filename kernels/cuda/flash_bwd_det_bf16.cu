#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashBackwardKvBF16, LaunchFlashBackwardKv, BFloat, BwdParams)
STRIA_FLASH_ENTRY(FlashBackwardDqBF16, LaunchFlashBackwardDq, BFloat, BwdParams)
