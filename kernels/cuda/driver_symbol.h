// A driver API function by name, for the modules that link only the CUDA runtime (tensor_map.cu,
// smem_optin.cu). Looked up in the driver library the runtime has loaded (the way the H200 runs
// checked), and failing that, as in the runtime model of tests/cuda_host, which has no libcuda,
// through the runtime's entry-point query; null where neither has it. Callers keep the result in a
// function-local static: one lookup per process.
#pragma once

#include <cuda_runtime_api.h>
#include <dlfcn.h>

namespace stria {
namespace cuda {

inline void* DriverSymbol(const char* name) {
  void* f = nullptr;
#if !defined(STRIA_CUDA_EMULATE)
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);  // loaded by the runtime already
  if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver != nullptr) f = dlsym(driver, name);  // the handle stays open
  if (f != nullptr) return f;
#endif
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &f, 12000, cudaEnableDefault, &found);
  // The query's own failure is not the caller's to see later (a symbol not found records none, so
  // an error the caller left pending stays theirs).
  if (e != cudaSuccess && cudaPeekAtLastError() == e) (void)cudaGetLastError();
  return e == cudaSuccess && found == cudaDriverEntryPointSuccess ? f : nullptr;
}

}  // namespace cuda
}  // namespace stria
