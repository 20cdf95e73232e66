// The forward's running softmax state of a query row (m, l and the unnormalised output, fp32 in
// the backend's workspace: FwdParams) and how a tile kernel starts and ends it. The blocks of a
// ring call merge into the state one after the other. The call's first block starts the state
// empty instead of reading it (FwdParams::first: no workspace to clear beforehand), and its last
// block writes the normalised output and the LSE instead of the state (FwdParams::out: no
// finishing kernel afterwards). A world of one thus never touches the state in global memory,
// a round trip that was a visible part of a short call's fixed cost (docs/performance.md, the 4k
// bars). ForwardFinishKernel (elementwise.cuh) finishes the calls whose last
// block leaves rows to others (its mask does not cover every row), with the same arithmetic.
#pragma once

#include "cuda/device_api.cuh"
#include "cuda/elem_access.cuh"
#include "cuda/params.h"
#include "cuda/tile_mask.cuh"

namespace stria {
namespace cuda {

constexpr float kLn2 = 0.6931471805599453f;

// A finished row: output = acc * OutputScale(l), LSE = RowLse(m, l) (natural log); a row that saw
// no key (l = 0) gets output 0 and LSE -inf.
STRIA_HD float OutputScale(float l) {
  return l > 0.f ? 1.f / l : 0.f;
}
STRIA_DEVICE float RowLse(float m, float l) {
  return l > 0.f ? (m + log2f(l)) * kLn2 : NegInf();
}
// Where row i of (batch, head) bh writes its LSE and the first column of its output.
STRIA_DEVICE int64_t LseAt(const FwdParams& p, int bh, int64_t i) {
  return (bh / p.dims.Hq) * p.lb + (bh % p.dims.Hq) * p.lh + i * p.li;
}
STRIA_DEVICE int64_t OutAt(const FwdParams& p, int bh, int64_t i) {
  return (bh / p.dims.Hq) * p.out.sb + (bh % p.dims.Hq) * p.out.sh + i * p.out.sl;
}

// A row's running state, shared by the 4 lanes of an accumulator row (mma or wgmma): this lane
// holds the output columns 8 nt + 2 t4 and + 1 for every nt < D / 8, as pairs 4 floats apart
// from `o` (the C layout of consecutive n8 tiles). m is every lane's; l is stored complete, so
// one lane of the four starts with it and the others with 0. Rows outside the block (`live`
// false) start empty and are never written back; so do all rows of the call's first block.
// kEnds false: a kernel built for the blocks between the first and the last (MmaForwardKernel's
// second build), which ignores FwdParams::first and ::out.
template <int D, bool kEnds = true>
STRIA_DEVICE void LoadRowState(const FwdParams& p, int64_t sr, int t4, bool live, float* m, float* l, float* o) {
  const bool read = live && !(kEnds && p.first);
  *m = read ? p.m[sr] : NegInf();
  *l = read && t4 == 0 ? p.l[sr] : 0.f;
  STRIA_UNROLL
  for (int nt = 0; nt < D / 8; ++nt) {
    const float* src = p.acc + sr * D + nt * 8 + 2 * t4;
    o[4 * nt] = read ? src[0] : 0.f;
    o[4 * nt + 1] = read ? src[1] : 0.f;
  }
}

// The inverse, for row i of (batch, head) bh: the state, or with the call's last block the
// finished row. Every lane of the row must call it (the partial sums of l meet by shuffles).
template <typename T, int D, bool kEnds = true>
STRIA_DEVICE void StoreRowState(const FwdParams& p, int bh, int64_t i, int t4, bool live, float m, float l,
                                const float* o) {
  l += shfl_xor(l, 1);
  l += shfl_xor(l, 2);
  if (!live) return;
  if (kEnds && p.out.data != nullptr) {
    const float scale = OutputScale(l);
    if (t4 == 0) p.lse[LseAt(p, bh, i)] = RowLse(m, l);
    const int64_t at = OutAt(p, bh, i) + 2 * t4;
    STRIA_UNROLL
    for (int nt = 0; nt < D / 8; ++nt) {
      StoreElem<T>(p.out.data, at + nt * 8, o[4 * nt] * scale);
      StoreElem<T>(p.out.data, at + nt * 8 + 1, o[4 * nt + 1] * scale);
    }
    return;
  }
  const int64_t sr = static_cast<int64_t>(bh) * p.dims.L + i;
  if (t4 == 0) {
    p.m[sr] = m;
    p.l[sr] = l;
  }
  STRIA_UNROLL
  for (int nt = 0; nt < D / 8; ++nt) {
    float* dst = p.acc + sr * D + nt * 8 + 2 * t4;
    dst[0] = o[4 * nt];
    dst[1] = o[4 * nt + 1];
  }
}

// A CTA of `threads` threads whose query rows [i0, i0 + rows) of head bh see no key of the block
// (it returns before its first barrier) still owns those rows' state in the call's first and
// last blocks: it writes the empty state (first), or finishes the rows (last; from the empty
// state when the block is also the first). Each of the `threads` threads calls it with its own
// index `thread` among them (a persistent kernel's consumers: not the CTA's thread index).
template <typename T>
STRIA_DEVICE void IdleRows(const FwdParams& p, const MaskArgs& mask, int bh, int64_t i0, int rows, int thread,
                           int threads) {
  if (!p.first && p.out.data == nullptr) return;  // the state stays as it is
  const int D = p.dims.D;
  const int64_t lo = MaxI(i0, mask.q_begin), hi = MinI(MinI(i0 + rows, mask.q_end), p.dims.L);
  for (int64_t x = thread; x < (hi - lo) * D; x += threads) {
    const int64_t i = lo + x / D, sr = static_cast<int64_t>(bh) * p.dims.L + i;
    const int c = static_cast<int>(x % D);
    if (p.out.data == nullptr) {
      p.acc[sr * D + c] = 0.f;
      if (c == 0) {
        p.m[sr] = NegInf();
        p.l[sr] = 0.f;
      }
      continue;
    }
    const float l = p.first ? 0.f : p.l[sr];
    StoreElem<T>(p.out.data, OutAt(p, bh, i) + c, p.first ? 0.f : p.acc[sr * D + c] * OutputScale(l));
    if (c == 0) p.lse[LseAt(p, bh, i)] = p.first ? NegInf() : RowLse(p.m[sr], l);
  }
}
// Every thread of the CTA.
template <typename T>
STRIA_DEVICE void IdleRows(const FwdParams& p, const MaskArgs& mask, int bh, int64_t i0, int rows, int threads) {
  IdleRows<T>(p, mask, bh, i0, rows, static_cast<int>(threadIdx.x), threads);
}

}  // namespace cuda
}  // namespace stria
