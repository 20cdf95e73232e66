// The FP8 forward's launchers and kernels (kernels/cuda/tma_fp8.cu) for the emulator.
#include "cuda/tma_fp8.cu"
