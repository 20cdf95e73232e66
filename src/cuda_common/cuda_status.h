// CUDA runtime failures as Status: STRIA_ERROR_CUDA naming the call and the runtime's message.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace stria {

// A failed runtime call also records its error as the thread's last error; stria reports it in its
// own status, so it clears that record (where the failed call is still the last one) rather than
// leave it for the caller's next cudaGetLastError to misattribute. Sticky errors stay regardless.
inline Status CudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  if (cudaPeekAtLastError() == e) (void)cudaGetLastError();
  return Error(STRIA_ERROR_CUDA, "%s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace stria

// Returns a Status from the enclosing function when the runtime call fails; the call's text is
// the message's subject.
#define STRIA_CUDA_RETURN_IF_ERROR(call) STRIA_RETURN_IF_ERROR(::stria::CudaStatus((call), #call))
