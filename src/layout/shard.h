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
// A plan of several batch rows takes dimension 0 as the batch. Host tensors only. ulysses > 1:
// `rank` of a grid of all-to-all groups of that many ranks on a ring of the plan's world_size
// (stria_plan_grid_shard): rank g·U + u holds the u-th of U pieces of the plan's slots of rank g.
Status PlanShardCopy(const Plan& plan, int rank, int seq_dim, const DLTensor* full, const DLTensor* local,
                     bool to_local, void* stream, int ulysses = 1);
// A grid rank of a plan: its ring rank and first slot, and its slots per batch row; checks that
// ulysses divides the plan's local_len and that rank lies in the grid.
Status PlanGridRank(const Plan& plan, int ulysses, int rank, int* ring_rank, int64_t* first, int64_t* count);

}  // namespace stria
