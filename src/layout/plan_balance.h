// Load-balance analysis of a document plan (stria_plan_analyze_balance): the work of every rank
// at every ring step at a kernel's tile size, counted as the kernels compute it, and the ideal it
// is measured against.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "layout/plan.h"

namespace stria {

// work[s * N + r] += the work of rank r at ring step s (it holds the keys of rank (r - s) mod N)
// over every batch row: for each query tile, the key tiles from its first row's lowest visible key
// to its last row's highest, each counted whole (tile = 1: exact pairs). `work` has N² entries,
// zeroed by the caller.
void PlanStepWork(const Plan& plan, const MaskSpec& mask, int64_t tile, double* work);

// The work of one device computing every document of the plan's rows on its own, tiles starting at
// each document's first token (a variable-length kernel): the ring's ideal is this over N.
double PlanIdealWork(const Plan& plan, const MaskSpec& mask, int64_t tile);

// The K/V token rows one forward call on the plan sends, over every rank and ring step: each
// block trimmed to the rows ranks further along the ring see (Plan::RowsStillNeeded), rounded up
// to whole tiles of `tile` keys as the kernels read them.
double PlanKVRowsSent(const Plan& plan, const MaskSpec& mask, int64_t tile);

}  // namespace stria
