// How the TMA kernels take their work items, as the environment chooses it: host code only, for
// the launchers (tma_launch.cuh) and for the backend, which keeps a document plan's home part on
// the ring's stream under the persistent schedule and makes a forward's list of busy query tiles
// for the tile its kernel takes (src/backend/cuda).
#pragma once

#include <strings.h>

#include <cstdlib>
#include <cstring>

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

// STRIA_CUDA_TMA_FORWARD_ROWS unset, "" or "128" (the default: two consumer warpgroups of 64
// rows) or "192" (three, FlashAttention-3's tile at head dim 64: tma_forward.cuh): the query tile
// of the TMA forward on 16-bit inputs, read at every launch. 192 applies at head dim 64 alone (the
// registers allow three consumers nowhere else); every other head dim takes 128 under either. False
// for any other value.
inline bool TmaForwardRows(int D, int* rows) {
  const char* env = std::getenv("STRIA_CUDA_TMA_FORWARD_ROWS");
  const bool wide = env != nullptr && std::strcmp(env, "192") == 0;
  *rows = wide && D == 64 ? 192 : 128;
  return wide || env == nullptr || *env == '\0' || std::strcmp(env, "128") == 0;
}

}  // namespace cuda
}  // namespace stria
