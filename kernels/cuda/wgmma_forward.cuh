// Hopper forward tile kernel (wgmma.mma_async, sm_90a): the same contract as mma_forward.cuh
// (one ring block's keys merged into the fp32 running state m, l, acc of 128 queries of one head),
// with warpgroup MMAs in place of mma.sync:
//  - S = Q K^T reads both operands straight from shared memory (descriptors), so no ldmatrix and
//    no register traffic for Q or K;
//  - O += P V takes P from the registers the softmax left it in (the accumulator layout of S is
//    the A-fragment layout, pairwise) and V from shared memory in the transposed-B form, so V
//    needs no transpose either.
// Two warpgroups (256 threads) own 64 query rows each and share the K and V tiles. Q, K and V sit
// in shared memory in the 128-byte swizzle (wgmma_api.cuh), loaded by every thread with cp.async.
//
// Software pipeline (FlashAttention-3's intra-warpgroup overlap): iteration n issues
// S(n+1) = Q K(n+1)^T and then O += P(n) V(n), waits for the first only, and runs the softmax of
// tile n+1 on the CUDA cores while the tensor cores still work on P(n) V(n). K and V are
// double-buffered and load one whole iteration ahead of their use (K(n+2) and V(n+1) during
// iteration n). Every warpgroup runs every tile of the CTA's key range: the masked part of a
// diagonal tile costs less than the branches around wgmma would (ptxas serialises the MMAs when
// accumulators flow through control flow), and with 128-row and 128-key tiles aligned a
// warpgroup almost never has a whole tile masked.
//
// Before wgmma reads shared memory that cp.async wrote, the writing threads fence the async proxy
// (fence_proxy_async) and the block synchronises.
#pragma once

#include "cuda/mma_common.cuh"
#include "cuda/wgmma_api.cuh"

namespace stria {
namespace cuda {

// Key tiles of 128, or 64 at head dim 256: there Q (64 KB) and two K and two V buffers of 128 keys
// would need 320 KB of shared memory, the SM has 227.
template <int D>
constexpr int ForwardKeyTile() {
  return D > 128 ? 64 : 128;
}

template <int D>
struct WgmmaFwdTile {
  static constexpr int kGroups = 2, kThreads = 128 * kGroups, kM = 64 * kGroups, kN = ForwardKeyTile<D>();
  static constexpr int kQBytes = kM * D * 2, kKvBytes = kN * D * 2;
  // Q, two K and two V buffers; + 1024: the dynamic shared memory's start need not be 1024-byte
  // aligned, the kernel aligns.
  static constexpr int kSmemBytes = kQBytes + 4 * kKvBytes + kSwizzleAtomBytes;
};

// The online softmax of one warpgroup's 64 x kN score tile, in the accumulator layout (element
// i: row (i & 3) >> 1 of this thread's two, column 8 (i >> 2) + 2 t4 + (i & 1)): scales and masks
// the scores, updates the running max and sum, turns `s` into the probabilities, and returns the
// factors that rescale the old output rows. `mask`: the CTA's batch row's (BatchMask).
template <int kN, bool kDocs>
STRIA_DEVICE void WgmmaSoftmax(const FwdParams& p, const MaskArgs& mask, float (&s)[kN / 2], bool masked,
                               const int64_t row[2], int64_t j0, int t4, float m_run[2], float l_run[2],
                               float alpha[2]) {
  // Two straight-line loops rather than one with a test per element: the unmasked tiles (nearly
  // all of them) then pay nothing for the mask. Likewise the softcap (softcap.cuh).
  // Uncapped, the scores stay raw through the row max (RawOrCapped), and the scale joins the
  // exponential's subtraction in one multiply-add.
  WithSoftcap(p.softcap, [&](auto cap) {
    constexpr bool kCapped = decltype(cap)::kCapped;
    if (masked) {
      const Window w[2] = {VisibleKeys<kDocs>(mask, row[0], j0, kN), VisibleKeys<kDocs>(mask, row[1], j0, kN)};
      STRIA_UNROLL
      for (int i = 0; i < kN / 2; ++i)
        s[i] = In(w[(i & 3) >> 1], 8 * (i >> 2) + 2 * t4 + (i & 1)) ? RawOrCapped<kCapped>(s[i], p.softcap) : NegInf();
    } else if constexpr (kCapped) {
      STRIA_UNROLL
      for (int i = 0; i < kN / 2; ++i) s[i] = RawOrCapped<true>(s[i], p.softcap);
    }
    const float in_log2 = kCapped ? 1.f : p.scale_log2;  // the factor into the log2 domain
    float mx[2] = {NegInf(), NegInf()};
    STRIA_UNROLL
    for (int i = 0; i < kN / 2; ++i) mx[(i & 3) >> 1] = fmaxf(mx[(i & 3) >> 1], s[i]);
    float base[2];
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) alpha[e] = OnlineMaxStep(mx[e] * in_log2, &m_run[e], &base[e]);
    float sum[2] = {0.f, 0.f};
    STRIA_UNROLL
    for (int i = 0; i < kN / 2; ++i) {
      const int e = (i & 3) >> 1;
      s[i] = fast_exp2(fmaf(s[i], in_log2, -base[e]));
      sum[e] += s[i];
    }
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) l_run[e] = l_run[e] * alpha[e] + sum[e];
  });
}

// This thread's rows gi0 + 16 warp + g and + 8 of a warpgroup's 64 and their running state, in
// the accumulator layout (element 4 i + c: row (c >> 1) * 8, column 8 i + 2 t4 + (c & 1)).
template <int D>
STRIA_DEVICE void LoadWarpgroupRows(const FwdParams& p, int bh, int64_t gi0, int warp, int g, int t4, int64_t row[2],
                                    bool live[2], float m_run[2], float l_run[2], float (&o)[D / 2]) {
  for (int e = 0; e < 2; ++e) {
    row[e] = gi0 + 16 * warp + g + 8 * e;
    live[e] = row[e] >= p.mask.q_begin && row[e] < p.mask.q_end;
    LoadRowState<D>(p, static_cast<int64_t>(bh) * p.dims.L + row[e], t4, live[e], &m_run[e], &l_run[e], &o[2 * e]);
  }
}
template <typename T, int D>
STRIA_DEVICE void StoreWarpgroupRows(const FwdParams& p, int bh, int t4, const int64_t row[2], const bool live[2],
                                     const float m_run[2], const float l_run[2], const float (&o)[D / 2]) {
  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) StoreRowState<T, D>(p, bh, row[e], t4, live[e], m_run[e], l_run[e], &o[2 * e]);
}

#if STRIA_HAS_WGMMA  // the helpers below issue wgmma: sm_90a (and the emulator) only
// S = Q K^T for one warpgroup into s (issued and committed, not waited for): Q's kM-row tile at
// `q_addr` (this warpgroup's 64 rows from row 64 `group`) and a kN-row K tile at `k_addr`, both
// in the 128-byte swizzle.
template <typename T, int D, int kM, int kN>
STRIA_DEVICE void IssueScores(float (&s)[kN / 2], uint32_t q_addr, uint32_t k_addr, int group) {
  // Built here from opaque addresses, each call: hoisted out of the caller's loop they would hold
  // four registers across it (Opaque).
  const uint64_t qa = SwizzledDesc(Opaque(q_addr) + 64 * group * kSwizzleBytes, 16, kSwizzleAtomBytes);
  const uint64_t kb = SwizzledDesc(Opaque(k_addr), 16, kSwizzleAtomBytes);
  STRIA_UNROLL
  for (int kk = 0; kk < D / 16; ++kk) {
    // Column block kk / 4 (64 values: kM or kN rows x 128 bytes), then 32 bytes per 16 columns.
    const uint32_t kcol = static_cast<uint32_t>((kk & 3) * 32);
    wgmma_ss<T, kN>(s, DescPlus(qa, (kk >> 2) * kM * kSwizzleBytes + kcol),
                    DescPlus(kb, (kk >> 2) * kN * kSwizzleBytes + kcol), kk > 0);
  }
  wgmma_commit();
}

// O += P V (issued and committed, not waited for): P as A fragments (keys 16 kk.. in pa[kk]), the
// kN-row V tile at `v_addr` in the 128-byte swizzle, read in the transposed-B form. Past 128
// columns (D 256) the product is one wgmma per 128 columns: the accumulator layout of N 256 is
// that of two N 128 halves one after the other (element i: column 8 (i >> 2) + ...), so o's
// halves are the two products' accumulators as they are.
template <typename T, int D, int kN>
STRIA_DEVICE void IssuePV(float (&o)[D / 2], const uint32_t (&pa)[kN / 16][4], uint32_t v_addr) {
  constexpr int kCols = D < 128 ? D : 128, kChunks = D / kCols;
  const uint64_t v_desc = SwizzledDesc(Opaque(v_addr), kN * kSwizzleBytes, kSwizzleAtomBytes);
  STRIA_UNROLL
  for (int kk = 0; kk < kN / 16; ++kk) {
    STRIA_UNROLL
    for (int c = 0; c < kChunks; ++c) {
      // Keys 16 kk.. are rows 16 kk.. of V: 2048 bytes per 16 rows; LBO: the next 64 columns;
      // columns kCols c.. start kCols / 64 column blocks in.
      const uint64_t db = DescPlus(v_desc, (c * kCols / 64) * kN * kSwizzleBytes + kk * 16 * kSwizzleBytes);
      wgmma_rs_tb<T, kCols>(*reinterpret_cast<float(*)[kCols / 2]>(o + c * kCols / 2), pa[kk], db, true);
    }
  }
  wgmma_commit();
}

// After a tile's softmax: the old output rows scaled by alpha, and P (in s) as A fragments.
template <typename T, int D, int kN>
STRIA_DEVICE void RescaleAndPack(float (&o)[D / 2], const float alpha[2], const float (&s)[kN / 2],
                                 uint32_t (&pa)[kN / 16][4]) {
  STRIA_UNROLL
  for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i & 3) >> 1];
  STRIA_UNROLL
  for (int kk = 0; kk < kN / 16; ++kk) AccToA<T>(pa[kk], s + 8 * kk, s + 8 * kk + 4);
}
#endif

template <typename T, int D, bool kDocs = false>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(256) WgmmaForwardKernel(const FwdParams p) {
#if STRIA_HAS_WGMMA
  using Tile = WgmmaFwdTile<D>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kThreads = Tile::kThreads;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = AlignToSwizzleAtom(smem_raw);
  unsigned char* ks = qs + Tile::kQBytes;  // buffer b at ks + b * kKvBytes
  unsigned char* vs = ks + 2 * Tile::kKvBytes;
  const uint32_t q_addr = smem_addr(qs), k_addr = smem_addr(ks), v_addr = smem_addr(vs);

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), group = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bh = static_cast<int>(cta.head);
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is
  // (kDocs false compiles the clamp out: these kernels' registers are tight).
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, bh / d.Hq) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kM, cta.tile, gridDim.x);
  const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
  if (keys.count == 0) return IdleRows<T>(p, mask, bh, i0, kM, kThreads);  // the whole CTA, before any barrier
  const int64_t j_first = keys.first;
  const int n_tiles = keys.count;
  const int64_t gi0 = i0 + 64 * group, gi1 = gi0 + 64;  // this warpgroup's rows

  const HeadRows hr = ForwardHeadRows(p, bh);
  auto load_kv = [&](unsigned char* base, const uint16_t* src, int n) {
    LoadSwizzled<D, kThreads>(base + (n & 1) * Tile::kKvBytes, src, hr.kv_row, j_first + int64_t{kN} * n, kN, d.L);
  };
  // S(n) = Q K(n)^T into s (not waited for).
  auto issue_scores = [&](float(&s)[kN / 2], int n) {
    IssueScores<T, D, kM, kN>(s, q_addr, k_addr + (n & 1) * Tile::kKvBytes, group);
  };

  // This thread's rows and its share of their running state.
  int64_t row[2];
  bool live[2];
  float m_run[2], l_run[2];
  float o[D / 2];
  LoadWarpgroupRows<D>(p, bh, gi0, warp, g, t4, row, live, m_run, l_run, o);

  // Prologue: Q and K(0); then V(0) and K(1) behind S(0) and its softmax.
  LoadSwizzled<D, kThreads>(qs, hr.q, p.q.sl, i0, kM, d.L);
  load_kv(ks, hr.k, 0);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  block_sync();
  load_kv(vs, hr.v, 0);
  if (n_tiles > 1) load_kv(ks, hr.k, 1);
  cp_async_commit();
  float s[kN / 2];
  float alpha[2];
  wgmma_fence();
  issue_scores(s, 0);
  wgmma_wait<0>();
  wgmma_fence_operand(s);
  WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j_first, j_first + kN), row, j_first, t4,
                          m_run, l_run, alpha);
  uint32_t pa[kN / 16][4];  // P(n) as A fragments: keys 16 kk.. are accumulator chunks 2 kk, 2 kk + 1
  RescaleAndPack<T, D, kN>(o, alpha, s, pa);

  // O += P(n) V(n) (not waited for).
  auto issue_pv = [&](int n) { IssuePV<T, D, kN>(o, pa, v_addr + (n & 1) * Tile::kKvBytes); };
  // The registers P V reads and writes, pinned before the fence that orders them before it and
  // after the wait that completes it (wgmma_fence_operand).
  auto pin_pv_operands = [&] {
    wgmma_fence_operand(o);
    wgmma_fence_operand(pa);
  };
  // V(n) and K(n+1) landed and visible to wgmma; every warpgroup is done with S(n), so K(n)'s
  // buffer is free, and with P(n-1) V(n-1), so V(n-1)'s is.
  auto tiles_ready = [] {
    cp_async_wait<0>();
    fence_proxy_async();
    block_sync();
  };

  // Straight-line iterations (no wgmma under a branch): the last tile's P V is peeled off.
  for (int n = 0; n + 1 < n_tiles; ++n) {
    tiles_ready();
    if (n + 2 < n_tiles) load_kv(ks, hr.k, n + 2);
    load_kv(vs, hr.v, n + 1);
    cp_async_commit();
    pin_pv_operands();
    wgmma_fence();
    issue_scores(s, n + 1);
    issue_pv(n);
    wgmma_wait<1>();  // S(n+1) done; P(n) V(n) may still run
    wgmma_fence_operand(s);
    const int64_t j1 = j_first + int64_t{kN} * (n + 1);
    WgmmaSoftmax<kN, kDocs>(p, mask, s, !FullyVisible<kDocs>(mask, gi0, gi1, j1, j1 + kN), row, j1, t4, m_run, l_run,
                            alpha);
    wgmma_wait<0>();  // P(n) V(n) done: o and pa are free
    pin_pv_operands();
    RescaleAndPack<T, D, kN>(o, alpha, s, pa);
  }
  tiles_ready();
  pin_pv_operands();
  wgmma_fence();
  issue_pv(n_tiles - 1);
  wgmma_wait<0>();
  wgmma_fence_operand(o);

  StoreWarpgroupRows<T, D>(p, bh, t4, row, live, m_run, l_run, o);
#else
  (void)p;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
