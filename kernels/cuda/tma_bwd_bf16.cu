#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(TmaBackwardBF16, LaunchTmaBackward, BFloat, BwdParams)
STRIA_FLASH_ENTRY(TmaBackwardKvBF16, LaunchTmaBackwardKv, BFloat, BwdParams)
