// The TMA backward as a persistent kernel, sm_90a: tma_backward.cuh's producer warp, dQ warp,
// consumers, products and contract, in a grid of one CTA per SM that walks the block's work items
// (a key tile of one K/V head) instead of a CTA per item, as tma_forward_persistent.cuh does for
// the forward. The producer runs ahead across items: each item's Q/dO stages load as soon as the
// previous item's consumers free them, and its K and V once both consumer warpgroups' last
// products of the previous item, the last readers of K and V, have completed (their own "empty"
// mbarrier). So the next item's loads overlap the previous one's last step and the store of its
// dK/dV, and no item waits for a CTA to be scheduled and set up. Items go to CTAs in the
// CTA-per-item grid's order (every head's first key tiles first: under a causal mask the
// longest), in rounds back and forth (persistent_schedule.cuh).
//
// Every barrier's phase counts across items: the Q/dO stages and the dQ buffers by the CTA's
// step (all items' steps in sequence), K/V by the items with work. An item whose keys no query
// sees costs its consumers the zeros of its dK/dV rows.
//
// The roles' loops repeat tma_backward.cuh's (its bulk dQ store included) on purpose, as the
// persistent forward does: the CTA-per-tile kernel stays the default, as measured, until a GPU run
// has timed the two side by side.
#pragma once

#include "cuda/persistent_schedule.cuh"
#include "cuda/tma_backward.cuh"

namespace stria {
namespace cuda {

template <int D, bool kBulkDq = false>
struct TmaPersistentBwdTile : TmaBwdTile<D, kBulkDq> {
  // TmaBwdTile's barriers and K/V's "empty" one.
  static constexpr int kBarriers = TmaBwdTile<D, kBulkDq>::kBarriers + 1;
  static constexpr int kSmemBytes = TmaBwdTile<D, kBulkDq>::kSmemBytes + 8;
};

// The work items of a backward over key tiles: `tiles` key tiles of `heads` (batch row times K/V
// head) heads, item w in the slot of the CTA that a CTA-per-item grid starts w-th (CtaSlotAt, the
// heads in groups of `group`).
struct BackwardItems {
  unsigned tiles, heads, group;
  STRIA_HD unsigned count() const { return tiles * heads; }
  STRIA_HD CtaSlot At(unsigned w) const { return CtaSlotAt(w, tiles, heads, group); }
};

template <typename T, int D, bool kDocs = false, bool kDq = true, bool kBulkDq = false>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(384) WgmmaTmaPersistentBackwardKernel(const STRIA_GRID_CONSTANT TmaBwdParams tp) {
#if STRIA_HAS_WGMMA
  static_assert(kDq || !kBulkDq, "the bulk dQ needs a dQ");
  using Tile = TmaPersistentBwdTile<D, kBulkDq>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kStages = Tile::kStages, kConsumerThreads = 128 * Tile::kConsumers;
  const BwdParams& p = tp.p;
  STRIA_DYNAMIC_SMEM(smem_raw);
  const TmaBwdSmem sm = CarveTmaBwdSmem<Tile>(smem_raw);
  unsigned char *const ks = sm.ks, *const vs = sm.vs, *const qs = sm.qs, *const dos = sm.dos, *const dss = sm.dss;
  float *const lse2s = sm.lse2s, *const deltas = sm.deltas, *const dqs = sm.dqs;
  uint64_t* const kv_full = sm.kv_full;
  uint64_t* kv_empty = kv_full + 1;
  uint64_t* q_full = kv_empty + 1;
  uint64_t* q_empty = q_full + kStages;
  uint64_t* dq_full = q_empty + kStages;            // per dQ buffer: both consumer warpgroups wrote it
  uint64_t* dq_empty = dq_full + Tile::kDqBuffers;  // and the dQ warp's reduction has read it

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int group = d.Hq / d.Hkv;
  // The launch's key tiles: KeyTileCount's (a host function of params.h).
  const int64_t key_rows = p.key_rows > 0 && p.key_rows < d.L ? p.key_rows : d.L;
  const unsigned key_tiles =
      key_rows > p.key_begin ? static_cast<unsigned>((key_rows - p.key_begin + kN - 1) / kN) : 0u;
  const BackwardItems items{key_tiles, static_cast<unsigned>(d.B * d.Hkv), p.head_group};
  const PersistentItems schedule{items.count(), blockIdx.x, gridDim.x};
  // Item w: its batch row, K/V head and first key, and the query tiles that see its keys under
  // `mask` (the item's: with documents, its batch row's bounds), as every role of the CTA walks
  // them. (The mask stays a reference to the launch's own without documents, as in
  // tma_backward.cuh: these kernels' registers are tight.)
  struct Item {
    int b, hk;
    int64_t j0;
    TileRun queries;
  };
  auto item_of = [&](unsigned w, const MaskArgs& mask) {
    Item it;
    const CtaSlot slot = items.At(w);
    const int bhk = static_cast<int>(slot.head);
    it.b = bhk / d.Hkv;
    it.hk = bhk % d.Hkv;
    it.j0 = p.key_begin + static_cast<int64_t>(slot.tile) * kN;
    it.queries = QueryTilesOf<kDocs>(mask, it.j0, MinI(it.j0 + kN, d.L), kM);
    return it;
  };
  auto batch_of = [&](unsigned w) { return static_cast<int>(items.At(w).head) / d.Hkv; };
  // Step s of an item is query tile s % q_tiles of query head hk * group + s / q_tiles.
  auto head_of = [&](const Item& it, int s) { return it.hk * group + s / it.queries.count; };
  auto rows_of = [&](const Item& it, int s) {
    return it.queries.first + static_cast<int64_t>(s % it.queries.count) * kM;
  };

  if (tid == 0) {
    mbar_init(kv_full, 1);
    mbar_init(kv_empty, kConsumerThreads);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&q_full[st], 32);
      mbar_init(&q_empty[st], kConsumerThreads);
    }
    for (int buf = 0; buf < Tile::kDqBuffers; ++buf) {
      mbar_init(&dq_full[buf], kConsumerThreads);
      mbar_init(&dq_empty[buf], 1);
    }
    fence_barrier_init();
  }
  block_sync();  // the only block-wide barrier

  if (wg == 0) {
    setmaxnreg_dec<24>();
    if constexpr (kBulkDq) {
      if (warp == 1) {
        // The dQ warp: each step's tile into dq_acc, the CTA's steps in sequence.
        if (lane != 0) return;
        int gs = 0;
        for (unsigned k = 0; schedule.HasRound(k); ++k) {
          const unsigned w = schedule.At(k);
          if (w >= items.count()) continue;
          const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, batch_of(w)) : MaskArgs{};
          const Item it = item_of(w, kDocs ? docs_mask : p.mask);
          const int steps = it.queries.count * group;
          for (int s = 0; s < steps; ++s, ++gs)
            AddDqTile<D, kM>(p, dqs, dq_full, dq_empty, gs, [&] {
              return DqTile{static_cast<int64_t>(it.b) * d.Hq + head_of(it, s), rows_of(it, s)};
            });
        }
        bulk_wait_group<0>();  // the adds are done before the CTA's shared memory goes
        return;
      }
    }
    if (warp != 0) return;
    // The producer warp: lane 0 issues the copies, all 32 lanes store lse2 and delta.
    if (lane == 0) {
      prefetch_tensor_map(&tp.q_map);
      prefetch_tensor_map(&tp.do_map);
    }
    int gs = 0, kv_uses = 0;
    for (unsigned k = 0; schedule.HasRound(k); ++k) {
      const unsigned w = schedule.At(k);
      if (w >= items.count()) continue;
      const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, batch_of(w)) : MaskArgs{};
      const Item it = item_of(w, kDocs ? docs_mask : p.mask);
      if (it.queries.count == 0) continue;
      if (lane == 0) {
        mbar_wait(kv_empty, (kv_uses & 1) ^ 1);  // "complete" before its first use
        mbar_arrive_expect_tx(kv_full, 2 * Tile::kKvBytes);
        for (int cb = 0; cb < D / 64; ++cb) {
          tma_load_4d(ks + cb * kN * kSwizzleBytes, &tp.k_map, 64 * cb, it.hk, static_cast<int>(it.j0), it.b, kv_full);
          tma_load_4d(vs + cb * kN * kSwizzleBytes, &tp.v_map, 64 * cb, it.hk, static_cast<int>(it.j0), it.b, kv_full);
        }
      }
      ++kv_uses;
      for (int h = it.hk * group; h < (it.hk + 1) * group; ++h) {
        const float* lse2_row = p.lse2 + (static_cast<int64_t>(it.b) * d.Hq + h) * d.L;
        const float* delta_row = p.delta + (static_cast<int64_t>(it.b) * d.Hq + h) * d.L;
        for (int qt = 0; qt < it.queries.count; ++qt, ++gs) {
          const int st = gs % kStages;
          const int i0 = static_cast<int>(it.queries.first) + qt * kM;
          StageRows<kM> rows;  // loaded before the wait, as tma_backward.cuh's producer does
          rows.Load(lse2_row, delta_row, i0, d.L, lane);
          mbar_wait(&q_empty[st], ((gs / kStages) & 1) ^ 1);
          if (lane == 0) IssueQueryCopies<Tile>(tp, sm, &q_full[st], st, h, i0, it.b);
          rows.Store(lse2s + st * kM, deltas + st * kM, lane);
          mbar_arrive(&q_full[st]);
        }
      }
    }
    return;
  }

  // A consumer: warpgroup cw owns keys j0 + 64 cw .. + 63 of each item.
  setmaxnreg_inc<240>();
  const int cw = wg - 1, g = lane >> 2, t4 = lane & 3;
  const uint32_t k_addr = smem_addr(ks), v_addr = smem_addr(vs);
  auto consumers_sync = [] { named_barrier_sync(1, kConsumerThreads); };
  int gs = 0, kv_uses = 0;
  for (unsigned k = 0; schedule.HasRound(k); ++k) {
    const unsigned w = schedule.At(k);
    if (w >= items.count()) continue;
    const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, batch_of(w)) : MaskArgs{};
    const MaskArgs& mask = kDocs ? docs_mask : p.mask;
    const Item it = item_of(w, mask);
    if (it.queries.count == 0) {
      ZeroKeyGrads<T>(p, it.b, it.hk, it.j0, kN, tid - 128, kConsumerThreads);
      continue;
    }
    int64_t key[2];
    for (int e = 0; e < 2; ++e) key[e] = it.j0 + 64 * cw + 16 * warp + g + 8 * e;
    float dk[D / 2], dv[D / 2];
    STRIA_UNROLL
    for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

    mbar_wait(kv_full, kv_uses & 1);
    ++kv_uses;
    const int steps = it.queries.count * group;
    for (int s = 0; s < steps; ++s, ++gs) {
      const int st = gs % kStages;
      const int64_t i0 = rows_of(it, s), bh = static_cast<int64_t>(it.b) * d.Hq + head_of(it, s);
      mbar_wait(&q_full[st], (gs / kStages) & 1);
      const uint32_t q_addr = smem_addr(qs) + st * Tile::kQBytes, do_addr = smem_addr(dos) + st * Tile::kQBytes;
      const float* lse2 = lse2s + st * kM;
      const float* delta = deltas + st * kM;

      // tma_backward.cuh's bulk dQ: this warpgroup's block into buffer gs & 1.
      auto dq_to_buffer = [&](const float(&dq)[32], int qb, int cb) {
        const int buf = gs & 1;
        mbar_wait(&dq_empty[buf], ((gs >> 1) & 1) ^ 1);
        StoreDqBlock<D, kM>(dqs + buf * kM * D, p.mask, i0, dq, qb, cb);
        fence_proxy_async();
        mbar_arrive(&dq_full[buf]);
      };
      auto dq_atomics = [&](const float(&dq)[32], int qb, int cb) { AddDqAtomics<D>(p, bh, i0, dq, qb, cb); };
      auto step = [&](auto store_dq) {
        BackwardStep<T, D, kM, kN, kDocs, kDq, false>(
            p, mask, it.j0, cw, i0, k_addr, v_addr, q_addr, do_addr, dss + (gs % Tile::kDsBuffers) * Tile::kDsBytes,
            lse2, delta, key, dk, dv,
            [&] {
              // With one buffer, both warpgroups' dQ products of the previous step must be done reading
              // dS^T; with two, the previous step's meeting saw to it (TmaBwdTile::kDsBuffers).
              if constexpr (Tile::kDsBuffers == 1) consumers_sync();
            },
            [&] {
              fence_proxy_async();
              consumers_sync();  // dS^T of both warpgroups written and visible to wgmma
            },
            [&] { mbar_arrive(&q_empty[st]); },  // this stage's Q, dO, lse2 and delta have been read
            store_dq);
      };
      if constexpr (kBulkDq)
        step(dq_to_buffer);
      else
        step(dq_atomics);
    }
    // The item's last products have completed (BackwardStep waits for its own): K and V are free
    // for the next item while these rows' dK and dV go out.
    mbar_arrive(kv_empty);
    StoreKeyGrads<T, D>(p, it.b, it.hk, key, t4, dk, dv);
  }
#else
  (void)tp;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
