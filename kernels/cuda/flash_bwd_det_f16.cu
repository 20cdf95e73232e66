#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashBackwardKvF16, LaunchFlashBackwardKv, Half, BwdParams)
STRIA_FLASH_ENTRY(FlashBackwardDqF16, LaunchFlashBackwardDq, Half, BwdParams)
