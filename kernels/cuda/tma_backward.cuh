// Hopper backward tile kernel with TMA loads and warp specialisation, sm_90a: wgmma_backward.cuh's
// contract and products (a CTA owns 128 keys of one K/V head, 64 per consumer warpgroup, and
// walks the query tiles of every query head of its GQA group), with the loads moved to a
// producer warp as in the TMA forward (tma_forward.cuh):
//  - K and V arrive once by TMA; each step's Q and dO tiles by TMA into two stages, with the
//    step's lse2 and delta rows stored beside them by the producer warp's 32 lanes (loaded into
//    registers before the wait for the stage), all of it published by the stage's "full"
//    mbarrier (32 arrivals and the TMA bytes, announced before the copies); the consumers release
//    a stage on its "empty" mbarrier once their dK and dV products, the last readers of Q and dO,
//    have completed;
//  - the two consumer warpgroups meet only where they exchange dS^T (a 256-thread named barrier
//    before writing it, so the previous step's dQ products are done reading it, and one after, so
//    both halves are in), never with the producer.
// The products and masks are wgmma_backward.cuh's, step for step (and, with kDq false, its step
// without dQ: the consumers then never meet). dQ goes out one of two ways:
//  - kBulkDq (the default): each consumer warpgroup writes its 64 x 64 block of the step's dQ into
//    a shared [kM][D] float buffer (two of them, alternating by step) and arrives on the buffer's
//    "full" mbarrier; warp 1 of the producer warpgroup adds the whole tile into dq_acc with one bulk
//    reduction (the tile's rows are contiguous there), waits until it has read the buffer and
//    arrives on its "empty" mbarrier. The consumers' share of dQ is then a few shared stores, where
//    per-element atomics held them for the L2's round trips, and the L2 adds whole lines;
//  - otherwise the consumers' per-element atomics, as the wgmma kernel (STRIA_CUDA_TMA_DQ=atomic,
//    for comparing the two).
// With kOrderedDq (the deterministic backward, ordered_dq.cuh) the bulk dQ's adds into each query
// tile come in the order of the key tiles: the CTA takes its key tile by ticket, walks its query
// tiles from the last with the heads of its group inside, and the dQ warp passes every query tile
// linked to its key tile, waiting for the key tiles before it and releasing the ones after.
#pragma once

#include "cuda/ordered_dq.cuh"
#include "cuda/tma_api.cuh"
#include "cuda/wgmma_backward.cuh"

namespace stria {
namespace cuda {

template <int D, bool kBulkDq = false, bool kOrderedDq = false>
struct TmaBwdTile {
  static constexpr int kConsumers = 2, kThreads = 128 * (kConsumers + 1), kN = 128;
  static constexpr int kM = WgmmaBwdTile<D>::kM, kStages = 2, kD = D;
  static constexpr int kKvBytes = kN * D * 2, kQBytes = kM * D * 2, kDsBytes = kN * kM * 2;
  // The bulk dQ's two [kM][D] float buffers (none with atomics).
  static constexpr int kDqBuffers = kBulkDq ? 2 : 0, kDqBytes = kM * D * 4;
  // K/V full, per stage Q/dO full and empty, per dQ buffer full and empty.
  static constexpr int kBarriers = 1 + 2 * kStages + 2 * kDqBuffers;
  // The ordered dQ's ticket, as thread 0 took it for the CTA.
  static constexpr int kTicketBytes = kOrderedDq ? 16 : 0;
  // K, V; Q and dO per stage; lse2 and delta per stage; the dQ buffers; the barriers; the ticket;
  // the alignment slack; and dS^T.
  static constexpr int kBytesBesideDs = 2 * kKvBytes + 2 * kStages * kQBytes + 2 * kStages * kM * 4 +
                                        kDqBuffers * kDqBytes + 8 * kBarriers + kTicketBytes + kSwizzleAtomBytes;
  // dS^T in two buffers, alternating by step, where a CTA's 227 KB hold them (D 128; D 64 with the
  // atomic dQ): a warpgroup then writes step s's while the other's dQ product of step s - 1 may
  // still read the other one, and the warpgroups meet once a step (dS^T written) instead of twice.
  // The buffer step s writes was last read by both warpgroups' dQ of step s - 2, which each
  // completed before it arrived at the meeting of step s - 1. The persistent kernel's K/V "empty"
  // barrier (8 bytes) is counted in.
  static constexpr int kDsBuffers = kBytesBesideDs + 8 + 2 * kDsBytes <= 227 * 1024 ? 2 : 1;
  static constexpr int kSmemBytes = kBytesBesideDs + kDsBuffers * kDsBytes;
  static_assert(kSmemBytes + 8 <= 227 * 1024, "over the shared memory a CTA may have on sm_90");
};

// The block's parameters and the TMA maps of the caller's Q and dO (boxes of kM rows) and of the
// compact K and V of the ring block (boxes of kN rows).
struct TmaBwdParams {
  BwdParams p;
  TensorMap q_map, do_map, k_map, v_map;
};

#if STRIA_HAS_WGMMA
// A TMA backward CTA's shared memory, carved from the dynamic allocation in TmaBwdTile's order:
// K, V; Q and dO (stage st at + st * kQBytes); dS^T (buffer n at dss + n * kDsBytes); lse2 and
// delta ([kStages][kM] each); the bulk dQ's buffers ([kDqBuffers][kM][D], 16-byte aligned); then
// the mbarriers, from K/V's "full" one on (each kernel lays out the rest).
struct TmaBwdSmem {
  unsigned char *ks, *vs, *qs, *dos, *dss;
  float *lse2s, *deltas, *dqs;
  uint64_t* kv_full;
};
template <typename Tile>
STRIA_DEVICE TmaBwdSmem CarveTmaBwdSmem(unsigned char* raw) {
  TmaBwdSmem m;
  m.ks = AlignToSwizzleAtom(raw);
  m.vs = m.ks + Tile::kKvBytes;
  m.qs = m.vs + Tile::kKvBytes;
  m.dos = m.qs + Tile::kStages * Tile::kQBytes;
  m.dss = m.dos + Tile::kStages * Tile::kQBytes;
  m.lse2s = reinterpret_cast<float*>(m.dss + Tile::kDsBuffers * Tile::kDsBytes);
  m.deltas = m.lse2s + Tile::kStages * Tile::kM;
  m.dqs = m.deltas + Tile::kStages * Tile::kM;
  m.kv_full = reinterpret_cast<uint64_t*>(m.dqs + Tile::kDqBuffers * Tile::kM * Tile::kD);
  return m;
}

// A producer lane's lse2 and delta values of a step's rows (rows lane, lane + 32, ... of the
// tile at i0 of one query head's rows): loaded into registers before the producer waits for the
// step's stage, so that their round trip runs behind the wait, then stored into the stage.
// Rows past L take lse2 = +inf, which makes exp2(s - lse2) = 0, and delta 0.
template <int kM>
struct StageRows {
  float lse2[kM / 32], delta[kM / 32];
  STRIA_DEVICE void Load(const float* lse2_row, const float* delta_row, int64_t i0, int64_t L, int lane) {
    STRIA_UNROLL
    for (int k = 0; k < kM / 32; ++k) {
      const int64_t i = i0 + lane + 32 * k;
      lse2[k] = i < L ? lse2_row[i] : PosInf();
      delta[k] = i < L ? delta_row[i] : 0.f;
    }
  }
  STRIA_DEVICE void Store(float* lse2s, float* deltas, int lane) const {
    STRIA_UNROLL
    for (int k = 0; k < kM / 32; ++k) {
      lse2s[lane + 32 * k] = lse2[k];
      deltas[lane + 32 * k] = delta[k];
    }
  }
};

// The producer warp's copies of a step (lane 0): the Q and dO rows [i0, i0 + kM) of query head h
// of batch row b into stage st, their bytes announced on the stage's "full" barrier without an
// arrival. Every lane of the warp then stores its lse2 and delta rows and arrives (32
// arrivals). Between the stage's release and its refill there is then one round trip (the
// copies'), where the lanes' loads followed by the copies put two there.
template <typename Tile>
STRIA_DEVICE void IssueQueryCopies(const TmaBwdParams& tp, const TmaBwdSmem& sm, uint64_t* full, int st, int h, int i0,
                                   int b) {
  mbar_expect_tx(full, 2 * Tile::kQBytes);
  for (int cb = 0; cb < Tile::kD / 64; ++cb) {
    const int at = st * Tile::kQBytes + cb * Tile::kM * kSwizzleBytes;
    tma_load_4d(sm.qs + at, &tp.q_map, 64 * cb, h, i0, b, full);
    tma_load_4d(sm.dos + at, &tp.do_map, 64 * cb, h, i0, b, full);
  }
}

// The bulk dQ warp's add of the dQ tile the consumers handed over as their step s (in buffer
// s & 1 of dqs): rows [i0, i0 + kM) of query head row bh (tile(), asked once the tile is
// there, so that the warp's few registers do not hold it across the wait) into dq_acc in one bulk
// reduction, then the buffer back to the consumers once it has been read. The tile's rows past L
// are left out (the last tile may run past the block); those outside the block's queries hold
// zeros (the consumers' stores).
struct DqTile {
  int64_t bh, i0;
};
template <int D, int kM, typename Tile>
STRIA_DEVICE void AddDqTile(const BwdParams& p, const float* dqs, uint64_t* dq_full, uint64_t* dq_empty, int s,
                            Tile tile) {
  const int buf = s & 1;
  mbar_wait(&dq_full[buf], (s >> 1) & 1);
  const DqTile t = tile();
  const int64_t rows = MinI(static_cast<int64_t>(kM), p.dims.L - t.i0);
  bulk_reduce_add_f32(p.dq_acc + (t.bh * p.dims.L + t.i0) * D, dqs + buf * kM * D, static_cast<uint32_t>(rows * D * 4));
  bulk_commit_group();
  bulk_wait_group_read<0>();  // the buffer has been read: the consumers may write it again
  mbar_arrive(&dq_empty[buf]);
}

// A consumer warpgroup's 64 x 64 block of a step's dQ (rows 64 qb.., columns 64 cb.. of the tile at
// i0; the accumulator layout) into the bulk dQ's buffer `tile` ([kM][D] floats), for the dQ warp's
// reduction. Rows outside the block's queries go in as zeros, so that a NaN or an infinity in K
// that their zero dS met cannot reach rows the block does not own; the test is made once a tile
// (most tiles lie wholly inside: no select a value there).
template <int D, int kM>
STRIA_DEVICE void StoreDqBlock(float* tile, const MaskArgs& launch_mask, int64_t i0, const float (&dq)[32], int qb,
                               int cb) {
  const int warp = (static_cast<int>(threadIdx.x) >> 5) & 3, lane = static_cast<int>(threadIdx.x) & 31;
  const int g = lane >> 2, t4 = lane & 3;
  auto store = [&](auto all) {
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int r = 64 * qb + 16 * warp + g + 8 * e;
      const bool own = decltype(all)::kAll || (i0 + r >= launch_mask.q_begin && i0 + r < launch_mask.q_end);
      STRIA_UNROLL
      for (int nt = 0; nt < 8; ++nt) {
        // One 8-byte store (the pair's address is 8-byte aligned).
        struct alignas(8) Pair {
          float lo, hi;
        };
        *reinterpret_cast<Pair*>(tile + r * D + 64 * cb + 8 * nt + 2 * t4) =
            Pair{own ? dq[4 * nt + 2 * e] : 0.f, own ? dq[4 * nt + 2 * e + 1] : 0.f};
      }
    }
  };
  WithWholeTile(i0 >= launch_mask.q_begin && i0 + kM <= launch_mask.q_end, store);
}
#endif

template <typename T, int D, bool kDocs = false, bool kDq = true, bool kBulkDq = false, bool kOrderedDq = false>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(384) WgmmaTmaBackwardKernel(const STRIA_GRID_CONSTANT TmaBwdParams tp) {
#if STRIA_HAS_WGMMA
  static_assert(kDq || !kBulkDq, "the bulk dQ needs a dQ");
  static_assert(kBulkDq || !kOrderedDq, "the ordered dQ orders the bulk dQ's adds");
  using Tile = TmaBwdTile<D, kBulkDq, kOrderedDq>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kStages = Tile::kStages, kConsumerThreads = 128 * Tile::kConsumers;
  const BwdParams& p = tp.p;
  STRIA_DYNAMIC_SMEM(smem_raw);
  const TmaBwdSmem sm = CarveTmaBwdSmem<Tile>(smem_raw);
  unsigned char *const ks = sm.ks, *const vs = sm.vs, *const qs = sm.qs, *const dos = sm.dos, *const dss = sm.dss;
  float *const lse2s = sm.lse2s, *const deltas = sm.deltas, *const dqs = sm.dqs;
  uint64_t* const kv_full = sm.kv_full;
  uint64_t* q_full = kv_full + 1;
  uint64_t* q_empty = q_full + kStages;
  uint64_t* dq_full = q_empty + kStages;            // per dQ buffer: both consumer warpgroups wrote it
  uint64_t* dq_empty = dq_full + Tile::kDqBuffers;  // and the dQ warp's reduction has read it

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  CtaSlot cta = CtaSlotOf(p.head_group);
  if constexpr (kOrderedDq) {
    // The key tile by ticket, in the order of CtaSlotOf (ordered_dq.cuh).
    int* ticket = reinterpret_cast<int*>(dq_empty + Tile::kDqBuffers);
    if (tid == 0) *ticket = take_ticket(p.dq_order);
    block_sync();
    cta = CtaSlotAt(static_cast<uint64_t>(*ticket), gridDim.x, gridDim.y, p.head_group);
  }
  const int bhk = static_cast<int>(cta.head), b = bhk / d.Hkv, hk = bhk % d.Hkv;
  const int group = d.Hq / d.Hkv;
  const int64_t j0 = p.key_begin + static_cast<int64_t>(cta.tile) * kN;
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is
  // (kDocs false compiles the clamp out: these kernels' registers are tight).
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const TileRun queries = QueryTilesOf<kDocs>(mask, j0, MinI(j0 + kN, d.L), kM);
  if (queries.count == 0) {
    ZeroKeyGrads<T>(p, b, hk, j0, kN, Tile::kThreads);  // the whole CTA, before any barrier
    if constexpr (kOrderedDq) {
      // No work here, but the key tile may be linked to query tiles all the same.
      if (tid < 32) PassLinkedTiles<kDocs>(p, mask, kM, kN, cta.tile, cta.head, [](int64_t) {});
    }
    return;
  }
  const int64_t i_first = queries.first;
  const int q_tiles = queries.count, steps = q_tiles * group;
  // Step s is query tile s % q_tiles of query head hk * group + s / q_tiles, in stage s % kStages;
  // with the ordered dQ query tile q_tiles - 1 - s / group of head hk * group + s % group.
  auto head_of = [&](int s) { return hk * group + (kOrderedDq ? s % group : s / q_tiles); };
  auto rows_of = [&](int s) {
    return i_first + static_cast<int64_t>(kOrderedDq ? q_tiles - 1 - s / group : s % q_tiles) * kM;
  };
  // Step s's dQ tile for AddDqTile: its query head row and first row.
  auto dq_tile_of = [&](int s) {
    return [&, s] { return DqTile{static_cast<int64_t>(b) * d.Hq + head_of(s), rows_of(s)}; };
  };

  if (tid == 0) {
    mbar_init(kv_full, 1);
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
  block_sync();  // the last block-wide barrier

  if (wg == 0) {
    // The producer: warp 0 (lane 0 issues the copies, all 32 lanes store lse2 and delta), and with
    // the bulk dQ lane 0 of warp 1, which adds each step's dQ tile into dq_acc.
    setmaxnreg_dec<24>();
    if constexpr (kOrderedDq) {
      if (warp == 1) {
        int s = 0;  // the next step whose dQ the consumers hand over
        PassLinkedTiles<kDocs>(p, mask, kM, kN, cta.tile, cta.head, [&](int64_t m) {
          for (; s < steps && rows_of(s) == m * kM; ++s)  // the heads of the group, in step order
            AddDqTile<D, kM>(p, dqs, dq_full, dq_empty, s, dq_tile_of(s));
          bulk_wait_group<0>();  // complete before the release publishes them
        });
        // A step the walk did not take would leave the consumers waiting for its buffer forever
        // (a query tile walked but not linked: LinkedPlace's contract broken): an error instead.
        if (lane == 0 && s < steps) trap();
        return;
      }
    } else if constexpr (kBulkDq) {
      if (warp == 1) {
        if (lane != 0) return;
        for (int s = 0; s < steps; ++s) AddDqTile<D, kM>(p, dqs, dq_full, dq_empty, s, dq_tile_of(s));
        bulk_wait_group<0>();  // the adds are done before the CTA's shared memory goes
        return;
      }
    }
    if (warp != 0) return;
    if (lane == 0) {
      prefetch_tensor_map(&tp.q_map);
      prefetch_tensor_map(&tp.do_map);
      mbar_arrive_expect_tx(kv_full, 2 * Tile::kKvBytes);
      for (int cb = 0; cb < D / 64; ++cb) {
        tma_load_4d(ks + cb * kN * kSwizzleBytes, &tp.k_map, 64 * cb, hk, static_cast<int>(j0), b, kv_full);
        tma_load_4d(vs + cb * kN * kSwizzleBytes, &tp.v_map, 64 * cb, hk, static_cast<int>(j0), b, kv_full);
      }
    }
    for (int s = 0; s < steps; ++s) {
      const int st = s % kStages, h = head_of(s);
      const int64_t bh = static_cast<int64_t>(b) * d.Hq + h;
      // The step's rows, loaded before the wait for its stage: their round trip runs behind it.
      StageRows<kM> rows;
      rows.Load(p.lse2 + bh * d.L, p.delta + bh * d.L, rows_of(s), d.L, lane);
      mbar_wait(&q_empty[st], ((s / kStages) & 1) ^ 1);  // the first use of a stage does not wait
      if (lane == 0) IssueQueryCopies<Tile>(tp, sm, &q_full[st], st, h, static_cast<int>(rows_of(s)), b);
      rows.Store(lse2s + st * kM, deltas + st * kM, lane);
      mbar_arrive(&q_full[st]);  // after this lane's stores: the arrival releases them
    }
    return;
  }

  // A consumer: warpgroup cw owns keys j0 + 64 cw .. + 63.
  setmaxnreg_inc<240>();
  const int cw = wg - 1, g = lane >> 2, t4 = lane & 3;
  const uint32_t k_addr = smem_addr(ks), v_addr = smem_addr(vs);
  auto consumers_sync = [] { named_barrier_sync(1, kConsumerThreads); };
  int64_t key[2];
  for (int e = 0; e < 2; ++e) key[e] = j0 + 64 * cw + 16 * warp + g + 8 * e;
  float dk[D / 2], dv[D / 2];
  STRIA_UNROLL
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;

  mbar_wait(kv_full, 0);
  for (int s = 0; s < steps; ++s) {
    const int st = s % kStages;
    const int64_t i0 = rows_of(s), bh = static_cast<int64_t>(b) * d.Hq + head_of(s);
    mbar_wait(&q_full[st], (s / kStages) & 1);
    const uint32_t q_addr = smem_addr(qs) + st * Tile::kQBytes, do_addr = smem_addr(dos) + st * Tile::kQBytes;
    const float* lse2 = lse2s + st * kM;
    const float* delta = deltas + st * kM;

    // The bulk dQ: this warpgroup's block of the tile into buffer s & 1 once the dQ warp has read
    // what was there two steps ago.
    auto dq_to_buffer = [&](const float(&dq)[32], int qb, int cb) {
      const int buf = s & 1;
      mbar_wait(&dq_empty[buf], ((s >> 1) & 1) ^ 1);  // the first use of a buffer does not wait
      StoreDqBlock<D, kM>(dqs + buf * kM * D, p.mask, i0, dq, qb, cb);
      fence_proxy_async();  // the stores, visible to the bulk reduction's reads
      mbar_arrive(&dq_full[buf]);
    };
    auto dq_atomics = [&](const float(&dq)[32], int qb, int cb) { AddDqAtomics<D>(p, bh, i0, dq, qb, cb); };
    auto step = [&](auto store_dq) {
      BackwardStep<T, D, kM, kN, kDocs, kDq, !kOrderedDq>(
          p, mask, j0, cw, i0, k_addr, v_addr, q_addr, do_addr, dss + (s % Tile::kDsBuffers) * Tile::kDsBytes, lse2,
          delta, key, dk, dv,
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

  StoreKeyGrads<T, D>(p, b, hk, key, t4, dk, dv);
#else
  (void)tp;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
