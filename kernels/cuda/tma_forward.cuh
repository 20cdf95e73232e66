// Hopper forward tile kernel with TMA loads and warp specialisation (FlashAttention-3's
// producer/consumer structure), sm_90a. The contract is wgmma_forward.cuh's: one ring block's
// keys merged into the fp32 running state of 128 queries of one head. What changes is who loads:
//  - a producer warpgroup (one thread of it issues everything) loads Q once and K/V tiles into a
//    ring of two stages with TMA, each stage guarded by a "full" mbarrier (its bytes landed) and
//    an "empty" one (every consumer is done reading it);
//  - consumer warpgroups (64 query rows each) only compute: no load instructions, no address
//    arithmetic and no block barriers in their loop, so the tensor cores are fed by their own
//    warpgroups while the copy engine fills the next stage.
// Registers move with the work (setmaxnreg): the producer gives most of its own up, and the
// consumers, which hold the output rows, the scores and P, take them (TmaFwdTile: 24 + 2 x 240
// per thread of a 384-thread CTA, or 24 + 3 x 160 of a 512-thread one, within the 64K of an SM).
//
// Two consumers, or three at head dim 64 (FlashAttention-3's 192-row tile there; chosen by
// STRIA_CUDA_TMA_FORWARD_ROWS, tma_schedule.h, until a GPU has timed the two side by side). A key
// tile's softmax costs the same at every head dim while its products shrink with it, so at
// D 64 two warpgroups' products are too short to cover each other's softmax: the tensor cores
// wait. A third warpgroup's products fill that gap, and each K/V tile loaded serves 192 query
// rows instead of 128. Its registers allow it at D 64 only (the output rows, the scores and P
// fit 160 a thread there; at D 128 the output rows alone are 64 more).
//
// The consumers keep wgmma_forward.cuh's intra-warpgroup pipeline: iteration n issues
// S(n+1) = Q K(n+1)^T, then O += P(n) V(n), and runs the softmax of tile n+1 while P(n) V(n) is
// still on the tensor cores. A K stage is released as soon as S(n+1) completes, a V stage when
// P(n) V(n) does. Across the consumers, FlashAttention-3's ping-pong: they take turns issuing
// their products (a named barrier per warpgroup, opened by the one before it once it has issued), so
// one warpgroup's softmax runs on the CUDA cores and the special-function units while the
// other's products hold the tensor cores, instead of both meeting in the same phase. Three
// consumers take their turns round the circle, 0, 1, 2, 0, ...
#pragma once

#include "cuda/tma_api.cuh"
#include "cuda/wgmma_forward.cuh"

namespace stria {
namespace cuda {

// kConsumers: 2, or 3 at head dim 64 (the header's comment says why; tma_schedule.h chooses).
template <int D, int kConsumerGroups = 2>
struct TmaFwdTile {
  static_assert(kConsumerGroups == 2 || (kConsumerGroups == 3 && D == 64), "three consumers fit at D 64 only");
  static constexpr int kConsumers = kConsumerGroups, kThreads = 128 * (kConsumers + 1), kM = 64 * kConsumers;
  // Registers per thread after setmaxnreg: the producer's and each consumer's. A CTA starts with
  // 65536 / kThreads (168 or 128: tests/ptx/check_sm90_kernels.sh checks ptxas gave exactly that),
  // and the split must fit what the producer gives back.
  static constexpr int kProducerRegs = 24, kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumers <= 65536, "more registers than an SM has");
  static constexpr int kN = ForwardKeyTile<D>();  // 64 at D 256: shared memory (wgmma_forward.cuh)
  static constexpr int kStages = 2;
  static constexpr int kQBytes = kM * D * 2, kKvBytes = kN * D * 2;
  // The mbarriers: Q full, then per stage K full, K empty, V full, V empty.
  static constexpr int kBarriers = 1 + 4 * kStages;
  // Q, the K stages, the V stages, the barriers; + 1024: the kernel aligns the swizzled tiles.
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKvBytes + 8 * kBarriers + kSwizzleAtomBytes;
};

// FlashAttention-3's ping-pong among the consumer warpgroups: they take turns issuing their
// products, in the order 0, 1, .., kConsumers - 1, 0, ... Warpgroup g's turn is named barrier
// 1 + g: its own 128 threads sync on it (Take) and the 128 of the warpgroup before it arrive once
// their products are issued (Pass). Every warpgroup of a CTA takes as many turns (one per product
// group), and the last one opens warpgroup 0's first (Open), so the last Pass of a CTA opens a
// turn nobody takes: harmless at exit.
#if STRIA_HAS_WGMMA  // the named barriers: sm_90a (and the emulator) only
template <int kConsumers>
struct ConsumerTurns {
  static_assert(kConsumers == 2 || kConsumers == 3, "named barriers 1..3 are the turns");
  int group;
  STRIA_DEVICE void Open() const {
    if (group == kConsumers - 1) Pass();
  }
  STRIA_DEVICE void Take() const { On<true>(group); }
  STRIA_DEVICE void Pass() const { On<false>(group + 1 == kConsumers ? 0 : group + 1); }

 private:
  // Constant ids in every branch: with an id in a register ptxas reserves all 16 barriers.
  template <bool kSync>
  static STRIA_DEVICE void On(int g) {
    if (g == 0)
      Barrier<kSync>(1);
    else if (kConsumers == 2 || g == 1)
      Barrier<kSync>(2);
    else
      Barrier<kSync>(3);
  }
  template <bool kSync>
  static STRIA_DEVICE void Barrier(int id) {
    if constexpr (kSync)
      named_barrier_sync(id, 256);
    else
      named_barrier_arrive(id, 256);
  }
};
#endif

// The block's parameters and the TMA maps of its Q (the caller's view) and of its K and V (the
// compact ring block), each for boxes of 64 columns by kM (Q) or kN (K, V) rows.
struct TmaFwdParams {
  FwdParams p;
  TensorMap q_map, k_map, v_map;
};

template <typename T, int D, bool kDocs = false, int kConsumers = 2>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128 * (kConsumers + 1))
    WgmmaTmaForwardKernel(const STRIA_GRID_CONSTANT TmaFwdParams tp) {
#if STRIA_HAS_WGMMA
  using Tile = TmaFwdTile<D, kConsumers>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kStages = Tile::kStages, kConsumerThreads = 128 * Tile::kConsumers;
  const FwdParams& p = tp.p;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = qs + Tile::kQBytes;  // stage st at ks + st * kKvBytes
  unsigned char* vs = ks + kStages * Tile::kKvBytes;
  uint64_t* q_full = reinterpret_cast<uint64_t*>(vs + kStages * Tile::kKvBytes);
  uint64_t* k_full = q_full + 1;
  uint64_t* k_empty = k_full + kStages;
  uint64_t* v_full = k_empty + kStages;
  uint64_t* v_empty = v_full + kStages;

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), wg = tid >> 7;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bh = static_cast<int>(cta.head);
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is
  // (kDocs false compiles the clamp out: these kernels' registers are tight).
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, bh / d.Hq) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kM, cta.tile, gridDim.x);
  const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
  if (keys.count == 0) return IdleRows<T>(p, mask, bh, i0, kM, Tile::kThreads);  // the whole CTA, before any barrier
  const int64_t j_first = keys.first;
  const int n_tiles = keys.count;

  if (tid == 0) {
    mbar_init(q_full, 1);
    for (int st = 0; st < kStages; ++st) {
      mbar_init(&k_full[st], 1);
      mbar_init(&v_full[st], 1);
      mbar_init(&k_empty[st], kConsumerThreads);
      mbar_init(&v_empty[st], kConsumerThreads);
    }
    fence_barrier_init();
  }
  block_sync();  // the last block-wide barrier: from here the warpgroups go their own ways

  if (wg == 0) {
    // The producer. Stage st of tile n is st = n % kStages, in its (n / kStages)-th use; the
    // empty barriers' parity starts "complete", so the first use of each stage does not wait.
    setmaxnreg_dec<Tile::kProducerRegs>();
    if (tid != 0) return;
    prefetch_tensor_map(&tp.q_map);
    prefetch_tensor_map(&tp.k_map);
    prefetch_tensor_map(&tp.v_map);
    const int b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
    mbar_arrive_expect_tx(q_full, Tile::kQBytes);
    for (int cb = 0; cb < D / 64; ++cb)
      tma_load_4d(qs + cb * kM * kSwizzleBytes, &tp.q_map, 64 * cb, h, static_cast<int>(i0), b, q_full);
    for (int n = 0; n < n_tiles; ++n) {
      const int st = n % kStages, parity = (n / kStages) & 1;
      const int j = static_cast<int>(j_first + int64_t{kN} * n);
      mbar_wait(&k_empty[st], parity ^ 1);
      mbar_arrive_expect_tx(&k_full[st], Tile::kKvBytes);
      for (int cb = 0; cb < D / 64; ++cb)
        tma_load_4d(ks + st * Tile::kKvBytes + cb * kN * kSwizzleBytes, &tp.k_map, 64 * cb, hk, j, b, &k_full[st]);
      mbar_wait(&v_empty[st], parity ^ 1);
      mbar_arrive_expect_tx(&v_full[st], Tile::kKvBytes);
      for (int cb = 0; cb < D / 64; ++cb)
        tma_load_4d(vs + st * Tile::kKvBytes + cb * kN * kSwizzleBytes, &tp.v_map, 64 * cb, hk, j, b, &v_full[st]);
    }
    return;
  }

  // A consumer: warpgroup `group` owns rows gi0 .. gi0 + 63.
  setmaxnreg_inc<Tile::kConsumerRegs>();
  const int group = wg - 1, warp = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int64_t gi0 = i0 + 64 * group, gi1 = gi0 + 64;
  const uint32_t q_addr = smem_addr(qs), k_addr = smem_addr(ks), v_addr = smem_addr(vs);
  auto stage_of = [](int n) { return n % kStages; };
  auto parity_of = [](int n) { return (n / kStages) & 1; };

  // This thread's rows and their running state, as in wgmma_forward.cuh.
  int64_t row[2];
  bool live[2];
  float m_run[2], l_run[2];
  float o[D / 2];
  LoadWarpgroupRows<D>(p, bh, gi0, warp, g, t4, row, live, m_run, l_run, o);

  // The ping-pong: every warpgroup takes n_tiles + 1 turns.
  const ConsumerTurns<Tile::kConsumers> turns{group};
  turns.Open();

  float s[kN / 2];
  float alpha[2];
  uint32_t pa[kN / 16][4];  // P(n) as A fragments
  // The registers P V reads and writes, pinned before the fence that orders them before it and
  // after the wait that completes it (wgmma_fence_operand).
  auto pin_pv_operands = [&] {
    wgmma_fence_operand(o);
    wgmma_fence_operand(pa);
  };
  mbar_wait(q_full, 0);
  mbar_wait(&k_full[0], 0);
  turns.Take();
  wgmma_fence();
  IssueScores<T, D, kM, kN>(s, q_addr, k_addr, group);
  turns.Pass();
  wgmma_wait<0>();
  wgmma_fence_operand(s);
  mbar_arrive(&k_empty[0]);
  WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j_first, j_first + kN), row, j_first, t4,
                          m_run, l_run, alpha);
  RescaleAndPack<T, D, kN>(o, alpha, s, pa);

  // Straight-line iterations (no wgmma under a branch): the last tile's P V is peeled off.
  for (int n = 0; n + 1 < n_tiles; ++n) {
    const int kst = stage_of(n + 1), vst = stage_of(n);
    // Both waits before the fence: a wait between the two issues is a loop that ptxas answers
    // with a warpgroup.arrive of its own; and V(n) left before K(n+1), so it is rarely later.
    mbar_wait(&k_full[kst], parity_of(n + 1));
    mbar_wait(&v_full[vst], parity_of(n));
    turns.Take();
    pin_pv_operands();
    wgmma_fence();
    IssueScores<T, D, kM, kN>(s, q_addr, k_addr + kst * Tile::kKvBytes, group);
    IssuePV<T, D, kN>(o, pa, v_addr + vst * Tile::kKvBytes);
    turns.Pass();
    wgmma_wait<1>();  // S(n+1) done: its K stage is free; P(n) V(n) may still run
    wgmma_fence_operand(s);
    mbar_arrive(&k_empty[kst]);
    const int64_t j1 = j_first + int64_t{kN} * (n + 1);
    WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j1, j1 + kN), row, j1, t4, m_run, l_run,
                            alpha);
    wgmma_wait<0>();  // P(n) V(n) done: its V stage, o and pa are free
    pin_pv_operands();
    mbar_arrive(&v_empty[vst]);
    RescaleAndPack<T, D, kN>(o, alpha, s, pa);
  }
  const int vst = stage_of(n_tiles - 1);
  mbar_wait(&v_full[vst], parity_of(n_tiles - 1));
  turns.Take();
  pin_pv_operands();
  wgmma_fence();
  IssuePV<T, D, kN>(o, pa, v_addr + vst * Tile::kKvBytes);
  turns.Pass();
  wgmma_wait<0>();
  wgmma_fence_operand(o);

  StoreWarpgroupRows<T, D>(p, bh, t4, row, live, m_run, l_run, o);
#else
  (void)tp;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
