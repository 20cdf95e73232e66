// Serving over a KV cache sharded across the ranks (stria.h, stria_attention_decode).
#pragma once

#include "engine/context.h"

namespace stria {

struct DecodeCall {
  const stria_attention_params_t* params;
  const stria_kv_cache_t* cache;
  const DLTensor *q, *k_new, *v_new;
  DLTensor *out, *lse;
  void* stream;
};

// Each rank attends the queries to its share of the cache (after storing the new tokens it holds),
// then one all-gather of the partial outputs and LSEs, merged in rank order on every rank.
Status AttentionDecode(Context& ctx, const DecodeCall& call);

}  // namespace stria
