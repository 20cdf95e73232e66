// Load-balance analysis of the ring (stria_analyze_balance): how much attention work each rank
// does at each ring step under a layout, counted at the granularity a tiled kernel computes,
// and what that costs in ring latency. Pure arithmetic over the layout's block masks; no
// tensors, no context.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "layout/layout.h"

namespace stria {

// Largest world_size the analysis accepts: the per-step table has world_size² entries.
constexpr int kMaxBalanceWorldSize = 65536;

// Work of one L x L block (L = local_len) under `mask`, cut into tile x tile tiles (edge tiles
// smaller when L % tile != 0): a tile counts its full area when any pair in it is visible, so
// tile = 1 gives the exact number of visible pairs. O(1) for any mask and length. Expects
// local_len >= 1 and tile >= 1.
double BlockWork(const BlockMask& mask, int64_t local_len, int64_t tile);

// work[s * world_size + r] = work of rank r at ring step s, where at step s rank r holds the
// K/V of rank k = (r - s) mod N. `work` has world_size² entries.
Status BalanceSteps(stria_layout_t layout, bool causal, int64_t seq_len, int world_size, int64_t tile, double* work);

// Fills total_work, ring_latency, speedup and imbalance of *out (not out->struct_size, which
// the C layer checks). Needs no world_size² buffer.
Status AnalyzeBalance(stria_layout_t layout, bool causal, int64_t seq_len, int world_size, int64_t tile,
                      stria_balance_t* out);

// One device's work on the whole sequence at the same tile size, over N (stria_balance_t's
// ideal_latency).
double IdealLatency(bool causal, int64_t seq_len, int world_size, int64_t tile);

}  // namespace stria
