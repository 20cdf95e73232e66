// What a backend module (libstria-cuda.so) exports: `extern "C" const BackendModuleV1
// stria_cuda_module_v1`. Core and modules are built from one tree by one compiler, so the table
// carries C++ objects; the version field guards against mixing installs.
#pragma once

#include "backend/backend.h"

namespace stria {

constexpr int kBackendModuleAbiVersion = 1;

struct BackendModuleV1 {
  int abi_version;  // kBackendModuleAbiVersion
  const char* name;
  Status (*create)(DLDevice device, int num_threads, Backend** out);
};

}  // namespace stria
