#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(TmaForwardF16, LaunchTmaForward, Half, FwdParams)
