// The CUDA module's launchers and SIMT/elementwise kernels (kernels/cuda/launch.cu) and the decode
// kernels (decode.cu), compiled by
// the host compiler for the emulator: STRIA_LAUNCH queues on the runtime model's streams. The
// shared-memory opt-in (smem_optin.cu) is the GPU build's own code, on the model's runtime calls.
#include "cuda/decode.cu"
#include "cuda/launch.cu"
#include "cuda/smem_optin.cu"
