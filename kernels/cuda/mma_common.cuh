// Pieces shared by the tensor-core forward and backward kernels: tile loads into padded shared
// memory, and fragment loads in the layouts of mma.m16n8k16 (see device_api.cuh).
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/forward_state.cuh"
#include "cuda/key_grads.cuh"
#include "cuda/params.h"
#include "cuda/softcap.cuh"
#include "cuda/tile_mask.cuh"

namespace stria {
namespace cuda {

// Shared-memory rows of D 16-bit values padded by 8 (16 bytes): consecutive rows then start in
// different bank groups, so the 8 row addresses of an ldmatrix hit 8 distinct 16-byte bank groups.
template <int D>
struct SmemRow {
  static constexpr int kStride = D + 8;
};

// Rows [r0, r0 + rows) of a [B, L, H, D] tensor for fixed (b, h) into `dst` (row stride kStride),
// with cp.async; rows at or past `limit` are zero-filled. Requires 16-byte aligned rows.
template <int D, int kThreads>
STRIA_DEVICE void LoadRows(uint16_t* dst, const uint16_t* base, int64_t row_stride, int64_t r0, int rows,
                           int64_t limit) {
  constexpr int kChunks = D / 8;  // 16-byte pieces per row
  for (int c = static_cast<int>(threadIdx.x); c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks, col = (c % kChunks) * 8;
    const bool valid = r0 + r < limit;
    const uint16_t* src = base + (valid ? (r0 + r) : r0) * row_stride + col;
    cp_async_16(dst + r * SmemRow<D>::kStride + col, src, valid);
  }
}

// A fragment (16x16, row-major) at (row0, col0) of a shared tile stored row-major.
template <int kStride>
STRIA_DEVICE void LoadA(uint32_t a[4], const uint16_t* tile, int row0, int col0) {
  const int l = lane_id();
  ldmatrix_x4(a, tile + (row0 + (l & 15)) * kStride + col0 + (l >> 4) * 8);
}

// B fragments of two adjacent n8 tiles, when the shared tile stores B transposed: rows are n,
// columns are k (the keys of S = Q K^T). b[0..1]: n-tile n0, b[2..3]: n-tile n0 + 8.
template <int kStride>
STRIA_DEVICE void LoadBFromRowsN(uint32_t b[4], const uint16_t* tile, int n0, int k0) {
  const int l = lane_id();
  ldmatrix_x4(b, tile + (n0 + (l & 7) + (l >> 4) * 8) * kStride + k0 + ((l >> 3) & 1) * 8);
}

// B fragments of two adjacent n8 tiles, when the shared tile stores B as is: rows are k, columns
// are n (the values of O = P V). b[0..1]: n-tile n0, b[2..3]: n-tile n0 + 8.
template <int kStride>
STRIA_DEVICE void LoadBFromRowsK(uint32_t b[4], const uint16_t* tile, int k0, int n0) {
  const int l = lane_id();
  ldmatrix_x4_trans(b, tile + (k0 + (l & 7) + ((l >> 3) & 1) * 8) * kStride + n0 + (l >> 4) * 8);
}

// A fragment (16x16 at rows m0, columns k0) of a matrix whose transpose is stored: the shared
// tile's rows are k and its columns m.
template <int kStride>
STRIA_DEVICE void LoadAFromTransposed(uint32_t a[4], const uint16_t* tile, int m0, int k0) {
  const int l = lane_id(), mi = l >> 3;
  ldmatrix_x4_trans(a, tile + (k0 + (l & 7) + (mi >> 1) * 8) * kStride + m0 + (mi & 1) * 8);
}

// Where one (batch, query head) of a forward block reads: its q rows (strided), and the compact
// [B, L, Hkv, D] K/V rows of the KV head it shares under GQA (h / (Hq / Hkv)), kv_row apart.
struct HeadRows {
  const uint16_t *q, *k, *v;
  int64_t kv_row;
};
STRIA_DEVICE HeadRows ForwardHeadRows(const FwdParams& p, int bh) {
  const Dims& d = p.dims;
  const int b = bh / d.Hq, h = bh % d.Hq, hk = h / (d.Hq / d.Hkv);
  const int64_t kv = (static_cast<int64_t>(b) * d.L * d.Hkv + hk) * d.D;
  return HeadRows{static_cast<const uint16_t*>(p.q.data) + b * p.q.sb + h * p.q.sh,
                  static_cast<const uint16_t*>(p.k) + kv, static_cast<const uint16_t*>(p.v) + kv,
                  static_cast<int64_t>(d.Hkv) * d.D};
}

// The online-softmax step of one row held by 4 lanes (an accumulator row of mma or wgmma):
// `tile_max` is this lane's max of the tile's scaled, masked scores. Updates the running max and
// returns the factor that rescales the old state; `base` is the exponent base for this tile's
// probabilities. A row that has seen no key keeps m = -inf and base 0, so exp2 stays finite.
STRIA_DEVICE float OnlineMaxStep(float tile_max, float* m_run, float* base) {
  tile_max = fmaxf(tile_max, shfl_xor(tile_max, 1));
  tile_max = fmaxf(tile_max, shfl_xor(tile_max, 2));
  const float m_new = fmaxf(*m_run, tile_max);
  *base = m_new == NegInf() ? 0.f : m_new;
  const float alpha = fast_exp2(*m_run - *base);
  *m_run = m_new;
  return alpha;
}

// What the dQ passes of the deterministic backward (mma_backward_dq.cuh, wgmma_backward_dq.cuh)
// share. A row's lse2 and delta; +inf for a row past the end makes its probabilities 0.
STRIA_DEVICE void DqRowScalars(const BwdParams& p, int bh, int64_t row, float* lse2, float* delta) {
  const bool in = row < p.dims.L;
  *lse2 = in ? p.lse2[static_cast<int64_t>(bh) * p.dims.L + row] : PosInf();
  *delta = in ? p.delta[static_cast<int64_t>(bh) * p.dims.L + row] : 0.f;
}
// A row's dQ added into dq_acc by its only writer in the launch (a plain read-add-write): row e of
// this thread's two in the accumulator layout, `dq` flat (element 4 nt + c: row c >> 1, column
// col0 + 8 nt + 2 t4 + (c & 1), kCols of the row's D); rows outside the block's queries left alone
// (dS is 0 there).
template <int D, int kCols = D>
STRIA_DEVICE void AddDqRow(const BwdParams& p, const MaskArgs& mask, int bh, int64_t row, int e, int t4,
                           const float* dq, int col0 = 0) {
  if (row < mask.q_begin || row >= mask.q_end) return;
  float* dst = p.dq_acc + (static_cast<int64_t>(bh) * p.dims.L + row) * D + col0 + 2 * t4;
  STRIA_UNROLL
  for (int nt = 0; nt < kCols / 8; ++nt) {
    dst[nt * 8] += dq[4 * nt + 2 * e];
    dst[nt * 8 + 1] += dq[4 * nt + 2 * e + 1];
  }
}

// Accumulators of two n8 tiles (16 x 16) as the A fragment of the next product (P -> P V).
template <typename T>
STRIA_DEVICE void AccToA(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = pack2<T>(c0[0], c0[1]);
  a[1] = pack2<T>(c0[2], c0[3]);
  a[2] = pack2<T>(c1[0], c1[1]);
  a[3] = pack2<T>(c1[2], c1[3]);
}

}  // namespace cuda
}  // namespace stria
