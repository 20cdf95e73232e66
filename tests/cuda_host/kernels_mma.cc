// The mma.sync entries of kernels/cuda/kernel_matrix.def and the tensor-core decode (decode_mma.cu)
// for the emulator.
#include "cuda/decode_mma.cu"
#include "cuda/kernel_matrix.h"
#include "cuda/mma_launch.cuh"

#define STRIA_KERNEL(unit, family, pass, dtype) STRIA_KERNEL_OF_##family(family, pass, dtype)
#define STRIA_KERNEL_OF_Mma STRIA_KERNEL_DEFINE
#define STRIA_KERNEL_OF_Wgmma(family, pass, dtype)
#define STRIA_KERNEL_OF_Tma(family, pass, dtype)
#include "cuda/kernel_matrix.def"
#undef STRIA_KERNEL
