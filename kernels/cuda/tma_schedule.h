// How the TMA kernels take their work items, as the environment chooses it: host code only, for
// the launchers (tma_launch.cuh) and for the backend, which keeps a document plan's home part on
// the ring's stream under the persistent schedule (src/backend/cuda).
#pragma once

#include <strings.h>

#include <cstdlib>

namespace stria {
namespace cuda {

// STRIA_CUDA_TMA_SCHEDULE unset, "" or "tiles" (a CTA per item: a forward's query tile or a
// backward's key tile of one head; the default), or "persistent" (a CTA per SM walking the items,
// tma_forward_persistent.cuh, tma_backward_persistent.cuh), read at every launch. False for any
// other value: a misspelt choice must not quietly measure the default.
inline bool TmaPersistent(bool* persistent) {
  const char* env = std::getenv("STRIA_CUDA_TMA_SCHEDULE");
  *persistent = env != nullptr && strcasecmp(env, "persistent") == 0;
  return *persistent || env == nullptr || *env == '\0' || strcasecmp(env, "tiles") == 0;
}

}  // namespace cuda
}  // namespace stria
