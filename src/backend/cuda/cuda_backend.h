// The CUDA backend (libstria-cuda.so): the Backend interface on one GPU, with all compute queued
// on the call's stream.
#pragma once

#include "backend/backend.h"
#include "cuda_common/device_scope.h"

namespace stria {

// Checks that a CUDA device `ordinal` exists and is usable; UNSUPPORTED when the machine has no
// CUDA device or driver.
Status CheckCudaDevice(int ordinal);

Status CreateCudaBackend(DLDevice device, Backend** out);

}  // namespace stria
