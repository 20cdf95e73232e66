#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashBackwardBF16, LaunchFlashBackward, BFloat, BwdParams)
