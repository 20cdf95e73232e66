#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(WgmmaForwardF16, LaunchWgmmaForward, Half, FwdParams)
