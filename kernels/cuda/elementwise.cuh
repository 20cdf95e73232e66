// The memory-bound kernels around the tile kernels: packing a K/V ring message, initialising and
// finishing the forward state, the backward's per-row preprocessing, writing gradients back in
// the caller's dtype and strides, dK/dV accumulation, shard/unshard of device tensors, and the
// widening of FP8 inputs.
#pragma once

#include <type_traits>

#include "common/float8.h"
#include "cuda/simt_attention.cuh"
#include "cuda/widen_args.h"

namespace stria {
namespace cuda {

// Grid-stride loop over n items.
#define STRIA_FOR_EACH(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// Grid-stride loop over n rows of D values, a warp per row: the kernels that move [B, L, H, D]
// tensors split a row's index into (b, i, h) once per row rather than once per element (64-bit
// divisions by run-time values cost tens of instructions each, enough to make these
// memory-bound passes compute-bound), and a warp's lanes take consecutive columns, so its loads
// and stores coalesce. The launcher's blocks are whole warps (launch.cu, RowGrid).
#define STRIA_FOR_EACH_ROW(r, n)                                                                \
  for (int64_t r = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; r < (n); \
       r += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32))
#define STRIA_FOR_EACH_COLUMN(c, D) for (int c = lane_id(); c < (D); c += 32)

// Strided [B, L, H, D] -> compact [B, L, H, D] (same dtype, element size kEb bytes).
template <int kEb>
STRIA_GLOBAL void PackRowsKernel(Dims d, int H, RowsArg src, void* dst) {
  using U = typename std::conditional<kEb == 4, uint32_t, uint16_t>::type;
  STRIA_FOR_EACH_ROW(row, static_cast<int64_t>(d.B) * d.L * H) {
    const int64_t h = row % H, bi = row / H, i = bi % d.L, b = bi / d.L;
    const U* from = static_cast<const U*>(src.data) + b * src.sb + i * src.sl + h * src.sh;
    U* to = static_cast<U*>(dst) + row * d.D;
    STRIA_FOR_EACH_COLUMN(c, d.D) to[c] = from[c];
  }
}

[[maybe_unused]] static STRIA_GLOBAL void FillKernel(float* p, int64_t n, float v) {
  STRIA_FOR_EACH(x, n) p[x] = v;
}

[[maybe_unused]] static STRIA_GLOBAL void AccumulateKernel(float* dst, const float* src, int64_t n) {
  STRIA_FOR_EACH(x, n) dst[x] += src[x];
}

// out = acc / l in the caller's dtype and strides; lse = ln(l) + m ln 2, or -inf for a row that
// saw no key (its output is 0). lse is [B, Hq, L] float32 with strides (lb, lh, li).
template <typename T>
STRIA_GLOBAL void ForwardFinishKernel(Dims d, const float* acc, const float* m, const float* l, RowsOut out, float* lse,
                                      int64_t lb, int64_t lh, int64_t li) {
  STRIA_FOR_EACH_ROW(row, static_cast<int64_t>(d.B) * d.Hq * d.L) {
    const int64_t i = row % d.L, bh = row / d.L, h = bh % d.Hq, b = bh / d.Hq;
    const float scale = OutputScale(l[row]);
    const int64_t at = b * out.sb + i * out.sl + h * out.sh;
    STRIA_FOR_EACH_COLUMN(c, d.D) StoreElem<T>(out.data, at + c, acc[row * d.D + c] * scale);
    if (lane_id() == 0) lse[b * lb + h * lh + i * li] = RowLse(m[row], l[row]);
  }
}

// Per query row: delta = rowsum(dO * O) and lse2 = lse * log2(e) (+inf for a row with no key, so
// that every p = exp2(s - lse2) of that row is 0). One warp per row.
template <typename T>
STRIA_GLOBAL void BackwardPrepKernel(Dims d, RowsArg out, RowsArg dout, const float* lse, int64_t lb, int64_t lh,
                                     int64_t li, float* lse2, float* delta) {
  const int64_t rows = static_cast<int64_t>(d.B) * d.Hq * d.L;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + warp_id(); row < rows; row += warps) {
    const int64_t i = row % d.L, bh = row / d.L, h = bh % d.Hq, b = bh / d.Hq;
    float s = 0.f;
    for (int c = lane_id(); c < d.D; c += 32)
      s += LoadElem<T>(out.data, b * out.sb + i * out.sl + h * out.sh + c) *
           LoadElem<T>(dout.data, b * dout.sb + i * dout.sl + h * dout.sh + c);
    s = WarpSum(s);
    if (lane_id() == 0) {
      const float v = lse[b * lb + h * lh + i * li];
      lse2[row] = v == NegInf() ? PosInf() : v * kLog2e;
      delta[row] = s;
    }
  }
}

// dq = dq_acc * scale from [B, Hq, L, D] fp32 into the caller's dtype and strides.
template <typename T>
STRIA_GLOBAL void DqFinishKernel(Dims d, const float* dq_acc, float scale, RowsOut dq) {
  STRIA_FOR_EACH_ROW(row, static_cast<int64_t>(d.B) * d.Hq * d.L) {
    const int64_t i = row % d.L, bh = row / d.L, h = bh % d.Hq, b = bh / d.Hq;
    const int64_t at = b * dq.sb + i * dq.sl + h * dq.sh;
    STRIA_FOR_EACH_COLUMN(c, d.D) StoreElem<T>(dq.data, at + c, dq_acc[row * d.D + c] * scale);
  }
}

// A compact [B, L, Hkv, D] fp32 gradient into the caller's dtype and strides.
template <typename T>
STRIA_GLOBAL void KvGradFinishKernel(Dims d, const float* src, RowsOut dst) {
  STRIA_FOR_EACH_ROW(row, static_cast<int64_t>(d.B) * d.L * d.Hkv) {
    const int64_t h = row % d.Hkv, bi = row / d.Hkv, i = bi % d.L, b = bi / d.L;
    const int64_t at = b * dst.sb + i * dst.sl + h * dst.sh;
    STRIA_FOR_EACH_COLUMN(c, d.D) StoreElem<T>(dst.data, at + c, src[row * d.D + c]);
  }
}

// Attention sinks after the forward (stria.h, params->sinks): row (b, h, i) folds head h's logit z
// into its softmax denominator, lse' = log(e^lse + e^z), out *= e^(lse - lse'); a row that saw no
// key keeps out 0 and gets lse' = z, and a NaN logit or LSE gives a NaN row. One warp per row.
template <typename T>
STRIA_GLOBAL void SinksForwardKernel(Dims d, const float* sinks, RowsOut out, float* lse, int64_t lb, int64_t lh,
                                     int64_t li) {
  STRIA_FOR_EACH_ROW(row, static_cast<int64_t>(d.B) * d.Hq * d.L) {
    const int64_t i = row % d.L, bh = row / d.L, h = bh % d.Hq, b = bh / d.Hq;
    float* lp = lse + b * lb + h * lh + i * li;
    const float l = *lp, z = sinks[h];
    float merged = NaN(), keep = NaN();
    if (z == z && l == l) {
      const float hi = l > z ? l : z, lo = l > z ? z : l;
      merged = hi == NegInf() ? NegInf() : hi + log1pf(expf(lo - hi));
      keep = l == NegInf() ? 0.f : expf(l - merged);
    }
    const int64_t at = b * out.sb + i * out.sl + h * out.sh;
    STRIA_FOR_EACH_COLUMN(c, d.D) StoreElem<T>(out.data, at + c, LoadElem<T>(out.data, at + c) * keep);
    warp_sync();  // every lane has read the row's LSE before lane 0 replaces it
    if (lane_id() == 0) *lp = merged;
  }
}

// The sinks' gradient over this rank's rows: dsinks[h] = -sum over b, i of e^(z_h - lse) * delta,
// from the backward's per-row lse2 = lse * log2(e) (+inf for a row with no key and no sink) and
// delta = rowsum(dO * O). One warp per head, lanes over the rows in a fixed order and a shuffle
// tree: the same bits every run.
[[maybe_unused]] static STRIA_GLOBAL void SinksGradKernel(Dims d, const float* sinks, const float* lse2,
                                                          const float* delta, float* dsinks, int64_t ds) {
  const int64_t h = blockIdx.x;
  const float z2 = sinks[h] * kLog2e;
  float sum = 0.f;
  for (int64_t r = lane_id(); r < static_cast<int64_t>(d.B) * d.L; r += 32) {
    const int64_t b = r / d.L, i = r % d.L, row = (b * d.Hq + h) * d.L + i;
    if (lse2[row] != PosInf()) sum += exp2f(z2 - lse2[row]) * delta[row];
  }
  sum = WarpSum(sum);
  if (lane_id() == 0) dsinks[h * ds] = -sum;
}

// Shard/unshard: one element per thread over the local tensor; along seq_dim, local index i maps
// to the global position of the layout (DESIGN.md).

// The device-side twin of GlobalPosition (src/layout/layout.cc), which host code cannot share with
// a kernel; test_attention_kernels_emu checks the two agree through the shard kernel.
STRIA_HD int64_t LayoutPosition(int layout, int64_t L, int world, int rank, int64_t i) {
  if (layout == 0) return rank * L + i;      // contiguous
  if (layout == 1) return i * world + rank;  // striped
  const int64_t C = L / 2;                   // zigzag
  return i < C ? rank * C + i : (2 * world - 1 - rank) * C + (i - C);
}

[[maybe_unused]] static STRIA_GLOBAL void ShardKernel(ShardArgs a) {
  int64_t n = 1;
  for (int k = 0; k < a.ndim; ++k) n *= a.shape[k];
  STRIA_FOR_EACH(x, n) {
    int64_t rest = x, lo = 0, fo = 0;
    for (int k = a.ndim - 1; k >= 0; --k) {
      const int64_t idx = rest % a.shape[k];
      rest /= a.shape[k];
      lo += idx * a.local_strides[k];
      fo += (k == a.seq_dim ? LayoutPosition(a.layout, a.L, a.world, a.rank, idx) : idx) * a.full_strides[k];
    }
    char* l = a.local + lo * a.elem_bytes;
    char* f = a.full + fo * a.elem_bytes;
    char* dst = a.to_local ? l : f;
    const char* src = a.to_local ? f : l;
    for (int bIdx = 0; bIdx < a.elem_bytes; ++bIdx) dst[bIdx] = src[bIdx];
  }
}

// BoxArgs: a warp per row of the region, the sources added in float32 in their order and rounded
// once.
template <typename T>
STRIA_GLOBAL void BoxSumKernel(BoxArgs a) {
  STRIA_FOR_EACH_ROW(row, a.n0 * a.n1 * a.n2) {
    const int64_t i2 = row % a.n2, r1 = row / a.n2, i1 = r1 % a.n1, i0 = r1 / a.n1;
    const int64_t from = i0 * a.ss0 + i1 * a.ss1 + i2 * a.ss2, to = i0 * a.ds0 + i1 * a.ds1 + i2 * a.ds2;
    STRIA_FOR_EACH_COLUMN(c, a.w) {
      float acc = 0.f;
      for (int k = 0; k < a.count; ++k) acc += LoadElem<T>(a.src, from + k * a.src_step + c);
      StoreElem<T>(a.dst, to + c, acc);
    }
  }
}

// WidenArgs: a warp per row (b, i, h), the descale read once per row.
template <typename T>
STRIA_GLOBAL void WidenFp8Kernel(WidenArgs a) {
  STRIA_FOR_EACH_ROW(row, a.n0 * a.n1 * a.n2) {
    const int64_t i2 = row % a.n2, r1 = row / a.n2, i1 = r1 % a.n1, i0 = r1 / a.n1;
    const unsigned char* from = a.src + i0 * a.ss0 + i1 * a.ss1 + i2 * a.ss2;
    const float scale = a.descale != nullptr ? a.descale[i2 * a.descale_step] : 1.f;
    STRIA_FOR_EACH_COLUMN(c, a.w) StoreElem<T>(a.dst, row * a.w + c, Float8E4M3ToF32(from[c]) * scale);
  }
}

// A forward's outputs on FP8 inputs from units of v's codes to values (tma_forward_fp8.cuh): row
// (b, i, h) times the descale of h's K/V head, descale[hk * step] (step 0: one value for all).
template <typename T>
STRIA_GLOBAL void ScaleRowsByHeadKernel(Dims d, const float* descale, int step, RowsOut out) {
  STRIA_FOR_EACH_ROW(row, static_cast<int64_t>(d.B) * d.L * d.Hq) {
    const int64_t h = row % d.Hq, bi = row / d.Hq, i = bi % d.L, b = bi / d.L;
    const float scale = descale[(h / (d.Hq / d.Hkv)) * step];
    const int64_t at = b * out.sb + i * out.sl + h * out.sh;
    STRIA_FOR_EACH_COLUMN(c, d.D) StoreElem<T>(out.data, at + c, LoadElem<T>(out.data, at + c) * scale);
  }
}

}  // namespace cuda
}  // namespace stria
