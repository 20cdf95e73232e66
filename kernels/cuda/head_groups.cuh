// How a tensor-core launch groups its heads so that what its CTAs read again and again stays in L2
// (FwdParams::head_group, BwdParams::head_group; the order itself: CtaSlotAt in tile_mask.cuh).
// Host code, for the launchers.
//
// A forward CTA (one query tile of one head) reads every K/V tile its rows see, so a head's K and V
// rows are read by each of its query tiles; a backward CTA (one key tile of one K/V head) reads the
// Q, dO, LSE and delta rows of every query tile that sees it and adds into their dQ accumulator
// rows. Those bytes are a head's working set. A group holds as many heads as fit half the L2 (the
// other half: the group before it, whose last CTAs still run, and the streams that pass through
// once), so the CTAs in flight, which come from one group or two, find them there.
#pragma once

#include <cuda_runtime.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "cuda/device_attribute.cuh"
#include "cuda/params.h"

namespace stria {
namespace cuda {

// STRIA_CUDA_HEAD_GROUP_BYTES unset or "" (a group's bytes: half the device's L2), "0" (no groups:
// every head at once, the order before groups) or a number of bytes, read at every launch (a
// getenv beside a kernel of milliseconds). False for anything else: a misspelt choice must not
// quietly measure the default. *bytes: -1 for the L2's half.
inline bool HeadGroupBudget(int64_t* bytes) {
  const char* env = std::getenv("STRIA_CUDA_HEAD_GROUP_BYTES");
  *bytes = -1;
  if (env == nullptr || *env == '\0') return true;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (errno != 0 || end == env || *end != '\0' || v < 0) return false;
  *bytes = v;
  return true;
}

// The current device's L2 in bytes; 0 where the runtime cannot say (the launch then only loses the
// grouping).
inline int64_t L2Bytes() {
  return CurrentDeviceAttribute(cudaDevAttrL2CacheSize, 0);
}

// The heads of a group for `heads` heads of `head_bytes` each: as many as fit the budget, at least
// one; 0 (one group of every head) where they all fit, or where there is no budget.
inline uint32_t HeadGroupOf(int64_t head_bytes, int64_t heads, int64_t budget) {
  if (budget <= 0 || head_bytes <= 0 || heads <= 1) return 0;
  const int64_t fit = budget / head_bytes;
  if (fit >= heads) return 0;
  return static_cast<uint32_t>(fit < 1 ? 1 : fit);
}

// The group of a launch whose heads each have `head_bytes` to keep. False: the switch is misspelt.
inline bool HeadGroup(int64_t head_bytes, int64_t heads, uint32_t* group) {
  int64_t budget = 0;
  if (!HeadGroupBudget(&budget)) return false;
  if (budget < 0) budget = L2Bytes() / 2;
  *group = HeadGroupOf(head_bytes, heads, budget);
  return true;
}

// A launch over query tiles and the B·Hq query heads (a forward, a dQ pass): each head's K and V
// rows, `elem` bytes a value, shared by the Hq / Hkv query heads of a K/V head (consecutive, so in
// one group).
inline bool QueryTileHeadGroup(const Dims& d, int elem, uint32_t* group) {
  const int64_t kv = 2 * int64_t{d.L} * d.D * elem, per_head = kv / (d.Hq / d.Hkv);
  return HeadGroup(per_head, int64_t{d.B} * d.Hq, group);
}
// A launch over key tiles and the B·Hkv K/V heads (a backward): the Q and dO rows (`elem` bytes a
// value), LSE and delta, and the float32 dQ accumulator of each of the K/V head's query heads.
inline bool KeyTileHeadGroup(const Dims& d, int elem, uint32_t* group) {
  const int64_t per_query_head = int64_t{d.L} * (int64_t{d.D} * (2 * elem + 4) + 8);
  return HeadGroup(per_query_head * (d.Hq / d.Hkv), int64_t{d.B} * d.Hkv, group);
}

}  // namespace cuda
}  // namespace stria
