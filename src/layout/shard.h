// Copying a rank's tokens out of a full-sequence tensor (shard) and back (unshard), along any
// dimension, for any dtype: the same layouts as the ring, so positions, labels and RoPE ids line up.
#pragma once

#include "core/status.h"
#include "layout/plan.h"

namespace stria {

// to_local = true: full -> local (shard); false: local -> full (unshard).
Status ShardCopy(stria_layout_t layout, int world_size, int rank, int seq_dim, const DLTensor* full,
                 const DLTensor* local, bool to_local, void* stream);

// The same by a plan (stria_plan_shard): padding slots get zeros (shard) or are skipped (unshard).
// A plan of several batch rows takes dimension 0 as the batch. Host tensors only.
Status PlanShardCopy(const Plan& plan, int rank, int seq_dim, const DLTensor* full, const DLTensor* local,
                     bool to_local, void* stream);

}  // namespace stria
