// The FP8 widening's launcher (Backend::WidenFp8 of the CUDA backend), apart from launch.h, which
// every kernel unit includes.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/launch.h"
#include "cuda/widen_args.h"

namespace stria {
namespace cuda {

cudaError_t LaunchWidenFp8(Elem e, const WidenArgs& a, cudaStream_t s);

}  // namespace cuda
}  // namespace stria
