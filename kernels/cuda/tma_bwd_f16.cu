#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(TmaBackwardF16, LaunchTmaBackward, Half, BwdParams)
