#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashForwardF16, LaunchFlashForward, Half, FwdParams)
