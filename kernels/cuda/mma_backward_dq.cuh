// The deterministic backward's dQ pass (mma.sync m16n8k16): one CTA of 4 warps owns 64 queries of
// one query head (16 rows per warp; at head dim 256, 32 queries, two warps per 16 rows) and walks
// the key tiles of the ring block they may see. Per key tile it recomputes, for its own rows only,
//   P = exp2(Q K^T * scale_log2 - lse2), dP = dO V^T, dS = P (dP - delta),
// and adds dS K into dQ, held in registers; at the end it adds its dQ to dq_acc with plain loads
// and stores. No other CTA writes these rows in this launch, and the ring orders the launches of
// successive blocks on one stream, so every element of dq_acc receives its terms in one fixed
// order: the bits do not depend on how the GPU schedules CTAs. (The default backward adds dQ from
// every key tile's CTA with float atomics, whose order, and so the rounding, the schedule decides.)
//
// The dK/dV pass is the kernel family's backward without its dQ part (MmaBackwardKernel,
// WgmmaBackwardKernel or WgmmaTmaBackwardKernel with kDq false). Together they compute S and dP
// twice: 7 tile products per (query tile, key tile) instead of 5.
#pragma once

#include "cuda/mma_common.cuh"

namespace stria {
namespace cuda {

template <int D>
struct BwdDqTile {
  // Warps per 16 query rows, each with D / kHalves columns of dQ. At D 256 two: both compute the
  // rows' S and dP (a reduction over every column), so that dS stays in the registers the dQ
  // product reads (as in the D 256 backward, mma_backward.cuh), and each holds 128 columns of dQ.
  static constexpr int kHalves = D > 128 ? 2 : 1;
  static constexpr int kWarps = 4, kThreads = 32 * kWarps, kRowGroups = kWarps / kHalves, kM = 16 * kRowGroups;
  // Keys per tile: Q, dO and two stages of K and V within 99 KB, sm_86's and sm_89's largest
  // opt-in shared memory a block (at D 128, 64 keys took 102 KB: the pass could not launch there).
  // D 128: 68 KB; D 256: 99 KB exactly.
  static constexpr int kN = D > 64 ? 32 : 64;
  static constexpr int kStride = SmemRow<D>::kStride;
  // Q and dO once; K and V twice (the next tile loads while this one is used).
  static constexpr int kSmemBytes = (2 * kM + 4 * kN) * kStride * 2;
  static_assert(kSmemBytes <= 99 * 1024, "over the opt-in shared memory of sm_86 and sm_89");
};

template <typename T, int D, bool kDocs = false>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128) MmaBackwardDqKernel(const BwdParams p) {
  using Tile = BwdDqTile<D>;
  constexpr int S = Tile::kStride, kM = Tile::kM, kN = Tile::kN, kThreads = Tile::kThreads;
  // This warp's columns of dQ: kCols from ch * kCols.
  constexpr int kCols = D / Tile::kHalves, kDTiles = kCols / 8, kKSteps = D / 16, kNTiles = kN / 8;
  STRIA_DYNAMIC_SMEM(smem_raw);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* dos = qs + kM * S;
  uint16_t* ks = dos + kM * S;  // two buffers of kN rows
  uint16_t* vs = ks + 2 * kN * S;

  const Dims& d = p.dims;
  const int warp = warp_id(), lane = lane_id(), g = lane >> 2, t4 = lane & 3;
  // This warp's 16 rows (rg * 16..) and column half; constants where there is one half, so that the
  // D 64 and 128 kernels compile as they did before the halves.
  const int rg = Tile::kHalves == 1 ? warp : warp % Tile::kRowGroups;
  const int ch = Tile::kHalves == 1 ? 0 : warp / Tile::kRowGroups;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bh = static_cast<int>(cta.head), b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kM, cta.tile, gridDim.x);
  const TileRun keys = KeyTilesOf<kDocs>(mask, i0, MinI(i0 + kM, d.L), kN);
  if (keys.count == 0) return;  // the whole CTA, before any barrier
  // This warp's 16 rows and the keys they may see (a warp-uniform skip, as in the forward).
  const int w0 = rg * 16;
  const int64_t wi0 = i0 + w0, wi1 = wi0 + 16;
  int64_t wk_lo, wk_hi;
  KeyRange<kDocs>(mask, wi0, MinI(wi1, d.L), &wk_lo, &wk_hi);

  const uint16_t* qg = static_cast<const uint16_t*>(p.q.data) + b * p.q.sb + h * p.q.sh;
  const uint16_t* dog = static_cast<const uint16_t*>(p.dout.data) + b * p.dout.sb + h * p.dout.sh;
  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  const uint16_t* kg = static_cast<const uint16_t*>(p.k) + kv_off;
  const uint16_t* vg = static_cast<const uint16_t*>(p.v) + kv_off;
  LoadRows<D, kThreads>(qs, qg, p.q.sl, i0, kM, d.L);
  LoadRows<D, kThreads>(dos, dog, p.dout.sl, i0, kM, d.L);
  LoadRows<D, kThreads>(ks, kg, kv_row, keys.first, kN, d.L);
  LoadRows<D, kThreads>(vs, vg, kv_row, keys.first, kN, d.L);
  cp_async_commit();

  // This lane's two rows (g and g + 8 of the warp's 16), their lse2 and delta.
  int64_t row[2];
  float lse2[2], delta[2];
  for (int e = 0; e < 2; ++e) {
    row[e] = wi0 + g + 8 * e;
    DqRowScalars(p, bh, row[e], &lse2[e], &delta[e]);
  }
  float dq[kDTiles][4];
  STRIA_UNROLL
  for (int nt = 0; nt < kDTiles; ++nt) dq[nt][0] = dq[nt][1] = dq[nt][2] = dq[nt][3] = 0.f;

  for (int n = 0; n < keys.count; ++n) {
    const int64_t j0 = keys.first + static_cast<int64_t>(n) * kN;
    const uint16_t* kt = ks + (n & 1) * kN * S;
    const uint16_t* vt = vs + (n & 1) * kN * S;
    if (n + 1 < keys.count) {
      LoadRows<D, kThreads>(ks + ((n + 1) & 1) * kN * S, kg, kv_row, j0 + kN, kN, d.L);
      LoadRows<D, kThreads>(vs + ((n + 1) & 1) * kN * S, vg, kv_row, j0 + kN, kN, d.L);
      cp_async_commit();
      cp_async_wait<1>();  // tile n (and Q, dO) landed; tile n + 1 may still be in flight
    } else {
      cp_async_wait<0>();
    }
    block_sync();

    if (j0 < wk_hi && j0 + kN > wk_lo) {
      // S = Q K^T and dP = dO V^T for this warp's 16 rows x kN keys.
      float s[kNTiles][4], dp[kNTiles][4];
      STRIA_UNROLL
      for (int nt = 0; nt < kNTiles; ++nt)
        for (int c = 0; c < 4; ++c) s[nt][c] = dp[nt][c] = 0.f;
      STRIA_UNROLL
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t qa[4], da[4];
        LoadA<S>(qa, qs, w0, kk * 16);
        LoadA<S>(da, dos, w0, kk * 16);
        STRIA_UNROLL
        for (int np = 0; np < kNTiles / 2; ++np) {
          uint32_t kb[4], vb[4];
          LoadBFromRowsN<S>(kb, kt, np * 16, kk * 16);
          LoadBFromRowsN<S>(vb, vt, np * 16, kk * 16);
          mma_16816<T>(s[2 * np], qa, kb);
          mma_16816<T>(s[2 * np + 1], qa, kb + 2);
          mma_16816<T>(dp[2 * np], da, vb);
          mma_16816<T>(dp[2 * np + 1], da, vb + 2);
        }
      }

      // dS = P (dP - delta), 0 where the mask hides the pair (every pair of a fully visible tile
      // is a row and a key of the block).
      Window seen[2] = {Window{0, kN}, Window{0, kN}};
      if (!FullyVisible<kDocs>(mask, wi0, wi1, j0, j0 + kN)) {
        for (int e = 0; e < 2; ++e) seen[e] = VisibleKeys<kDocs>(mask, row[e], j0, kN);
      }
      WithSoftcap(p.softcap, [&](auto cap) {  // the test once per tile (softcap.cuh)
        constexpr bool kCapped = decltype(cap)::kCapped;
        STRIA_UNROLL
        for (int nt = 0; nt < kNTiles; ++nt) {
          STRIA_UNROLL
          for (int c = 0; c < 4; ++c) {
            const int e = c >> 1;
            const bool vis = In(seen[e], nt * 8 + 2 * t4 + (c & 1));
            float slope;
            const float pr =
                vis ? fast_exp2(Log2ScoreOf<kCapped>(s[nt][c], p.scale_log2, p.softcap, &slope) - lse2[e]) : 0.f;
            dp[nt][c] = vis ? pr * (dp[nt][c] - delta[e]) * slope : 0.f;
          }
        }
      });

      // dQ += dS K: dS as the A fragments (rows, keys), K rows as B (keys, head dim).
      STRIA_UNROLL
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t sa[4];
        AccToA<T>(sa, dp[2 * kk], dp[2 * kk + 1]);
        STRIA_UNROLL
        for (int dt = 0; dt < kDTiles / 2; ++dt) {
          uint32_t kb[4];
          LoadBFromRowsK<S>(kb, kt, kk * 16, ch * kCols + dt * 16);
          mma_16816<T>(dq[2 * dt], sa, kb);
          mma_16816<T>(dq[2 * dt + 1], sa, kb + 2);
        }
      }
    }
    block_sync();  // every warp is done with tile n's buffers before tile n + 2 loads into them
  }

  // This CTA is the only writer of its rows in this launch.
  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) AddDqRow<D, kCols>(p, mask, bh, row[e], e, t4, &dq[0][0], ch * kCols);
}

}  // namespace cuda
}  // namespace stria
