// One rank's share of a sharded KV cache as a call validated it (stria.h, stria_kv_cache_t): where
// each of its slots lives in memory (contiguous or paged), which of them hold a sequence's cached
// positions, and where a new token goes.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.h"
#include "engine/context.h"

namespace stria {

struct CacheView {
  stria_layout_t layout = STRIA_LAYOUT_STRIPED;
  int world_size = 1, rank = 0;
  TensorView k, v;
  int64_t heads = 0;     // Hkv, dimension 2 of k and v
  int64_t capacity = 0;  // slots per sequence on each rank
  bool paged = false;
  const int32_t* table = nullptr;  // paged: block_table (or its host copy), its strides in elements
  std::vector<char> table_staged;  // a device table's host copy
  int64_t table_b = 0, table_i = 0, block_size = 0, num_blocks = 0;
  std::vector<int64_t> lens;  // cache->lens, read on the host

  // The segments of this rank's slots that hold sequence b's positions [first, len) (len at most
  // world_size * capacity), in slot order (so positions increase), cut at page ends. A window's
  // calls start at the first position any query sees: the keys before it are neither planned into
  // the work items nor looked up in a block table.
  Status AddSegments(int64_t b, int64_t len, std::vector<CacheSegment>* out, int64_t first = 0) const;
  // If this rank holds position `pos` of sequence b: the append that stores a token's rows there
  // (k_src, v_src: head 0's D elements; heads src_head bytes apart).
  Status AddAppend(int64_t b, int64_t pos, const char* k_src, const char* v_src, int64_t k_src_head, int64_t v_src_head,
                   std::vector<CacheAppend>* out) const;
  // What ranks must agree on: the lengths, the capacity and the kind of cache.
  uint64_t Hash(uint64_t seed) const;

 private:
  // Slot s of sequence b: its K and V rows (head 0) and how many slots from s on follow at the
  // same stride (to the end of its page); false, with *why, for a table entry outside the pool.
  bool Find(int64_t b, int64_t s, char** k_row, char** v_row, int64_t* run, Status* why) const;
};

// Validates `cache` for a call whose queries are B sequences of head dim D in `dtype` (written:
// whether the call stores new tokens into it); reads the lengths onto the host and checks them:
// each plus `added` new tokens must fit in the cache's world_size * capacity positions.
Status ValidateCache(Context& ctx, const stria_kv_cache_t* cache, stria_layout_t layout, int64_t B, int64_t D,
                     DType dtype, int64_t added, void* stream, CacheView* out);

inline uint64_t HashMix(uint64_t h, uint64_t x) {
  return (h ^ x) * 0x100000001b3ull;
}

}  // namespace stria
