// The deterministic backward's dQ pass on the Hopper tensor cores (wgmma.mma_async, sm_90a): the
// contract of mma_backward_dq.cuh (a CTA owns whole query rows and adds their dQ into dq_acc with
// plain loads and stores, the only writer of those rows in its launch, so every element of dq_acc
// receives its terms in one fixed order), with warpgroup MMAs in place of mma.sync, which the
// wgmma and TMA families' deterministic backward took before at about half their tensor rate.
//
// Two warpgroups own 64 query rows each of a 128-row tile (at head dim 256 one warpgroup and a
// 64-row tile: Q, dO and two stages of K and V of 128 rows would be 256 KB of shared memory, past
// the 227 KB a CTA may have); per key tile of kN keys each computes
//   S = Q K^T and dP = dO V^T   both operands from shared memory (the forward's IssueScores),
//   dS = P (dP - delta)         in registers, P = exp2(S * scale_log2 - lse2), the mask applied,
//   dQ += dS K                  dS as the A fragments where the accumulators left it, K read in the
//                               transposed-B form as the forward reads V (IssuePV),
// with dQ (64 x D per warpgroup) in registers for the whole walk. Q and dO load once; K and V are
// double-buffered, the next tile's cp.async running under this tile's products.
#pragma once

#include "cuda/mma_common.cuh"
#include "cuda/wgmma_api.cuh"
#include "cuda/wgmma_forward.cuh"

namespace stria {
namespace cuda {

template <int D>
struct WgmmaBwdDqTile {
  static constexpr int kGroups = D > 128 ? 1 : 2, kThreads = 128 * kGroups, kM = 64 * kGroups, kN = 64;
  static constexpr int kQBytes = kM * D * 2, kKvBytes = kN * D * 2;
  // Q and dO once, K and V twice; the alignment slack.
  static constexpr int kSmemBytes = 2 * kQBytes + 4 * kKvBytes + kSwizzleAtomBytes;
};

template <typename T, int D, bool kDocs = false>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(256) WgmmaBackwardDqKernel(const BwdParams p) {
#if STRIA_HAS_WGMMA
  using Tile = WgmmaBwdDqTile<D>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kThreads = Tile::kThreads;
  STRIA_DYNAMIC_SMEM(smem_raw);
  unsigned char* qs = AlignToSwizzleAtom(smem_raw);
  unsigned char* dos = qs + Tile::kQBytes;
  unsigned char* ks = dos + Tile::kQBytes;  // buffer n & 1 at ks + (n & 1) * kKvBytes
  unsigned char* vs = ks + 2 * Tile::kKvBytes;
  const uint32_t q_addr = smem_addr(qs), do_addr = smem_addr(dos), k_addr = smem_addr(ks), v_addr = smem_addr(vs);

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), group = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bh = static_cast<int>(cta.head), b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kM, cta.tile, gridDim.x);
  const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
  // No key for these rows in this block: no dQ here (the whole CTA, before any barrier).
  if (keys.count == 0) return;
  const int64_t gi0 = i0 + 64 * group, gi1 = gi0 + 64;  // this warpgroup's rows

  const uint16_t* qg = static_cast<const uint16_t*>(p.q.data) + b * p.q.sb + h * p.q.sh;
  const uint16_t* dog = static_cast<const uint16_t*>(p.dout.data) + b * p.dout.sb + h * p.dout.sh;
  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  const uint16_t* kg = static_cast<const uint16_t*>(p.k) + kv_off;
  const uint16_t* vg = static_cast<const uint16_t*>(p.v) + kv_off;
  auto load_kv = [&](int n) {
    const int64_t j0 = keys.first + static_cast<int64_t>(n) * kN;
    LoadSwizzled<D, kThreads>(ks + (n & 1) * Tile::kKvBytes, kg, kv_row, j0, kN, d.L);
    LoadSwizzled<D, kThreads>(vs + (n & 1) * Tile::kKvBytes, vg, kv_row, j0, kN, d.L);
  };
  LoadSwizzled<D, kThreads>(qs, qg, p.q.sl, i0, kM, d.L);
  LoadSwizzled<D, kThreads>(dos, dog, p.dout.sl, i0, kM, d.L);
  load_kv(0);
  cp_async_commit();

  // This thread's two rows (accumulator rows g and g + 8 of its warp's 16), their lse2 and delta.
  int64_t row[2];
  float lse2[2], delta[2];
  for (int e = 0; e < 2; ++e) {
    row[e] = gi0 + 16 * warp + g + 8 * e;
    DqRowScalars(p, bh, row[e], &lse2[e], &delta[e]);
  }
  float dq[D / 2];
  STRIA_UNROLL
  for (int i = 0; i < D / 2; ++i) dq[i] = 0.f;

  for (int n = 0; n < keys.count; ++n) {
    // Tile n landed and is visible to wgmma; every warpgroup is done with tile n - 1, whose
    // buffers tile n + 1 takes.
    cp_async_wait<0>();
    fence_proxy_async();
    block_sync();
    if (n + 1 < keys.count) {
      load_kv(n + 1);
      cp_async_commit();
    }
    const int64_t j0 = keys.first + static_cast<int64_t>(n) * kN;
    const uint32_t kt = k_addr + (n & 1) * Tile::kKvBytes, vt = v_addr + (n & 1) * Tile::kKvBytes;

    float s[kN / 2], dp[kN / 2];
    wgmma_fence();
    IssueScores<T, D, kM, kN>(s, q_addr, kt, group);
    IssueScores<T, D, kM, kN>(dp, do_addr, vt, group);
    wgmma_wait<0>();
    wgmma_fence_operand(s);
    wgmma_fence_operand(dp);

    // dS in the accumulator layout (element i: row (i & 3) >> 1 of this thread's two, key
    // 8 (i >> 2) + 2 t4 + (i & 1) of the tile), 0 where the mask hides the pair; the element mask
    // only in tiles that need it, each row's visible keys as one window.
    Window seen[2] = {Window{0, kN}, Window{0, kN}};
    if (!FullyVisible<kDocs>(mask, gi0, gi1, j0, j0 + kN))
      for (int e = 0; e < 2; ++e) seen[e] = VisibleKeys<kDocs>(mask, row[e], j0, kN);
    WithSoftcap(p.softcap, [&](auto cap) {  // the test once per tile (softcap.cuh)
      constexpr bool kCapped = decltype(cap)::kCapped;
      STRIA_UNROLL
      for (int i = 0; i < kN / 2; ++i) {
        const int e = (i & 3) >> 1;
        const bool vis = In(seen[e], 8 * (i >> 2) + 2 * t4 + (i & 1));
        float slope;
        const float pr = vis ? fast_exp2(Log2ScoreOf<kCapped>(s[i], p.scale_log2, p.softcap, &slope) - lse2[e]) : 0.f;
        dp[i] = vis ? pr * (dp[i] - delta[e]) * slope : 0.f;
      }
    });
    uint32_t sa[kN / 16][4];
    STRIA_UNROLL
    for (int kk = 0; kk < kN / 16; ++kk) AccToA<T>(sa[kk], dp + 8 * kk, dp + 8 * kk + 4);

    // dQ += dS K.
    wgmma_fence_operand(dq);
    wgmma_fence_operand(sa);
    wgmma_fence();
    IssuePV<T, D, kN>(dq, sa, kt);
    wgmma_wait<0>();
    wgmma_fence_operand(dq);
    wgmma_fence_operand(sa);
  }

  // This CTA is the only writer of its rows in this launch.
  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) AddDqRow<D>(p, mask, bh, row[e], e, t4, dq);
#else
  (void)p;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
