#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashForwardBF16, LaunchFlashForward, BFloat, FwdParams)
