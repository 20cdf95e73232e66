// Hopper forward tile kernel (wgmma.mma_async, sm_90a): the same contract as flash_forward.cuh
// (one ring block's keys merged into the fp32 running state m, l, acc of 128 queries of one head),
// with warpgroup MMAs in place of mma.sync:
//  - S = Q K^T reads both operands straight from shared memory (descriptors), so no ldmatrix and
//    no register traffic for Q or K;
//  - O += P V takes P from the registers the softmax left it in (the accumulator layout of S is
//    the A-fragment layout, pairwise) and V from shared memory in the transposed-B form, so V
//    needs no transpose either.
// Two warpgroups (256 threads) own 64 query rows each and share the K and V tiles. Q, K and V sit
// in shared memory in the 128-byte swizzle (wgmma_api.cuh), loaded by every thread with cp.async;
// the K tile of step n+1 loads during P V of step n, the V tile of step n during Q K^T of step n.
// A warpgroup skips key tiles none of its rows see (wgmma is warpgroup-wide, so the skip is too).
//
// Before wgmma reads shared memory that cp.async wrote, the writing threads fence the async proxy
// (fence_proxy_async) and the block synchronises.
#pragma once

#include "cuda/flash_common.cuh"
#include "cuda/wgmma_api.cuh"

namespace stria {
namespace cuda {

template <int D>
struct WgmmaFwdTile {
  static constexpr int kGroups = 2, kThreads = 128 * kGroups, kM = 64 * kGroups, kN = 128;
  static constexpr int kQBytes = kM * D * 2, kKvBytes = kN * D * 2;
  // + 1024: the dynamic shared memory's start need not be 1024-byte aligned; the kernel aligns.
  static constexpr int kSmemBytes = kQBytes + 2 * kKvBytes + kSwizzleAtomBytes;
};

// Rows [r0, r0 + rows) of a [B, L, H, D] tensor for fixed (b, h) into the swizzled tile at `dst`
// (rows past `limit` zero-filled), by all kThreads threads with cp.async.
template <int D, int kThreads>
STRIA_DEVICE void LoadSwizzled(unsigned char* dst, const uint16_t* base, int64_t row_stride, int64_t r0, int rows,
                               int64_t limit) {
  constexpr int kChunks = D / 8;
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r0 + r < limit;
    const uint16_t* src = base + (valid ? (r0 + r) : r0) * row_stride + col;
    cp_async_16(dst + SwizzledOffset(rows, r, col), src, valid);
  }
}

template <typename T, int D>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(256) WgmmaForwardKernel(const FwdParams p) {
#if STRIA_HAS_WGMMA
  using Tile = WgmmaFwdTile<D>;
  constexpr int kM = Tile::kM, kN = Tile::kN, kThreads = Tile::kThreads;
  STRIA_DYNAMIC_SMEM(smem_raw);
  const uint32_t raw_addr = smem_addr(smem_raw);
  unsigned char* qs = smem_raw + ((kSwizzleAtomBytes - raw_addr % kSwizzleAtomBytes) % kSwizzleAtomBytes);
  unsigned char* ks = qs + Tile::kQBytes;
  unsigned char* vs = ks + Tile::kKvBytes;
  const uint32_t q_addr = smem_addr(qs), k_addr = smem_addr(ks), v_addr = smem_addr(vs);

  const Dims& d = p.dims;
  const int tid = static_cast<int>(threadIdx.x), group = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int g = lane >> 2, t4 = lane & 3;
  const int bh = static_cast<int>(blockIdx.y);
  const int64_t i0 = QueryTileStart(p.mask, kM, blockIdx.x, gridDim.x);
  int64_t k_lo, k_hi;
  KeyRange(p.mask, i0, MinI(i0 + kM, d.L), &k_lo, &k_hi);
  if (k_lo >= k_hi) return;  // the whole CTA, before any barrier
  const int64_t j_first = (k_lo / kN) * kN;
  const int n_tiles = static_cast<int>((k_hi - j_first + kN - 1) / kN);
  const int64_t gi0 = i0 + 64 * group, gi1 = gi0 + 64;  // this warpgroup's rows
  int64_t gk_lo, gk_hi;
  KeyRange(p.mask, gi0, MinI(gi1, d.L), &gk_lo, &gk_hi);

  const HeadRows hr = ForwardHeadRows(p, bh);

  LoadSwizzled<D, kThreads>(qs, hr.q, p.q.sl, i0, kM, d.L);
  LoadSwizzled<D, kThreads>(ks, hr.k, hr.kv_row, j_first, kN, d.L);
  cp_async_commit();

  // This thread's rows gi0 + 16 warp + g (+8) and its share of their running state, in the
  // accumulator layout: element 4 i + c is row (c >> 1) * 8, column 8 i + 2 t4 + (c & 1).
  int64_t row[2];
  bool live[2];
  float m_run[2], l_run[2];
  float o[D / 2];
  for (int e = 0; e < 2; ++e) {
    row[e] = gi0 + 16 * warp + g + 8 * e;
    live[e] = row[e] >= p.mask.q_begin && row[e] < p.mask.q_end;
    LoadRowState<D>(p, static_cast<int64_t>(bh) * d.L + row[e], t4, live[e], &m_run[e], &l_run[e], &o[2 * e]);
  }

  for (int n = 0; n < n_tiles; ++n) {
    const int64_t j0 = j_first + static_cast<int64_t>(n) * kN;
    cp_async_wait<0>();
    fence_proxy_async();
    block_sync();  // K tile n (and Q) landed and visible to wgmma; V tile n-1 no longer read
    LoadSwizzled<D, kThreads>(vs, hr.v, hr.kv_row, j0, kN, d.L);
    cp_async_commit();
    const bool active = j0 < gk_hi && j0 + kN > gk_lo;

    float s[kN / 2];
    if (active) {
      wgmma_fence();
      STRIA_UNROLL
      for (int kk = 0; kk < D / 16; ++kk) {
        // Column block kk / 4 (64 values: kM or kN rows x 128 bytes), then 32 bytes per 16 columns.
        const uint32_t kcol = static_cast<uint32_t>((kk & 3) * 32);
        const uint64_t qa = SwizzledDesc(q_addr + (kk >> 2) * kM * kSwizzleBytes + 64 * group * kSwizzleBytes + kcol,
                                         16, kSwizzleAtomBytes);
        const uint64_t kb = SwizzledDesc(k_addr + (kk >> 2) * kN * kSwizzleBytes + kcol, 16, kSwizzleAtomBytes);
        wgmma_ss<T, kN>(s, qa, kb, kk > 0);
      }
      wgmma_commit();
      wgmma_wait<0>();

      const bool masked = !FullyVisible(p.mask, gi0, gi1, j0, j0 + kN);
      float mx[2] = {NegInf(), NegInf()};
      STRIA_UNROLL
      for (int i = 0; i < kN / 2; ++i) {
        const int e = (i & 3) >> 1;
        float v = s[i] * p.scale_log2;
        if (masked && !Visible(p.mask, row[e], j0 + 8 * (i >> 2) + 2 * t4 + (i & 1))) v = NegInf();
        s[i] = v;
        mx[e] = fmaxf(mx[e], v);
      }
      float alpha[2], base[2];
      STRIA_UNROLL
      for (int e = 0; e < 2; ++e) alpha[e] = OnlineMaxStep(mx[e], &m_run[e], &base[e]);
      float sum[2] = {0.f, 0.f};
      STRIA_UNROLL
      for (int i = 0; i < kN / 2; ++i) {
        const int e = (i & 3) >> 1;
        s[i] = fast_exp2(s[i] - base[e]);
        sum[e] += s[i];
      }
      STRIA_UNROLL
      for (int e = 0; e < 2; ++e) l_run[e] = l_run[e] * alpha[e] + sum[e];
      STRIA_UNROLL
      for (int i = 0; i < D / 2; ++i) o[i] *= alpha[(i & 3) >> 1];
    }

    cp_async_wait<0>();
    fence_proxy_async();
    block_sync();  // V tile n landed and visible; every warpgroup is done with K tile n
    if (n + 1 < n_tiles) {
      LoadSwizzled<D, kThreads>(ks, hr.k, hr.kv_row, j0 + kN, kN, d.L);
      cp_async_commit();
    }
    if (!active) continue;
    // P (16-bit) as A fragments: keys 16 kk .. 16 kk + 15 are accumulator chunks 2 kk, 2 kk + 1.
    uint32_t pa[kN / 16][4];
    STRIA_UNROLL
    for (int kk = 0; kk < kN / 16; ++kk) AccToA<T>(pa[kk], s + 8 * kk, s + 8 * kk + 4);
    wgmma_fence();
    STRIA_UNROLL
    for (int kk = 0; kk < kN / 16; ++kk) {
      // Keys 16 kk.. are rows 16 kk.. of V: 2048 bytes per 16 rows; LBO: the next 64 columns.
      const uint64_t db = SwizzledDesc(v_addr + kk * 16 * kSwizzleBytes, kN * kSwizzleBytes, kSwizzleAtomBytes);
      wgmma_rs_tb<T, D>(o, pa[kk], db, true);
    }
    wgmma_commit();
    wgmma_wait<0>();
  }

  STRIA_UNROLL
  for (int e = 0; e < 2; ++e)
    StoreRowState<D>(p, static_cast<int64_t>(bh) * d.L + row[e], t4, live[e], m_run[e], l_run[e], &o[2 * e]);
#else
  (void)p;  // built for sm_90a only; the launcher never picks it elsewhere
#endif
}

}  // namespace cuda
}  // namespace stria
