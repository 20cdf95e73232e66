// Prefill with a KV cache sharded across the ranks (stria.h, stria_attention_prefill).
#pragma once

#include "engine/context.h"

namespace stria {

struct PrefillCall {
  const stria_attention_params_t* params;
  const stria_kv_cache_t* cache;
  int mode;  // stria_prefill_t, unchecked
  const DLTensor *q, *k, *v;
  DLTensor *out, *lse;
  void* stream;
};

// The new tokens attend to the whole cache and to each other over a ring: their keys and values
// travel (pass-KV) or their queries do, the partial results going home (pass-Q); the partial
// results of every rank's keys are merged in rank order, and the new tokens stored where the cache's
// layout puts them.
Status AttentionPrefill(Context& ctx, const PrefillCall& call);

}  // namespace stria
