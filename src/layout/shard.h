// Copying a rank's tokens out of a full-sequence tensor (shard) and back (unshard), along any
// dimension, for any dtype: the same layouts as the ring, so positions, labels and RoPE ids line up.
#pragma once

#include "core/status.h"

namespace stria {

// to_local = true: full -> local (shard); false: local -> full (unshard).
Status ShardCopy(stria_layout_t layout, int world_size, int rank, int seq_dim, const DLTensor* full,
                 const DLTensor* local, bool to_local, void* stream);

}  // namespace stria
