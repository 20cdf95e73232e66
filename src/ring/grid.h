// Attention on a grid (DESIGN.md, "Hybrid grid"; stria_context_set_grid): N = U x R ranks, U
// consecutive ranks forming an all-to-all group, R groups forming a ring. A call swaps sequence
// shards for head shards within each group (an all-to-all), runs the ring across the groups on
// the group's heads, and swaps back: member u of group g then computes query heads u of U for all
// the tokens the layout gives rank g of a ring of R.
#pragma once

#include "ring/arguments.h"

namespace stria {

// RingForward and RingBackward on a context with a grid: `c` is the call as validated on this
// rank (its local tokens, every head), `local` its validation's result.
Status GridForward(Context& ctx, const ValidatedCall& c, Status local);
Status GridBackward(Context& ctx, const ValidatedCall& c, Status local);
// How many head chunks this rank's part of a grid call of shape `s` runs (one ring each; at most
// STRIA_GRID_CHUNKS): part of the call's signature, since ranks that chunk differently would
// exchange messages of different sizes. The shape's heads must split over the group.
int GridChunkCount(const Context& ctx, const AttentionShape& s);

}  // namespace stria
