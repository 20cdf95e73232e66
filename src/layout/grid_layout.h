// Token placement on a grid (DESIGN.md, "Hybrid grid"): N = U x R ranks, rank r = g·U + u holding
// the u-th of U equal contiguous pieces of the tokens a layout gives rank g of a ring of R.
#pragma once

#include <dlpack/dlpack.h>

#include "core/status.h"

namespace stria {

// world_size a multiple of ulysses_size >= 1, rank in range, seq_len divisible by world_size and
// by the layout's rule on a ring of world_size / ulysses_size.
Status CheckGrid(stria_layout_t layout, int64_t seq_len, int world_size, int ulysses_size, int rank);
// Global position of local token i of `rank` (local_len = seq_len / world_size).
int64_t GridPosition(stria_layout_t layout, int64_t local_len, int world_size, int ulysses_size, int rank, int64_t i);
// stria_grid_shard (to_local) and stria_grid_unshard: ShardCopy's, for a rank of a grid.
Status GridShardCopy(stria_layout_t layout, int world_size, int ulysses_size, int rank, int seq_dim,
                     const DLTensor* full, const DLTensor* local, bool to_local, void* stream);

}  // namespace stria
