#include "cuda/flash_launch.cuh"
STRIA_FLASH_ENTRY(FlashBackwardDeterministicBF16, LaunchFlashBackwardDeterministic, BFloat, BwdParams)
