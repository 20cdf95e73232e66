// The CUDA-core path: float32 inputs (the tensor cores would round them) and head dims or strides
// the tensor-core kernels do not take, for any storage dtype and any D in 1..512. A warp owns a
// query (or key) row at a time; lane j handles key (or query) j of a 32-wide tile held in shared
// memory as float32, and each lane owns output columns lane, lane+32, ... . Slower than the tensor
// cores by design; exact in fp32. Each kernel has two builds by the columns a lane holds in
// registers: D up to 256 (8 a lane), and up to 512 (16: Gemma 4's full-attention layers), whose
// tiles need up to 193 KB of shared memory a block (SimtSmemBytes), which Hopper and later give.
#pragma once

#include <algorithm>

#include "cuda/device_api.cuh"
#include "cuda/elem_access.cuh"
#include "cuda/forward_state.cuh"
#include "cuda/key_grads.cuh"
#include "cuda/params.h"
#include "cuda/softcap.cuh"
#include "cuda/tile_mask.cuh"
#include "cuda/warp_reduce.cuh"

namespace stria {
namespace cuda {

constexpr int kSimtRows = 16;      // rows per CTA: 4 warps x 4
constexpr int kSimtTile = 32;      // keys (queries) per shared tile: one per lane
constexpr int kSimtNarrowD = 256;  // the builds' widest head dims: columns per lane kMaxD / 32
constexpr int kSimtWideD = 512;

// `rows` rows starting at r0 (fixed b, h) into dst[rows][stride] as float; past `limit`: zeros.
template <typename T>
STRIA_DEVICE void LoadRowsF(float* dst, int stride, const void* base, int64_t row_stride, int64_t r0, int rows,
                            int64_t limit, int D) {
  for (int c = static_cast<int>(threadIdx.x); c < rows * D; c += 128) {
    const int r = c / D, col = c % D;
    dst[r * stride + col] = r0 + r < limit ? LoadElem<T>(base, (r0 + r) * row_stride + col) : 0.f;
  }
}

// Dynamic shared memory of the three SIMT kernels, in floats.
inline int SimtForwardSmemFloats(int D) {
  return kSimtRows * D + kSimtTile * (D + 1) + kSimtTile * D;
}
inline int SimtDqSmemFloats(int D) {
  return 2 * kSimtRows * D + 2 * kSimtTile * (D + 1);
}
inline int SimtDkvSmemFloats(int D) {
  return 2 * kSimtRows * D + 2 * kSimtTile * (D + 1) + 2 * kSimtTile;
}
// The most dynamic shared memory, in bytes, any SIMT kernel takes at head dim D.
inline int SimtSmemBytes(int D) {
  return 4 * std::max({SimtForwardSmemFloats(D), SimtDqSmemFloats(D), SimtDkvSmemFloats(D)});
}

template <typename T, bool kDocs = false, int kMaxD = kSimtNarrowD>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128) SimtForwardKernel(const FwdParams p) {
  STRIA_DYNAMIC_SMEM(smem_raw);
  const Dims& d = p.dims;
  const int D = d.D;
  float* qs = reinterpret_cast<float*>(smem_raw);
  float* ks = qs + kSimtRows * D;
  float* vs = ks + kSimtTile * (D + 1);
  const int warp = warp_id(), lane = lane_id();
  const CtaSlot cta = CtaSlotOf();
  const int bh = static_cast<int>(cta.head), b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};  // as in mma_forward.cuh
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kSimtRows, cta.tile, gridDim.x);
  int64_t k_lo, k_hi;
  KeyRange<kDocs>(mask, i0, MinI(i0 + kSimtRows, d.L), &k_lo, &k_hi);
  if (k_lo >= k_hi) return IdleRows<T>(p, mask, bh, i0, kSimtRows, 128);
  LoadRowsF<T>(qs, D, static_cast<const char*>(p.q.data) + (b * p.q.sb + h * p.q.sh) * ElemBytes<T>(), p.q.sl, i0,
               kSimtRows, d.L, D);

  constexpr int kPer = kMaxD / 32;
  float m_run[4], l_run[4], acc[4][kPer];
  int64_t row[4];
  bool live[4];
  STRIA_UNROLL
  for (int r = 0; r < 4; ++r) {
    row[r] = i0 + warp * 4 + r;
    live[r] = row[r] >= mask.q_begin && row[r] < mask.q_end;
    const int64_t sr = static_cast<int64_t>(bh) * d.L + row[r];
    const bool read = live[r] && !p.first;  // the call's first block starts empty (forward_state.cuh)
    m_run[r] = read ? p.m[sr] : NegInf();
    l_run[r] = read ? p.l[sr] : 0.f;
    STRIA_UNROLL
    for (int e = 0; e < kPer; ++e) {
      const int c = lane + 32 * e;
      acc[r][e] = read && c < D ? p.acc[sr * D + c] : 0.f;
    }
  }

  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  for (int64_t j0 = (k_lo / kSimtTile) * kSimtTile; j0 < k_hi; j0 += kSimtTile) {
    block_sync();
    LoadRowsF<T>(ks, D + 1, static_cast<const char*>(p.k) + kv_off * ElemBytes<T>(), kv_row, j0, kSimtTile, d.L, D);
    LoadRowsF<T>(vs, D, static_cast<const char*>(p.v) + kv_off * ElemBytes<T>(), kv_row, j0, kSimtTile, d.L, D);
    block_sync();
    STRIA_UNROLL
    for (int r = 0; r < 4; ++r) {
      const float* qrow = qs + (warp * 4 + r) * D;
      const float* krow = ks + lane * (D + 1);
      float s = 0.f;
      for (int c = 0; c < D; ++c) s += qrow[c] * krow[c];
      s = Log2Score(s, p.scale_log2, p.softcap);
      if (!Visible<kDocs>(mask, row[r], j0 + lane)) s = NegInf();
      const float m_new = fmaxf(m_run[r], WarpMax(s));
      const float base = m_new == NegInf() ? 0.f : m_new;
      const float alpha = fast_exp2(m_run[r] - base);
      const float pv = fast_exp2(s - base);
      l_run[r] = l_run[r] * alpha + WarpSum(pv);
      m_run[r] = m_new;
      STRIA_UNROLL
      for (int e = 0; e < kPer; ++e) acc[r][e] *= alpha;
      for (int jj = 0; jj < kSimtTile; ++jj) {
        const float pj = shfl(pv, jj);
        const float* vrow = vs + jj * D;
        STRIA_UNROLL
        for (int e = 0; e < kPer; ++e) {
          const int c = lane + 32 * e;
          if (c < D) acc[r][e] += pj * vrow[c];
        }
      }
    }
  }
  STRIA_UNROLL
  for (int r = 0; r < 4; ++r) {
    if (!live[r]) continue;
    if (p.out.data != nullptr) {  // the call's last block: the finished row
      const float scale = OutputScale(l_run[r]);
      if (lane == 0) p.lse[LseAt(p, bh, row[r])] = RowLse(m_run[r], l_run[r]);
      STRIA_UNROLL
      for (int e = 0; e < kPer; ++e) {
        const int c = lane + 32 * e;
        if (c < D) StoreElem<T>(p.out.data, OutAt(p, bh, row[r]) + c, acc[r][e] * scale);
      }
      continue;
    }
    const int64_t sr = static_cast<int64_t>(bh) * d.L + row[r];
    if (lane == 0) {
      p.m[sr] = m_run[r];
      p.l[sr] = l_run[r];
    }
    STRIA_UNROLL
    for (int e = 0; e < kPer; ++e) {
      const int c = lane + 32 * e;
      if (c < D) p.acc[sr * D + c] = acc[r][e];
    }
  }
}

// Backward, dQ part: a warp owns a query row; lane j recomputes p and dS for key j of a tile and
// the warp adds dS K into the row's dq_acc (only this warp writes that row in this launch).
template <typename T, bool kDocs = false, int kMaxD = kSimtNarrowD>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128) SimtBackwardDqKernel(const BwdParams p) {
  STRIA_DYNAMIC_SMEM(smem_raw);
  const Dims& d = p.dims;
  const int D = d.D;
  float* qs = reinterpret_cast<float*>(smem_raw);
  float* dos = qs + kSimtRows * D;
  float* ks = dos + kSimtRows * D;
  float* vs = ks + kSimtTile * (D + 1);
  const int warp = warp_id(), lane = lane_id();
  const CtaSlot cta = CtaSlotOf();
  const int bh = static_cast<int>(cta.head), b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};  // as in mma_forward.cuh
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int64_t i0 = QueryTileStart(mask, kSimtRows, cta.tile, gridDim.x);
  int64_t k_lo, k_hi;
  KeyRange<kDocs>(mask, i0, MinI(i0 + kSimtRows, d.L), &k_lo, &k_hi);
  if (k_lo >= k_hi) return;
  constexpr int kEb = ElemBytes<T>();
  LoadRowsF<T>(qs, D, static_cast<const char*>(p.q.data) + (b * p.q.sb + h * p.q.sh) * kEb, p.q.sl, i0, kSimtRows, d.L,
               D);
  LoadRowsF<T>(dos, D, static_cast<const char*>(p.dout.data) + (b * p.dout.sb + h * p.dout.sh) * kEb, p.dout.sl, i0,
               kSimtRows, d.L, D);

  constexpr int kPer = kMaxD / 32;
  float dq[4][kPer], lse2[4], delta[4];
  int64_t row[4];
  STRIA_UNROLL
  for (int r = 0; r < 4; ++r) {
    row[r] = i0 + warp * 4 + r;
    const bool in = row[r] < d.L;
    lse2[r] = in ? p.lse2[static_cast<int64_t>(bh) * d.L + row[r]] : PosInf();
    delta[r] = in ? p.delta[static_cast<int64_t>(bh) * d.L + row[r]] : 0.f;
    STRIA_UNROLL
    for (int e = 0; e < kPer; ++e) dq[r][e] = 0.f;
  }
  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  for (int64_t j0 = (k_lo / kSimtTile) * kSimtTile; j0 < k_hi; j0 += kSimtTile) {
    block_sync();
    LoadRowsF<T>(ks, D + 1, static_cast<const char*>(p.k) + kv_off * kEb, kv_row, j0, kSimtTile, d.L, D);
    LoadRowsF<T>(vs, D + 1, static_cast<const char*>(p.v) + kv_off * kEb, kv_row, j0, kSimtTile, d.L, D);
    block_sync();
    STRIA_UNROLL
    for (int r = 0; r < 4; ++r) {
      const float* qrow = qs + (warp * 4 + r) * D;
      const float* dorow = dos + (warp * 4 + r) * D;
      const float* krow = ks + lane * (D + 1);
      const float* vrow = vs + lane * (D + 1);
      float s = 0.f, dp = 0.f;
      for (int c = 0; c < D; ++c) {
        s += qrow[c] * krow[c];
        dp += dorow[c] * vrow[c];
      }
      const bool vis = Visible<kDocs>(mask, row[r], j0 + lane);
      float slope;
      const float pr = vis ? fast_exp2(Log2Score(s, p.scale_log2, p.softcap, &slope) - lse2[r]) : 0.f;
      const float ds = vis ? pr * (dp - delta[r]) * slope : 0.f;
      for (int jj = 0; jj < kSimtTile; ++jj) {
        const float dsj = shfl(ds, jj);
        const float* kr = ks + jj * (D + 1);
        STRIA_UNROLL
        for (int e = 0; e < kPer; ++e) {
          const int c = lane + 32 * e;
          if (c < D) dq[r][e] += dsj * kr[c];
        }
      }
    }
  }
  STRIA_UNROLL
  for (int r = 0; r < 4; ++r) {
    if (row[r] < mask.q_begin || row[r] >= mask.q_end) continue;
    float* dst = p.dq_acc + (static_cast<int64_t>(bh) * d.L + row[r]) * D;
    STRIA_UNROLL
    for (int e = 0; e < kPer; ++e) {
      const int c = lane + 32 * e;
      if (c < D) dst[c] += dq[r][e];
    }
  }
}

// Backward, dK/dV part: a warp owns a key row; lane i recomputes p and dS for query i of a tile
// (every query head of the K/V head's group) and the warp accumulates P^T dO and dS^T Q.
template <typename T, bool kDocs = false, int kMaxD = kSimtNarrowD>
STRIA_GLOBAL void STRIA_LAUNCH_BOUNDS(128) SimtBackwardDkvKernel(const BwdParams p) {
  STRIA_DYNAMIC_SMEM(smem_raw);
  const Dims& d = p.dims;
  const int D = d.D;
  float* ks = reinterpret_cast<float*>(smem_raw);
  float* vs = ks + kSimtRows * D;
  float* qs = vs + kSimtRows * D;
  float* dos = qs + kSimtTile * (D + 1);
  float* lse2s = dos + kSimtTile * (D + 1);
  float* deltas = lse2s + kSimtTile;
  const int warp = warp_id(), lane = lane_id();
  const CtaSlot cta = CtaSlotOf();
  const int bhk = static_cast<int>(cta.head), b = bhk / d.Hkv, hk = bhk % d.Hkv;
  const MaskArgs docs_mask = kDocs ? BatchMask(p.mask, b) : MaskArgs{};  // as in mma_forward.cuh
  const MaskArgs& mask = kDocs ? docs_mask : p.mask;
  const int group = d.Hq / d.Hkv;
  const int64_t j0 = p.key_begin + static_cast<int64_t>(cta.tile) * kSimtRows;
  const TileRun queries = QueryTilesOf<kDocs>(mask, j0, MinI(j0 + kSimtRows, d.L), kSimtTile);
  if (queries.count == 0) return ZeroKeyGrads<T>(p, b, hk, j0, kSimtRows, 128);
  constexpr int kEb = ElemBytes<T>();
  const int64_t kv_row = static_cast<int64_t>(d.Hkv) * D;
  const int64_t kv_off = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * D;
  LoadRowsF<T>(ks, D, static_cast<const char*>(p.k) + kv_off * kEb, kv_row, j0, kSimtRows, d.L, D);
  LoadRowsF<T>(vs, D, static_cast<const char*>(p.v) + kv_off * kEb, kv_row, j0, kSimtRows, d.L, D);

  constexpr int kPer = kMaxD / 32;
  float dk[4][kPer], dv[4][kPer];
  STRIA_UNROLL
  for (int r = 0; r < 4; ++r)
    for (int e = 0; e < kPer; ++e) dk[r][e] = dv[r][e] = 0.f;
  for (int gi = 0; gi < group; ++gi) {
    const int h = hk * group + gi;
    const int64_t bh = static_cast<int64_t>(b) * d.Hq + h;
    for (int qt = 0; qt < queries.count; ++qt) {
      const int64_t i0 = queries.first + static_cast<int64_t>(qt) * kSimtTile;
      block_sync();
      LoadRowsF<T>(qs, D + 1, static_cast<const char*>(p.q.data) + (b * p.q.sb + h * p.q.sh) * kEb, p.q.sl, i0,
                   kSimtTile, d.L, D);
      LoadRowsF<T>(dos, D + 1, static_cast<const char*>(p.dout.data) + (b * p.dout.sb + h * p.dout.sh) * kEb, p.dout.sl,
                   i0, kSimtTile, d.L, D);
      for (int r = static_cast<int>(threadIdx.x); r < kSimtTile; r += 128) {
        const bool in = i0 + r < d.L;
        lse2s[r] = in ? p.lse2[bh * d.L + i0 + r] : PosInf();
        deltas[r] = in ? p.delta[bh * d.L + i0 + r] : 0.f;
      }
      block_sync();
      STRIA_UNROLL
      for (int r = 0; r < 4; ++r) {
        const int64_t j = j0 + warp * 4 + r;
        const float* krow = ks + (warp * 4 + r) * D;
        const float* vrow = vs + (warp * 4 + r) * D;
        const float* qrow = qs + lane * (D + 1);
        const float* dorow = dos + lane * (D + 1);
        float s = 0.f, dp = 0.f;
        for (int c = 0; c < D; ++c) {
          s += qrow[c] * krow[c];
          dp += dorow[c] * vrow[c];
        }
        const bool vis = Visible<kDocs>(mask, i0 + lane, j);
        float slope;
        const float pr = vis ? fast_exp2(Log2Score(s, p.scale_log2, p.softcap, &slope) - lse2s[lane]) : 0.f;
        const float ds = vis ? pr * (dp - deltas[lane]) * slope : 0.f;
        for (int ii = 0; ii < kSimtTile; ++ii) {
          const float pi = shfl(pr, ii), dsi = shfl(ds, ii);
          const float* qr = qs + ii * (D + 1);
          const float* dr = dos + ii * (D + 1);
          STRIA_UNROLL
          for (int e = 0; e < kPer; ++e) {
            const int c = lane + 32 * e;
            if (c < D) {
              dv[r][e] += pi * dr[c];
              dk[r][e] += dsi * qr[c];
            }
          }
        }
      }
    }
  }
  STRIA_UNROLL
  for (int r = 0; r < 4; ++r) {
    const int64_t j = j0 + warp * 4 + r;
    if (j >= d.L) continue;
    STRIA_UNROLL
    for (int e = 0; e < kPer; ++e) {
      const int c = lane + 32 * e;
      if (c < D) StoreKeyGrad<T>(p, b, hk, j, c, dk[r][e] * p.scale, dv[r][e]);
    }
  }
}

}  // namespace cuda
}  // namespace stria
