// The CUDA module's launchers and SIMT/elementwise kernels (kernels/cuda/launch.cu), compiled by
// the host compiler for the emulator: STRIA_LAUNCH queues on the runtime model's streams.
#include "cuda/launch.cu"
