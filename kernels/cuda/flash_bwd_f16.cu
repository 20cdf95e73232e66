#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashBackwardF16, LaunchFlashBackward, Half, BwdParams)
