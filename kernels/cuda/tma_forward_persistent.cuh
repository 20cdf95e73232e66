// The TMA forward as a persistent kernel, sm_90a: tma_forward.cuh's producer, consumers, products
// and contract, in a grid of one CTA per SM that walks the block's work items (a query tile of
// one head) instead of a CTA per item. What that buys:
//  - the producer runs ahead across items: while the consumers finish an item (its last P V, the
//    rows' store), the next item's Q and first K/V tiles are already on their way, so an item's
//    start no longer waits for its loads, and its end no longer leaves the tensor cores idle while
//    a new CTA is scheduled, initialises its barriers and loads;
//  - a launch's tail: the items go to the CTAs in rounds, longest first, back and forth
//    (persistent_schedule.cuh), so the short items fill the end on every SM;
//  - idle items (tiles of a document block with nothing visible) cost a few stores, not a CTA.
// Short blocks and document blocks, whose CTAs run for a handful of key tiles, are where a CTA's
// fixed cost weighs most: a ring step of packed documents is made of them.
//
// The stages' barriers keep counting across items (K/V tile t of the CTA's sequence is stage
// t mod kStages in its (t / kStages)-th use), and Q has a pair of its own: "full" (its bytes
// landed) and "empty" (every consumer warpgroup's last score product of the item, the last reader
// of Q, has completed). The consumers' ping-pong carries on across items.
//
// The consumers' item body repeats tma_forward.cuh's loop on purpose: the CTA-per-tile kernel
// stays the default, as measured, until a GPU run has timed the two side by side; then the one that
// loses goes, rather than reshaping the default's register-tight loop unmeasured.
#pragma once

#include "cuda/persistent_schedule.cuh"
#include "cuda/tma_forward.cuh"

namespace stria {
namespace cuda {

template <int D, int kConsumers = 2>
struct TmaPersistentFwdTile : TmaFwdTile<D, kConsumers> {
  // TmaFwdTile's barriers and Q's "empty" one.
  static constexpr int kBarriers = TmaFwdTile<D, kConsumers>::kBarriers + 1;
  static constexpr int kSmemBytes = TmaFwdTile<D, kConsumers>::kSmemBytes + 8;
};

// The work items of a forward over query tiles of kM rows: `tiles` tiles of `heads` (batch row
// times query head) heads, item w in the slot of the CTA that a CTA-per-item grid starts w-th
// (CtaSlotAt, the heads in groups of `group`).
struct ForwardItems {
  unsigned tiles, heads, group;
  STRIA_HD unsigned count() const { return tiles * heads; }
  STRIA_HD CtaSlot At(unsigned w) const { return CtaSlotAt(w, tiles, heads, group); }
};

template <typename T, int D, bool kDocs = false, int kConsumers = 2>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128 * (kConsumers + 1))
    WgmmaTmaPersistentForwardKernel(const STRIA_GRID_CONSTANT TmaFwdParams tp) {
#if STRIA_HAS_WGMMA
  using Tile = TmaPersistentFwdTile<D, kConsumers>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kStages = Tile::kStages, kConsumerThreads = 128 * Tile::kConsumers;
  const FwdParams& p = tp.p;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = qs + Tile::kQBytes;  // stage st at ks + st * kKvBytes
  unsigned char* vs = ks + kStages * Tile::kKvBytes;
  uint64_t* q_full = reinterpret_cast<uint64_t*>(vs + kStages * Tile::kKvBytes);
  uint64_t* q_empty = q_full + 1;
  uint64_t* k_full = q_empty + 1;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7;
  const ForwardItems items{QueryTileCount(p.mask, kM), static_cast<unsigned>(d.B * d.Hq), p.head_group};
  const PersistentItems schedule{items.count(), blockIdx.x, gridDim.x};
  auto stage_of = [](int t) { return t % kStages; };
  auto parity_of = [](int t) { return (t / kStages) & 1; };

  if (tid == 0) {
    mbar_init(q_full, 1);
    mbar_init(q_empty, kConsumerThreads);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&k_full[st], 1);
      mbar_init(&v_full[st], 1);
      mbar_init(&k_empty[st], kConsumerThreads);
      mbar_init(&v_empty[st], kConsumerThreads);
    }
    fence_barrier_init();
  }
  block_sync();  // the only block-wide barrier: from here the warpgroups go their own ways

  if (wg == 0) {
    // The producer: Q of each item with work once its buffer is free, then the item's K/V tiles.
    setmaxnreg_dec<Tile::kProducerRegs>();
    if (tid != 0) return;
    prefetch_tensor_map(&tp.q_map);
    prefetch_tensor_map(&tp.k_map);
    prefetch_tensor_map(&tp.v_map);
    int t = 0, q_uses = 0;  // K/V tiles and Q tiles loaded so far
    for (unsigned k = 0; schedule.HasRound(k); ++k) {
      const unsigned w = schedule.At(k);
      if (w >= items.count()) continue;
      const CtaSlot slot = items.At(w);
      const int bh = static_cast<int>(slot.head);
      const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, bh / d.Hq) : MaskArgs{};
      const MaskArgs& mask = kDocs ? docs_mask : p.mask;
      const int64_t i0 = QueryTileStart(mask, kM, slot.tile, items.tiles);
      const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
      if (keys.count == 0) continue;
      const int b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
      mbar_wait(q_empty, (q_uses & 1) ^ 1);  // "complete" before its first use
      ++q_uses;
      mbar_arrive_expect_tx(q_full, Tile::kQBytes);
      for (int cb = 0; cb < D / 64; ++cb)
        tma_load_4d(qs + cb * kM * kSwizzleBytes, &tp.q_map, 64 * cb, h, static_cast<int>(i0), b, q_full);
      for (int n = 0; n < keys.count; ++n, ++t) {
        const int st = stage_of(t), parity = parity_of(t);
        const int j = static_cast<int>(keys.first + int64_t{kN} * n);
        mbar_wait(&k_empty[st], parity ^ 1);
        mbar_arrive_expect_tx(&k_full[st], Tile::kKvBytes);
        for (int cb = 0; cb < D / 64; ++cb)
          tma_load_4d(ks + st * Tile::kKvBytes + cb * kN * kSwizzleBytes, &tp.k_map, 64 * cb, hk, j, b, &k_full[st]);
        mbar_wait(&v_empty[st], parity ^ 1);
        mbar_arrive_expect_tx(&v_full[st], Tile::kKvBytes);
        for (int cb = 0; cb < D / 64; ++cb)
          tma_load_4d(vs + st * Tile::kKvBytes + cb * kN * kSwizzleBytes, &tp.v_map, 64 * cb, hk, j, b, &v_full[st]);
      }
    }
    return;
  }

  // A consumer: warpgroup `group` owns rows i0 + 64 * group .. + 63 of each item.
  setmaxnreg_inc<Tile::kConsumerRegs>();
  const int group = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const uint32_t q_addr = smem_addr(qs), k_addr = smem_addr(ks), v_addr = smem_addr(vs);
  // The ping-pong, as in tma_forward.cuh: every warpgroup takes n_tiles + 1 turns of each item,
  // so the turn the last warpgroup opens at an item's end is warpgroup 0's first of the next.
  const ConsumerTurns<Tile::kConsumers> turns{group};
  turns.Open();

  int t = 0, q_uses = 0;  // as the producer counts them
  for (unsigned k = 0; schedule.HasRound(k); ++k) {
    const unsigned w = schedule.At(k);
    if (w >= items.count()) continue;
    const CtaSlot slot = items.At(w);
    const int bh = static_cast<int>(slot.head);
    const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, bh / d.Hq) : MaskArgs{};
    const MaskArgs& mask = kDocs ? docs_mask : p.mask;
    const int64_t i0 = QueryTileStart(mask, kM, slot.tile, items.tiles);
    const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
    if (keys.count == 0) {
      IdleRows<T>(p, mask, bh, i0, kM, tid - 128, kConsumerThreads);
      continue;
    }
    const int64_t j_first = keys.first, gi0 = i0 + 64 * group, gi1 = gi0 + 64;
    const int n_tiles = keys.count;

    int64_t row[2];
    bool live[2];
    float m_run[2], l_run[2];
    float o[D / 2];
    LoadWarpgroupRows<D>(p, bh, gi0, warp, g, t4, row, live, m_run, l_run, o);

    float s[kN / 2];
    float alpha[2];
    uint32_t pa[kN / 16][4];  // P(n) as A fragments
    auto pin_pv_operands = [&] {
      wgmma_fence_operand(o);
      wgmma_fence_operand(pa);
    };
    mbar_wait(q_full, q_uses & 1);
    ++q_uses;
    mbar_wait(&k_full[stage_of(t)], parity_of(t));
    turns.Take();
    wgmma_fence();
    IssueScores<T, D, kM, kN>(s, q_addr, k_addr + stage_of(t) * Tile::kKvBytes, group);
    turns.Pass();
    wgmma_wait<0>();
    wgmma_fence_operand(s);
    mbar_arrive(&k_empty[stage_of(t)]);
    if (n_tiles == 1) mbar_arrive(q_empty);  // the item's last score product: Q is free
    WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j_first, j_first + kN), row, j_first, t4,
                            m_run, l_run, alpha);
    RescaleAndPack<T, D, kN>(o, alpha, s, pa);

    for (int n = 0; n + 1 < n_tiles; ++n) {
      const int kst = stage_of(t + n + 1), vst = stage_of(t + n);
      mbar_wait(&k_full[kst], parity_of(t + n + 1));
      mbar_wait(&v_full[vst], parity_of(t + n));
      turns.Take();
      pin_pv_operands();
      wgmma_fence();
      IssueScores<T, D, kM, kN>(s, q_addr, k_addr + kst * Tile::kKvBytes, group);
      IssuePV<T, D, kN>(o, pa, v_addr + vst * Tile::kKvBytes);
      turns.Pass();
      wgmma_wait<1>();  // S(n+1) done: its K stage is free, and Q after the item's last
      wgmma_fence_operand(s);
      mbar_arrive(&k_empty[kst]);
      if (n + 2 == n_tiles) mbar_arrive(q_empty);
      const int64_t j1 = j_first + int64_t{kN} * (n + 1);
      WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j1, j1 + kN), row, j1, t4, m_run, l_run,
                              alpha);
      wgmma_wait<0>();  // P(n) V(n) done: its V stage, o and pa are free
      pin_pv_operands();
      mbar_arrive(&v_empty[vst]);
      RescaleAndPack<T, D, kN>(o, alpha, s, pa);
    }
    const int vst = stage_of(t + n_tiles - 1);
    mbar_wait(&v_full[vst], parity_of(t + n_tiles - 1));
    turns.Take();
    pin_pv_operands();
    wgmma_fence();
    IssuePV<T, D, kN>(o, pa, v_addr + vst * Tile::kKvBytes);
    turns.Pass();
    wgmma_wait<0>();
    wgmma_fence_operand(o);
    mbar_arrive(&v_empty[vst]);  // the stage is reused by a later item
    t += n_tiles;

    StoreWarpgroupRows<T, D>(p, bh, t4, row, live, m_run, l_run, o);
  }
#else
  (void)tp;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
