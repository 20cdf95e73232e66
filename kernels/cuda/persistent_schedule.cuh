// Which work items a CTA of a persistent kernel takes (tma_forward_persistent.cuh,
// tma_backward_persistent.cuh). The items come longest first: a CTA-per-item grid's order (every
// head's longest tiles first under a causal mask, group by group of heads, CtaSlotAt; a document
// block's busy tiles, longest first). A persistent grid of G CTAs takes them in rounds of G, and a plain round robin
// (item w to CTA w mod G) would give CTA 0 the longest item of every round: with lengths falling
// evenly across the items (a causal mask), its sum over four rounds is a quarter above the mean.
// So the rounds go back and forth: in round k CTA c takes item k G + c when k is even and
// k G + G - 1 - c when it is odd, which pairs each round's longer items with the next round's
// shorter ones (equal sums under evenly falling lengths). The hardware's CTA-per-item scheduler
// balances by starting each CTA when a slot frees; this gets close to it without a shared counter.
#pragma once

#include "cuda/device_api.cuh"

namespace stria {
namespace cuda {

struct PersistentItems {
  unsigned count;  // items of the launch
  unsigned cta, ctas;
  // Whether round k exists (some CTA has an item in it).
  STRIA_HD bool HasRound(unsigned k) const { return k * ctas < count; }
  // This CTA's item of round k; count or more: none in this round.
  STRIA_HD unsigned At(unsigned k) const { return k * ctas + ((k & 1) != 0 ? ctas - 1 - cta : cta); }
};

}  // namespace cuda
}  // namespace stria
