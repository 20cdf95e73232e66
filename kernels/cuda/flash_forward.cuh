// Tensor-core forward tile kernel (mma.sync m16n8k16, bf16/fp16 in, fp32 accumulate): one CTA of
// 4 warps owns 64 queries of one head (16 rows per warp) and merges one ring block's keys into
// their running softmax state (row max m, row sum l, unnormalised output acc, all fp32 in global
// memory). Keeping the state across ring steps is the LSE merge of ring attention done in place:
// no per-block output or LSE is written and merged later.
//
// Pipeline: the K tile of step n+1 loads (cp.async) while P V of step n runs, and the V tile of
// step n while Q K^T of step n runs. Tiles wholly outside the block's mask are never visited; the
// element mask is applied only to tiles the diagonal or the rectangle's edge cuts.
#pragma once

#include "cuda/flash_common.cuh"

namespace stria {
namespace cuda {

template <int D>
struct FwdTile {
  static constexpr int kM = 64, kN = 64, kThreads = 128;
  static constexpr int kStride = SmemRow<D>::kStride;
  static constexpr int kSmemBytes = (kM + 2 * kN) * kStride * 2;
};

template <typename T, int D>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128) FlashForwardKernel(const FwdParams p) {
  using Tile = FwdTile<D>;
  constexpr int S = Tile::kStride, kM = Tile::kM, kN = Tile::kN;
  constexpr int kDTiles = D / 8, kKSteps = D / 16, kNTiles = kN / 8;
  STRIA_DYNAMIC_SMEM(smem_raw);
  uint16_t* qs = reinterpret_cast<uint16_t*>(smem_raw);
  uint16_t* ks = qs + kM * S;
  uint16_t* vs = ks + kN * S;

  const Dims& d = p.dims;
  const int warp = warp_id(), lane = lane_id(), g = lane >> 2, t4 = lane & 3;
  const int bh = static_cast<int>(blockIdx.y), b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
  // Later query tiles see more keys under a causal mask: start them first.
  const int64_t i0 = (p.mask.q_begin / kM) * kM + static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kM;
  int64_t k_lo, k_hi;
  KeyRange(p.mask, i0, MinI(i0 + kM, d.L), &k_lo, &k_hi);
  if (k_lo >= k_hi) return;  // the whole CTA, before any barrier
  const int64_t j_first = (k_lo / kN) * kN;
  const int n_tiles = static_cast<int>((k_hi - j_first + kN - 1) / kN);

  const uint16_t* qg = static_cast<const uint16_t*>(p.q.data) + b * p.q.sb + h * p.q.sh;
  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;  // compact [B, L, Hkv, D]
  const uint16_t* kg = static_cast<const uint16_t*>(p.k) + (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  const uint16_t* vg = static_cast<const uint16_t*>(p.v) + (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;

  LoadRows<D, 128>(qs, qg, p.q.sl, i0, kM, d.L);
  LoadRows<D, 128>(ks, kg, kv_row, j_first, kN, d.L);
  cp_async_commit();

  // This lane's two rows and its share of their running state.
  int64_t row[2];
  bool live[2];
  float m_run[2], l_run[2];
  float o[kDTiles][4];
  for (int e = 0; e < 2; ++e) {
    row[e] = i0 + warp * 16 + g + e * 8;
    live[e] = row[e] >= p.mask.q_begin && row[e] < p.mask.q_end;
    const int64_t sr = static_cast<int64_t>(bh) * d.L + row[e];
    m_run[e] = live[e] ? p.m[sr] : NegInf();
    // l is stored complete; as four lanes each hold a partial sum, one of them starts with it.
    l_run[e] = live[e] && t4 == 0 ? p.l[sr] : 0.f;
    STRIA_UNROLL
    for (int nt = 0; nt < kDTiles; ++nt) {
      const float* src = p.acc + sr * D + nt * 8 + 2 * t4;
      o[nt][2 * e] = live[e] ? src[0] : 0.f;
      o[nt][2 * e + 1] = live[e] ? src[1] : 0.f;
    }
  }

  uint32_t qf[kKSteps][4];
  for (int n = 0; n < n_tiles; ++n) {
    const int64_t j0 = j_first + static_cast<int64_t>(n) * kN;
    cp_async_wait<0>();
    block_sync();  // K tile n (and Q) landed; every warp is done reading V tile n-1
    LoadRows<D, 128>(vs, vg, kv_row, j0, kN, d.L);
    cp_async_commit();
    if (n == 0) {
      STRIA_UNROLL
      for (int kk = 0; kk < kKSteps; ++kk) LoadA<S>(qf[kk], qs, warp * 16, kk * 16);
    }

    float s[kNTiles][4];
    STRIA_UNROLL
    for (int nt = 0; nt < kNTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
    STRIA_UNROLL
    for (int kk = 0; kk < kKSteps; ++kk) {
      STRIA_UNROLL
      for (int np = 0; np < kNTiles / 2; ++np) {
        uint32_t bf[4];
        LoadBFromRowsN<S>(bf, ks, np * 16, kk * 16);
        mma_16816<T>(s[2 * np], qf[kk], bf);
        mma_16816<T>(s[2 * np + 1], qf[kk], bf + 2);
      }
    }

    const bool masked = !FullyVisible(p.mask, i0, i0 + kM, j0, j0 + kN);
    float mx[2] = {NegInf(), NegInf()};
    STRIA_UNROLL
    for (int nt = 0; nt < kNTiles; ++nt) {
      STRIA_UNROLL
      for (int c = 0; c < 4; ++c) {
        const int e = c >> 1;
        float v = s[nt][c] * p.scale_log2;
        if (masked && !Visible(p.mask, row[e], j0 + nt * 8 + 2 * t4 + (c & 1))) v = NegInf();
        s[nt][c] = v;
        mx[e] = fmaxf(mx[e], v);
      }
    }
    float alpha[2], base[2];
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) {
      mx[e] = fmaxf(mx[e], shfl_xor(mx[e], 1));
      mx[e] = fmaxf(mx[e], shfl_xor(mx[e], 2));
      const float m_new = fmaxf(m_run[e], mx[e]);
      // A row that has seen no key yet keeps m = -inf; subtracting 0 then keeps exp2 finite.
      base[e] = m_new == NegInf() ? 0.f : m_new;
      alpha[e] = fast_exp2(m_run[e] - base[e]);
      m_run[e] = m_new;
    }
    float sum[2] = {0.f, 0.f};
    STRIA_UNROLL
    for (int nt = 0; nt < kNTiles; ++nt) {
      STRIA_UNROLL
      for (int c = 0; c < 4; ++c) {
        const float pv = fast_exp2(s[nt][c] - base[c >> 1]);
        s[nt][c] = pv;
        sum[c >> 1] += pv;
      }
    }
    STRIA_UNROLL
    for (int e = 0; e < 2; ++e) l_run[e] = l_run[e] * alpha[e] + sum[e];
    STRIA_UNROLL
    for (int nt = 0; nt < kDTiles; ++nt) {
      o[nt][0] *= alpha[0];
      o[nt][1] *= alpha[0];
      o[nt][2] *= alpha[1];
      o[nt][3] *= alpha[1];
    }

    cp_async_wait<0>();
    block_sync();  // V tile n landed; every warp is done reading K tile n
    if (n + 1 < n_tiles) {
      LoadRows<D, 128>(ks, kg, kv_row, j0 + kN, kN, d.L);
      cp_async_commit();
    }
    STRIA_UNROLL
    for (int kk = 0; kk < kN / 16; ++kk) {
      uint32_t pa[4];
      AccToA<T>(pa, s[2 * kk], s[2 * kk + 1]);
      STRIA_UNROLL
      for (int dp = 0; dp < kDTiles / 2; ++dp) {
        uint32_t bf[4];
        LoadBFromRowsK<S>(bf, vs, kk * 16, dp * 16);
        mma_16816<T>(o[2 * dp], pa, bf);
        mma_16816<T>(o[2 * dp + 1], pa, bf + 2);
      }
    }
  }

  STRIA_UNROLL
  for (int e = 0; e < 2; ++e) {
    l_run[e] += shfl_xor(l_run[e], 1);
    l_run[e] += shfl_xor(l_run[e], 2);
    if (!live[e]) continue;
    const int64_t sr = static_cast<int64_t>(bh) * d.L + row[e];
    if (t4 == 0) {
      p.m[sr] = m_run[e];
      p.l[sr] = l_run[e];
    }
    STRIA_UNROLL
    for (int nt = 0; nt < kDTiles; ++nt) {
      float* dst = p.acc + sr * D + nt * 8 + 2 * t4;
      dst[0] = o[nt][2 * e];
      dst[1] = o[nt][2 * e + 1];
    }
  }
}

}  // namespace cuda
}  // namespace stria
