// CUDA runtime failures as Status: STRIA_ERROR_CUDA naming the call and the runtime's message.
#pragma once

#include <cuda_runtime_api.h>

#include "core/status.h"

namespace stria {

// A failed runtime call also records its error as the thread's last error. Where stria handles the
// failure itself, it clears that record (if the failed call is still the last one) rather than
// leave it for the caller's next cudaGetLastError to misattribute. Sticky errors stay regardless.
inline void ForgetError(cudaError_t e) {
  if (e != cudaSuccess && cudaPeekAtLastError() == e) (void)cudaGetLastError();
}

// e as a stria status; the runtime's record of it is cleared (ForgetError).
inline Status CudaStatus(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return Status::Ok();
  ForgetError(e);
  return Error(STRIA_ERROR_CUDA, "%s failed: %s (%s)", call, cudaGetErrorString(e), cudaGetErrorName(e));
}

}  // namespace stria

// Returns a Status from the enclosing function when the runtime call fails; the call's text is
// the message's subject.
#define STRIA_CUDA_RETURN_IF_ERROR(call) STRIA_RETURN_IF_ERROR(::stria::CudaStatus((call), #call))
