// The CUDA backend (libstria-cuda.so): the Backend interface on one GPU, with all compute queued
// on the call's stream.
#pragma once

#include "backend/backend.h"

namespace stria {

// Sets the calling thread's device for a scope and restores the previous one.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  Status status() const { return status_; }

 private:
  int previous_ = -1;
  Status status_;
};

// Checks that a CUDA device `ordinal` exists and is usable; UNSUPPORTED when the machine has no
// CUDA device or driver.
Status CheckCudaDevice(int ordinal);

Status CreateCudaBackend(DLDevice device, Backend** out);

}  // namespace stria
