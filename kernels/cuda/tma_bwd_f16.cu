#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(TmaBackwardF16, LaunchTmaBackward, Half, BwdParams)
STRIA_FLASH_ENTRY(TmaBackwardKvF16, LaunchTmaBackwardKv, Half, BwdParams)
