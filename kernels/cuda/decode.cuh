// Decode over a sharded KV cache on the GPU: a few query rows per sequence (the new tokens times
// the query heads of one K/V head) against this rank's share of the cache, read in place.
//
// Decode reads every cached key once and does little arithmetic per byte, so the kernel is built
// around the reads: the rank's keys are cut into work items of about equal length (the split of
// flash-decoding, planned on the host), a CTA takes one item for one K/V head and a chunk of the
// query rows of that head's GQA group, so that all of the group's rows share each key tile it
// loads. A key tile is converted to float32 in shared memory once; the scores, the online softmax
// and the products with V run on CUDA cores. The items' states are then merged per sequence, in
// item order (DecodeMergeKernel), so the result does not depend on the order the CTAs ran in.
#pragma once

#include <cstring>
#include <type_traits>

#include "cuda/decode_params.h"
#include "cuda/decode_span.cuh"
#include "cuda/device_api.cuh"
#include "cuda/elem_access.cuh"
#include "cuda/softcap.cuh"
#include "cuda/tile_mask.cuh"
#include "cuda/warp_reduce.cuh"

namespace stria {
namespace cuda {

constexpr int kDecodeThreads = 128;
constexpr int kDecodeTileFloats = 4096;  // a K (and a V) tile in shared memory: up to 64 keys
constexpr int kDecodeMaxKeys = 64;
// A thread's share of the rows' output accumulators, for head dims up to max_d: DecodeKernel has
// a build for 256 and one for kDecodeMaxHeadDim, so that the usual head dims keep their registers.
STRIA_HD constexpr int DecodeAccPerThread(int max_d) {
  return kDecodeRows * max_d / kDecodeThreads;
}

// Keys per tile at head dim D.
STRIA_HD int DecodeTileKeys(int D) {
  const int k = kDecodeTileFloats / D;
  return k < 1 ? 1 : k > kDecodeMaxKeys ? kDecodeMaxKeys : k;
}
// Dynamic shared memory of DecodeKernel at head dim D. The K tile's rows are D + 1 floats apart:
// the scores' threads read one column of it across consecutive keys, which a stride of D (a
// multiple of 32 at the usual head dims) would put in one bank.
STRIA_HD int DecodeSmemBytes(int D) {
  const int kt = DecodeTileKeys(D);
  return (kDecodeRows * D + kt * (D + 1) + kt * D + kDecodeRows * kDecodeMaxKeys + 3 * kDecodeRows) * 4 +
         kDecodeRows * 8;
}

// Eight 16-bit values at p (16-byte aligned) as floats: one 16-byte load on the GPU.
template <typename T>
STRIA_DEVICE void LoadEight(const char* p, float* out) {
  struct alignas(16) Chunk {
    uint32_t w[4];
  };
  Chunk c;
#if defined(STRIA_CUDA_EMULATE)
  std::memcpy(&c, p, sizeof c);
#else
  c = *reinterpret_cast<const Chunk*>(p);
#endif
  for (int i = 0; i < 8; ++i) out[i] = to_float<T>(static_cast<uint16_t>(c.w[i / 2] >> (16 * (i % 2))));
}

template <typename T, int kMaxD = 256>
STRIA_GLOBAL void DecodeKernel(DecodeArgs a) {
  constexpr int kDecodeAccPerThread = DecodeAccPerThread(kMaxD);
  STRIA_DYNAMIC_SMEM(smem);
  const int D = a.D, kt = DecodeTileKeys(D), group = a.Hq / a.Hkv, rows = a.T * group;
  const int64_t item_index = blockIdx.x;
  const int hkv = static_cast<int>(blockIdx.y), r0 = static_cast<int>(blockIdx.z) * kDecodeRows;
  const int nr = rows - r0 < kDecodeRows ? rows - r0 : kDecodeRows;
  const DecodeItem item = a.items[item_index];
  const int tid = static_cast<int>(threadIdx.x);

  float* qs = reinterpret_cast<float*>(smem);  // [kDecodeRows][D]
  float* ks = qs + kDecodeRows * D;            // [kt][D]
  float* vs = ks + kt * (D + 1);               // [kt][D]
  float* ss = vs + kt * D;                     // [kDecodeRows][kDecodeMaxKeys]: scores, then weights
  float* m = ss + kDecodeRows * kDecodeMaxKeys;
  float* l = m + kDecodeRows;
  float* alpha = l + kDecodeRows;
  int64_t* qpos = reinterpret_cast<int64_t*>(alpha + kDecodeRows);

  for (int x = tid; x < nr * D; x += kDecodeThreads) {
    const int r = x / D, d = x % D, row = r0 + r;
    const int t = row / group, h = hkv * group + row % group;
    qs[x] = LoadElem<T>(a.q, item.b * a.qb + t * a.qt + h * a.qh + d);
  }
  if (tid < kDecodeRows) {
    m[tid] = NegInf();
    l[tid] = 0.f;
    qpos[tid] = tid < nr ? a.q_pos[item.b * a.T + (r0 + tid) / group] : 0;
  }
  float acc[kDecodeAccPerThread];  // unrolled loops: static indices keep it in registers
  STRIA_UNROLL
  for (int i = 0; i < kDecodeAccPerThread; ++i) acc[i] = 0.f;
  block_sync();
  DecodeSpan span{qpos[0], qpos[0]};
  for (int r = 1; r < nr; ++r) {
    span.q_first = qpos[r] < span.q_first ? qpos[r] : span.q_first;
    span.q_last = qpos[r] > span.q_last ? qpos[r] : span.q_last;
  }

  for (int64_t p = item.first; p < item.last; ++p) {
    const DecodePiece piece = a.pieces[p];
    const char* kbase = piece.k + hkv * piece.k_head;
    const char* vbase = piece.v + hkv * piece.v_head;
    for (int64_t j0 = 0; j0 < piece.count; j0 += kt) {
      const int nk = piece.count - j0 < kt ? static_cast<int>(piece.count - j0) : kt;
      const int64_t pos_first = piece.pos0 + j0 * piece.pos_stride;
      // The keys some row sees (the same bounds in every thread: a uniform skip when none).
      int jlo, jhi;
      span.SeenKeys(a, pos_first, piece.pos_stride, nk, &jlo, &jhi);
      if (jlo >= jhi) continue;
      bool loaded = false;
      if constexpr (ElemBytes<T>() == 2) {
        if (piece.rows16) {
          // 16-bit rows of whole 16-byte chunks (DecodePiece::rows16): eight elements per load.
          const int chunks = D / 8;
          for (int x = tid; x < nk * chunks; x += kDecodeThreads) {
            const int j = x / chunks, c = x % chunks;
            LoadEight<T>(kbase + (j0 + j) * piece.k_row + c * 16, ks + j * (D + 1) + c * 8);
            LoadEight<T>(vbase + (j0 + j) * piece.v_row + c * 16, vs + j * D + c * 8);
          }
          loaded = true;
        }
      }
      if (!loaded) {
        for (int x = tid; x < nk * D; x += kDecodeThreads) {
          const int j = x / D, d = x % D;
          ks[j * (D + 1) + d] = LoadElem<T>(kbase + (j0 + j) * piece.k_row, d);
          vs[x] = LoadElem<T>(vbase + (j0 + j) * piece.v_row, d);
        }
      }
      block_sync();
      for (int x = tid; x < nr * kDecodeMaxKeys; x += kDecodeThreads) {
        const int r = x / kDecodeMaxKeys, j = x % kDecodeMaxKeys;
        float s = NegInf();
        if (j < nk) {
          const int64_t kpos = pos_first + j * piece.pos_stride;
          const bool hidden = (a.causal && kpos > qpos[r]) || (a.window_left >= 0 && qpos[r] - kpos > a.window_left);
          if (!hidden) {
            float dot = 0.f;
            for (int d = 0; d < D; ++d) dot += qs[r * D + d] * ks[j * (D + 1) + d];
            s = Log2Score(dot, a.scale_log2, a.softcap);
          }
        }
        ss[x] = s;
      }
      block_sync();
      // The online softmax, a warp per row. A NaN score reaches the row's state (NaN never
      // passes): fmaxf passes over NaN, so the warp looks for one.
      for (int r = warp_id(); r < nr; r += kDecodeThreads / 32) {
        float* sr = ss + r * kDecodeMaxKeys;
        const float s0 = sr[lane_id()], s1 = sr[lane_id() + 32];
        float mx = WarpMax(fmaxf(s0, s1));
        const float nan = WarpMax((s0 != s0 || s1 != s1) ? 1.f : 0.f);
        if (nan > 0.f) mx = NaN();
        const float m_old = m[r];
        const float m_new = (mx != mx || m_old != m_old) ? NaN() : fmaxf(m_old, mx);
        float c = 1.f, p0 = 0.f, p1 = 0.f;
        if (m_new != NegInf()) {
          c = m_old == NegInf() ? 0.f : fast_exp2(m_old - m_new);
          p0 = fast_exp2(s0 - m_new);
          p1 = fast_exp2(s1 - m_new);
        }
        sr[lane_id()] = p0;
        sr[lane_id() + 32] = p1;
        const float sum = WarpSum(p0 + p1);
        warp_sync();
        if (lane_id() == 0) {
          m[r] = m_new;
          l[r] = l[r] * c + sum;
          alpha[r] = c;
        }
      }
      block_sync();
      STRIA_UNROLL
      for (int i = 0; i < kDecodeAccPerThread; ++i) {
        const int x = tid + i * kDecodeThreads;
        if (x >= nr * D) break;
        const int r = x / D, d = x % D;
        float o = acc[i] * alpha[r];
        const float* pr = ss + r * kDecodeMaxKeys;
        // Only the keys some row sees: another's probability is 0, and 0 times an infinite V is NaN.
        for (int j = jlo; j < jhi; ++j) o += pr[j] * vs[j * D + d];
        acc[i] = o;
      }
      block_sync();  // the next tile overwrites ks, vs and ss
    }
  }
  float* st = a.states + ((item_index * a.Hkv + hkv) * rows + r0) * static_cast<int64_t>(D + 2);
  STRIA_UNROLL
  for (int i = 0; i < kDecodeAccPerThread; ++i) {
    const int x = tid + i * kDecodeThreads;
    if (x >= nr * D) break;
    const int r = x / D, d = x % D;
    st[r * static_cast<int64_t>(D + 2) + 2 + d] = acc[i];
  }
  if (tid < nr) {
    st[tid * static_cast<int64_t>(D + 2)] = m[tid];
    st[tid * static_cast<int64_t>(D + 2) + 1] = l[tid];
  }
}

// Row r of K/V head hkv (its GQA group's query heads times the new tokens) over work items
// [i0, i1) of its sequence: the items' largest running maximum (log2 domain; NaN if any state is
// NaN, -inf if no item saw a key) and their sums rescaled to it, added in item order.
STRIA_DEVICE void ItemsMaxAndSum(const DecodeMergeArgs& a, int64_t i0, int64_t i1, int hkv, int r, float* mx_out,
                                 float* total_out) {
  const int rows = a.T * (a.Hq / a.Hkv);
  const int64_t stride = a.D + 2;
  const float neg_inf = NegInf();
  float mx = neg_inf;
  bool nan = false;
  for (int64_t i = i0; i < i1; ++i) {
    const float mi = a.states[((i * a.Hkv + hkv) * rows + r) * stride];
    nan |= mi != mi;
    mx = fmaxf(mx, mi);
  }
  if (nan) mx = NaN();
  float total = 0.f;
  if (mx != neg_inf) {
    for (int64_t i = i0; i < i1; ++i) {
      const float* st = a.states + ((i * a.Hkv + hkv) * rows + r) * stride;
      if (st[0] == neg_inf) continue;
      total += st[1] * fast_exp2(st[0] - mx);
    }
  }
  *mx_out = mx;
  *total_out = total;
}

// Output d of that row, unnormalised, rescaled to the items' maximum mx (not -inf).
STRIA_DEVICE float ItemsOutput(const DecodeMergeArgs& a, int64_t i0, int64_t i1, int hkv, int r, float mx, int d) {
  const int rows = a.T * (a.Hq / a.Hkv);
  const int64_t stride = a.D + 2;
  float o = 0.f;
  for (int64_t i = i0; i < i1; ++i) {
    const float* st = a.states + ((i * a.Hkv + hkv) * rows + r) * stride;
    if (st[0] == NegInf()) continue;
    o += st[2 + d] * fast_exp2(st[0] - mx);
  }
  return o;
}

// The row a warp of the items' merge takes: warp w is row r of K/V head hkv of sequence b (query
// token t, head h).
struct ItemRow {
  int64_t b;
  int hkv, r, t, h;
};
STRIA_DEVICE ItemRow ItemRowOf(const DecodeMergeArgs& a, int64_t w) {
  const int group = a.Hq / a.Hkv, rows = a.T * group;
  ItemRow x;
  x.r = static_cast<int>(w % rows);
  x.hkv = static_cast<int>(w / rows % a.Hkv);
  x.b = w / rows / a.Hkv;
  x.t = x.r / group;
  x.h = x.hkv * group + x.r % group;
  return x;
}

// A warp per (b, K/V head, row): the sequence's items merged in order into the row's partial
// record (outputs normalised over this rank's keys, natural-log LSE; zeros and -inf: no key).
STRIA_GLOBAL void DecodeMergeKernel(DecodeMergeArgs a) {
  const float neg_inf = NegInf();
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       w < static_cast<int64_t>(a.B) * a.T * a.Hq; w += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const ItemRow x = ItemRowOf(a, w);
    const int hkv = x.hkv, r = x.r;
    float* out = a.partial + ((x.b * a.T + x.t) * a.Hq + x.h) * static_cast<int64_t>(a.D + 1);
    const int64_t i0 = a.first_item[x.b], i1 = a.first_item[x.b + 1];
    float mx, total;
    ItemsMaxAndSum(a, i0, i1, hkv, r, &mx, &total);
    if (mx == neg_inf) {
      for (int d = lane_id(); d < a.D; d += 32) out[d] = 0.f;
      if (lane_id() == 0) out[a.D] = neg_inf;
      continue;
    }
    const float inv = 1.f / total;
    for (int d = lane_id(); d < a.D; d += 32) out[d] = ItemsOutput(a, i0, i1, hkv, r, mx, d) * inv;
    if (lane_id() == 0) out[a.D] = (mx + log2f(total)) * 0.6931471805599453f;
  }
}

// A world of one on the device: the items merged as DecodeMergeKernel does, with the sink, straight
// into the call's out and lse (f's outputs; f.partial and f.world unused), so that the rank's
// records are never written and read back. The sink as MergeDecodeRecord merges it: a row that
// sees no key takes the sink's LSE and a zero row; NaN stays.
template <typename T>
STRIA_GLOBAL void DecodeMergeFinishKernel(DecodeMergeArgs a, DecodeFinishArgs f) {
  const float neg_inf = NegInf();
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       w < static_cast<int64_t>(a.B) * a.T * a.Hq; w += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const ItemRow x = ItemRowOf(a, w);
    const int hkv = x.hkv, r = x.r, h = x.h;
    const int64_t b = x.b, t = x.t;
    const int64_t i0 = a.first_item[b], i1 = a.first_item[b + 1];
    float mx, total;
    ItemsMaxAndSum(a, i0, i1, hkv, r, &mx, &total);
    const bool seen = mx != neg_inf;
    float lse = seen ? (mx + log2f(total)) * 0.6931471805599453f : neg_inf, scale = seen ? 1.f / total : 0.f;
    if (f.sinks != nullptr && lse == lse) {
      const float z = f.sinks[h * f.sinks_stride];
      if (!seen) {
        lse = z;
      } else {
        const float top = fmaxf(lse, z);
        const float merged = top + logf(expf(lse - top) + expf(z - top));
        scale *= expf(lse - merged);
        lse = merged;
      }
    }
    const int64_t row = b * f.out_strides[0] + t * f.out_strides[1] + h * f.out_strides[2];
    for (int d = lane_id(); d < a.D; d += 32)
      StoreElem<T>(f.out, row + d * f.out_strides[3], seen ? ItemsOutput(a, i0, i1, hkv, r, mx, d) * scale : 0.f);
    if (lane_id() == 0 && f.lse != nullptr)
      f.lse[b * f.lse_strides[0] + h * f.lse_strides[1] + t * f.lse_strides[2]] = lse;
  }
}

// A warp per (b, t, h): every rank's record of the row merged, the sink with them, into the call's
// out and lse. The arithmetic is MergeDecodeRecord's (src/backend/decode_split.cc), in double and
// in rank order, so the device's merge and the host's agree to the last bits but for exp and log:
// shares weighted by e^(lse_r - max), a row that sees no key takes the sink's LSE and a zero row
// (with no sink: zeros and -inf), and a NaN in any rank's LSE makes the row NaN.
template <typename T>
STRIA_GLOBAL void DecodeFinishKernel(DecodeFinishArgs a) {
  constexpr int kMaxPerLane = kDecodeMaxHeadDim / 32;
  const double neg_inf = static_cast<double>(NegInf());
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
       w < static_cast<int64_t>(a.B) * a.T * a.Hq; w += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const int h = static_cast<int>(w % a.Hq);
    const int64_t bt = w / a.Hq, b = bt / a.T, t = bt % a.T;
    const float* rec = a.partial + w * (a.D + 1);
    double mx = neg_inf;
    bool nan = false;
    for (int r = 0; r < a.world; ++r) {
      const float x = rec[r * a.record_stride + a.D];
      nan |= x != x;
      mx = x > mx ? static_cast<double>(x) : mx;
    }
    double acc[kMaxPerLane];
    for (int i = 0; i < kMaxPerLane; ++i) acc[i] = 0.0;
    double total = 0.0;
    if (nan) {
      mx = static_cast<double>(NaN());
      for (int i = 0; i < kMaxPerLane; ++i) acc[i] = mx;
      total = 1.0;
    } else if (mx != neg_inf) {
      for (int r = 0; r < a.world; ++r) {
        const float* p = rec + r * a.record_stride;
        if (static_cast<double>(p[a.D]) == neg_inf) continue;
        const double c = exp(static_cast<double>(p[a.D]) - mx);
        total += c;
        STRIA_UNROLL
        for (int i = 0; i < kMaxPerLane; ++i) {
          const int d = lane_id() + 32 * i;
          if (d < a.D) acc[i] += c * static_cast<double>(p[d]);
        }
      }
    }
    double lse = total > 0.0 ? mx + log(total) : neg_inf;
    double scale = total > 0.0 ? 1.0 / total : 0.0;
    if (a.sinks != nullptr) {
      const double z = a.sinks[h * a.sinks_stride];
      if (total > 0.0) {
        const double top = lse > z ? lse : z;
        const double merged = top + log(exp(lse - top) + exp(z - top));
        scale *= exp(lse - merged);
        lse = merged;
      } else {
        lse = z;
      }
    }
    const int64_t row = b * a.out_strides[0] + t * a.out_strides[1] + h * a.out_strides[2];
    STRIA_UNROLL
    for (int i = 0; i < kMaxPerLane; ++i) {  // static indices: acc stays in registers
      const int d = lane_id() + 32 * i;
      if (d < a.D) StoreElem<T>(a.out, row + d * a.out_strides[3], static_cast<float>(acc[i] * scale));
    }
    if (lane_id() == 0 && a.lse != nullptr)
      a.lse[b * a.lse_strides[0] + h * a.lse_strides[1] + t * a.lse_strides[2]] = static_cast<float>(lse);
  }
}

// A warp per (entry, K/V head, K or V): D elements of kEb bytes.
template <int kEb>
STRIA_GLOBAL void StoreTokensKernel(const TokenCopy* copies, int64_t n, int Hkv, int D) {
  using U = typename std::conditional<kEb == 4, uint32_t, uint16_t>::type;
  for (int64_t w = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32; w < n * Hkv * 2;
       w += static_cast<int64_t>(gridDim.x) * (blockDim.x / 32)) {
    const int which = static_cast<int>(w % 2);
    const int h = static_cast<int>(w / 2 % Hkv);
    const TokenCopy c = copies[w / 2 / Hkv];
    const U* from = reinterpret_cast<const U*>(which == 0 ? c.k_src + h * c.k_src_head : c.v_src + h * c.v_src_head);
    U* to = reinterpret_cast<U*>(which == 0 ? c.k_dst + h * c.k_dst_head : c.v_dst + h * c.v_dst_head);
    for (int d = lane_id(); d < D; d += 32) to[d] = from[d];
  }
}

}  // namespace cuda
}  // namespace stria
