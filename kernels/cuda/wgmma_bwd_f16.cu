#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(WgmmaBackwardF16, LaunchWgmmaBackward, Half, BwdParams)
STRIA_FLASH_ENTRY(WgmmaBackwardKvF16, LaunchWgmmaBackwardKv, Half, BwdParams)
