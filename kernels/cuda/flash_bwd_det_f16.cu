#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashBackwardDeterministicF16, LaunchFlashBackwardDeterministic, Half, BwdParams)
