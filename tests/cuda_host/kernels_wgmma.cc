// The Hopper entries (the wgmma and tma families) of kernels/cuda/kernel_matrix.def for the
// emulator.
#include "cuda/kernel_matrix.h"
#include "cuda/tma_launch.cuh"
#include "cuda/wgmma_launch.cuh"

#define STRIA_KERNEL(unit, family, pass, dtype) STRIA_KERNEL_OF_##family(family, pass, dtype)
#define STRIA_KERNEL_OF_Mma(family, pass, dtype)
#define STRIA_KERNEL_OF_Wgmma STRIA_KERNEL_DEFINE
#define STRIA_KERNEL_OF_Tma STRIA_KERNEL_DEFINE
#include "cuda/kernel_matrix.def"
#undef STRIA_KERNEL
