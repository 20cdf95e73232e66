// The Hopper primitives suite of the GPU tests (tests/gpu/test_hopper_primitives.cu) on the host
// model of the CUDA runtime: its kernels on the emulator, so that its own checks are tested
// without a GPU.
#include "test_hopper_primitives.cu"
