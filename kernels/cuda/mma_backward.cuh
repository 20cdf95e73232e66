// Tensor-core backward tile kernel: one CTA of 4 warps owns 64 keys of one K/V head (16 keys per
// warp) of a ring block and walks every query tile (of every query head sharing that K/V head)
// that can see them. At head dim 256 a warp cannot hold dK and dV of its 16 keys over every column
// (256 accumulators a thread): the CTA has 8 warps, two per 16 keys, each with dK and dV over half
// the columns; both compute the keys' S^T and dP^T (the products' reduction runs over every
// column), which keeps P^T and dS^T in the registers that dV and dK read, at the cost of computing
// those two products twice. Its 16-query steps keep shared memory at 86 KB, under the 99 KB of
// Ampere's and Ada's smaller SMs. Per query tile it recomputes P^T = exp2(K Q^T * scale_log2 - lse2) from the
// forward's LSE, and with dP^T = V dO^T and dS^T = P^T (dP^T - delta):
//   dV += P^T dO and dK += dS^T Q  in registers (this CTA alone owns these keys), and
//   dQ += dS K                     through shared memory and float atomics into dq_acc.
// dK/dV (dK times the softmax scale) leave as fp32 into the block's dK/dV ring message, or in a
// world of one as the call's dK and dV, every row of the CTA's keys, zeros included (key_grads.cuh).
// With kDq false the kernel leaves dQ out (the deterministic backward: mma_backward_dq.cuh).
#pragma once

#include "cuda/mma_common.cuh"

namespace stria {
namespace cuda {

template <int D>
struct BwdTile {
  static constexpr int kHalves = D > 128 ? 2 : 1;  // warps per 16 keys, each with D / kHalves columns
  static constexpr int kN = 64, kWarps = 4 * kHalves, kThreads = 32 * kWarps;
  // Queries per step: keeps dK/dV/S/dP in registers (and, at D 256, shared memory under 99 KB).
  static constexpr int kM = D <= 64 ? 64 : D <= 128 ? 32 : 16;
  static constexpr int kStride = SmemRow<D>::kStride;
  static constexpr int kDsStride = kM + 8;
  static constexpr int kSmemBytes = (2 * kN + 2 * kM) * kStride * 2 + kN * kDsStride * 2 + 2 * kM * 4;
};

template <typename T, int D, bool kDocs = false, bool kDq = true>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(BwdTile<D>::kThreads) MmaBackwardKernel(const BwdParams p) {
  using Tile = BwdTile<D>;
  constexpr int S = Tile::kStride, kM = Tile::kM, kN = Tile::kN, kDs = Tile::kDsStride, kThreads = Tile::kThreads;
  constexpr int kKSteps = D / 16, kQTiles = kM / 8;
  // This warp's columns of dK and dV: kCols from ch * kCols (ch: which half, at D 256).
  constexpr int kCols = D / Tile::kHalves, kDTiles = kCols / 8;
  // dQ = dS K: the CTA's kM x D output split among the warps by 16-row groups and column slices.
  constexpr int kRowGroups = kM / 16, kColSplit = Tile::kWarps / kRowGroups, kQCols = D / kColSplit;
  STRIA_DYNAMIC_SMEM(smem_raw);
  uint16_t* ks = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* vs = ks + kN * S;
  uint16_t* qs = vs + kN * S;
  uint16_t* dos = qs + kM * S;
  uint16_t* dss = dos + kM * S;
  float* lse2s = reinterpret_cast<float*>(dss + kN * kDs);
  float* deltas = lse2s + kM;

  const Dims& d = p.dims;
  const int warp = warp_id(), lane = lane_id(), g = lane >> 2, t4 = lane & 3;
  // This warp's 16 keys (kw * 16..) and column half; constants where there is one half, so that
  // the D 64 and 128 kernels compile as they did before the halves.
  const int kw = Tile::kHalves == 1 ? warp : warp % 4, ch = Tile::kHalves == 1 ? 0 : warp / 4;
  const CtaSlot cta = CtaSlotOf(p.head_group);
  const int bhk = static_cast<int>(cta.head), b = bhk / d.Hkv, hk = bhk % d.Hkv;
  const int group = d.Hq / d.Hkv;
  const int64_t j0 = p.key_begin + static_cast<int64_t>(cta.tile) * kN;
  // With documents, this batch row's bounds (a copy); without, the launch's own mask as it is
  // (kDocs false compiles the clamp out: these kernels' registers are tight).
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const TileRun queries = QueryTilesOf<kDocs>(mask, j0, MinI(j0 + kN, d.L), kM);
  if (queries.count == 0) return ZeroKeyGrads<T>(p, b, hk, j0, kN, kThreads);  // before any barrier

  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  LoadRows<D, kThreads>(ks, static_cast<const uint16_t*>(p.k) + kv_off, kv_row, j0, kN, d.L);
  LoadRows<D, kThreads>(vs, static_cast<const uint16_t*>(p.v) + kv_off, kv_row, j0, kN, d.L);
  cp_async_commit();

  float dk[kDTiles][4], dv[kDTiles][4];
  STRIA_UNROLL
  for (int nt = 0; nt < kDTiles; ++nt)
    for (int c = 0; c < 4; ++c) dk[nt][c] = dv[nt][c] = 0.f;
  int64_t key[2];
  for (int e = 0; e < 2; ++e) key[e] = j0 + kw * 16 + g + e * 8;

  const int rg = warp % kRowGroups, cs = warp / kRowGroups;
  for (int gi = 0; gi < group; ++gi) {
    const int h = hk * group + gi;
    const int64_t bh = static_cast<int64_t>(b) * d.Hq + h;
    const uint16_t* qg = static_cast<const uint16_t*>(p.q.data) + b * p.q.sb + h * p.q.sh;
    const uint16_t* dog = static_cast<const uint16_t*>(p.dout.data) + b * p.dout.sb + h * p.dout.sh;
    for (int qt = 0; qt < queries.count; ++qt) {
      const int64_t i0 = queries.first + static_cast<int64_t>(qt) * kM;
      block_sync();  // the previous step's readers of qs/dos/dss/lse2s are done
      LoadRows<D, kThreads>(qs, qg, p.q.sl, i0, kM, d.L);
      LoadRows<D, kThreads>(dos, dog, p.dout.sl, i0, kM, d.L);
      cp_async_commit();
      for (int r = static_cast<int>(threadIdx.x); r < kM; r += kThreads) {
        const bool in = i0 + r < d.L;
        // +inf makes exp2(s - lse2) = 0 for rows past the end.
        lse2s[r] = in ? p.lse2[bh * d.L + i0 + r] : PosInf();
        deltas[r] = in ? p.delta[bh * d.L + i0 + r] : 0.f;
      }
      cp_async_wait<0>();
      block_sync();

      // S^T = K Q^T and dP^T = V dO^T for this warp's 16 keys x kM queries.
      float st[kQTiles][4], dpt[kQTiles][4];
      STRIA_UNROLL
      for (int nt = 0; nt < kQTiles; ++nt)
        for (int c = 0; c < 4; ++c) st[nt][c] = dpt[nt][c] = 0.f;
      STRIA_UNROLL
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t ka[4], va[4];
        LoadA<S>(ka, ks, kw * 16, kk * 16);
        LoadA<S>(va, vs, kw * 16, kk * 16);
        STRIA_UNROLL
        for (int np = 0; np < kQTiles / 2; ++np) {
          uint32_t qb[4], db[4];
          LoadBFromRowsN<S>(qb, qs, np * 16, kk * 16);
          LoadBFromRowsN<S>(db, dos, np * 16, kk * 16);
          mma_16816<T>(st[2 * np], ka, qb);
          mma_16816<T>(st[2 * np + 1], ka, qb + 2);
          mma_16816<T>(dpt[2 * np], va, db);
          mma_16816<T>(dpt[2 * np + 1], va, db + 2);
        }
      }

      // The queries of this tile that see each of this thread's two keys (all of them unless the
      // tile needs the element mask): one window per key, two comparisons per element.
      Window seen[2] = {Window{0, kM}, Window{0, kM}};
      if (!FullyVisible<kDocs>(mask, i0, i0 + kM, j0, j0 + kN)) {
        for (int e = 0; e < 2; ++e) seen[e] = SeeingQueries<kDocs>(mask, key[e], i0, kM);
      }
      WithSoftcap(p.softcap, [&](auto cap) {  // the test once per tile (softcap.cuh)
        constexpr bool kCapped = decltype(cap)::kCapped;
        STRIA_UNROLL
        for (int nt = 0; nt < kQTiles; ++nt) {
          STRIA_UNROLL
          for (int c = 0; c < 4; ++c) {
            const int qi = nt * 8 + 2 * t4 + (c & 1);
            const bool vis = In(seen[c >> 1], qi);
            float slope;
            const float pr =
                vis ? fast_exp2(Log2ScoreOf<kCapped>(st[nt][c], p.scale_log2, p.softcap, &slope) - lse2s[qi]) : 0.f;
            st[nt][c] = pr;
            dpt[nt][c] = vis ? pr * (dpt[nt][c] - deltas[qi]) * slope : 0.f;
          }
          if (!kDq || ch != 0) continue;  // the other half's warp holds the same values
          // dS^T into shared memory (rows: keys, columns: queries) for dQ = dS K below.
          uint32_t* row0 = reinterpret_cast<uint32_t*>(dss + (kw * 16 + g) * kDs + nt * 8 + 2 * t4);
          uint32_t* row1 = reinterpret_cast<uint32_t*>(dss + (kw * 16 + g + 8) * kDs + nt * 8 + 2 * t4);
          *row0 = pack2<T>(dpt[nt][0], dpt[nt][1]);
          *row1 = pack2<T>(dpt[nt][2], dpt[nt][3]);
        }
      });

      // dV += P^T dO, dK += dS^T Q, over this warp's columns.
      STRIA_UNROLL
      for (int kq = 0; kq < kM / 16; ++kq) {
        uint32_t pa[4], sa[4];
        AccToA<T>(pa, st[2 * kq], st[2 * kq + 1]);
        AccToA<T>(sa, dpt[2 * kq], dpt[2 * kq + 1]);
        STRIA_UNROLL
        for (int dp = 0; dp < kDTiles / 2; ++dp) {
          uint32_t ob[4], qb[4];
          LoadBFromRowsK<S>(ob, dos, kq * 16, ch * kCols + dp * 16);
          LoadBFromRowsK<S>(qb, qs, kq * 16, ch * kCols + dp * 16);
          mma_16816<T>(dv[2 * dp], pa, ob);
          mma_16816<T>(dv[2 * dp + 1], pa, ob + 2);
          mma_16816<T>(dk[2 * dp], sa, qb);
          mma_16816<T>(dk[2 * dp + 1], sa, qb + 2);
        }
      }
      if (!kDq) continue;
      block_sync();  // dS^T complete

      // dQ rows rg*16.., columns cs*kQCols.. : dS (queries x 64 keys) K (64 keys x D).
      float dq[kQCols / 8][4];
      STRIA_UNROLL
      for (int nt = 0; nt < kQCols / 8; ++nt)
        for (int c = 0; c < 4; ++c) dq[nt][c] = 0.f;
      STRIA_UNROLL
      for (int kk = 0; kk < kN / 16; ++kk) {
        uint32_t a[4];
        LoadAFromTransposed<kDs>(a, dss, rg * 16, kk * 16);
        STRIA_UNROLL
        for (int dp = 0; dp < kQCols / 16; ++dp) {
          uint32_t kb[4];
          LoadBFromRowsK<S>(kb, ks, kk * 16, cs * kQCols + dp * 16);
          mma_16816<T>(dq[2 * dp], a, kb);
          mma_16816<T>(dq[2 * dp + 1], a, kb + 2);
        }
      }
      STRIA_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int64_t i = i0 + rg * 16 + g + e * 8;
        if (i < mask.q_begin || i >= mask.q_end) continue;  // dS is 0 there
        float* dst = p.dq_acc + (bh * d.L + i) * D + cs * kQCols + 2 * t4;
        STRIA_UNROLL
        for (int nt = 0; nt < kQCols / 8; ++nt) atomic_add2(dst + nt * 8, dq[nt][2 * e], dq[nt][2 * e + 1]);
      }
    }
  }

  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) {
    if (key[e] >= d.L) continue;
    STRIA_UNROLL
    for (int nt = 0; nt < kDTiles; ++nt) {
      const int col = ch * kCols + nt * 8 + 2 * t4;
      StoreKeyGrad<T>(p, b, hk, key[e], col, dk[nt][2 * e] * p.scale, dv[nt][2 * e]);
      StoreKeyGrad<T>(p, b, hk, key[e], col + 1, dk[nt][2 * e + 1] * p.scale, dv[nt][2 * e + 1]);
    }
  }
}

}  // namespace cuda
}  // namespace stria
