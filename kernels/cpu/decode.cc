// The decode kernel: a few query rows (the new tokens of one sequence, times the query heads of
// one K/V head) against a run of cached keys read straight from the cache, flash-decoding style:
// each work item returns its run's softmax state (row maximum, row sum, unnormalised output) and
// the backend merges the runs. Decode reads every cached key once per call, so the kernel converts
// each 64-key block to float32 once (into this thread's scratch) and reuses it for every row: the
// block's P·V is one register-blocked product over all the rows (gemm.h), and so are its scores
// where the rows are many enough to pay for transposing K's block (a prefill's new tokens).
#include <cstring>

#include "cpu/gemm.h"
#include "cpu/softcap.h"
#include "cpu/transpose.h"

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {

void LoadRowF32(const void* src, int dtype, int64_t n, float mul, float* dst);  // pack.cc

namespace {

// Dot product of two rows of Dp floats (Dp a multiple of VL), four accumulators deep so that the
// FMAs of a row do not wait on each other.
inline float Dot(const float* a, const float* b, int64_t dp) {
  vf s0{}, s1{}, s2{}, s3{};
  int64_t d = 0;
  for (; d + 4 * VL <= dp; d += 4 * VL) {
    s0 += Load(a + d) * Load(b + d);
    s1 += Load(a + d + VL) * Load(b + d + VL);
    s2 += Load(a + d + 2 * VL) * Load(b + d + 2 * VL);
    s3 += Load(a + d + 3 * VL) * Load(b + d + 3 * VL);
  }
  for (; d < dp; d += VL) s0 += Load(a + d) * Load(b + d);
  return HSum((s0 + s1) + (s2 + s3));
}

// From this many rows on, a block's scores are one register-blocked product with K's block
// transposed (its transposition paid once for every row); below, each score is a dot product
// against K's rows as they were converted, which needs no transposition but a horizontal sum
// per score. Measured on an Intel Xeon (AVX-512, D 128, 16k keys): 16 rows took 25 ms by dot
// products and 30 by the product, 64 rows 64 and 49. A decode step's rows are the query heads of
// a K/V head (4 to 8 in the GQA models); a prefill's are its new tokens times those.
constexpr int64_t kGemmScoreRows = 32;

// Rows [0, n) of `dst` ([kDecodeKeys][dp]) from keys of `src`, converted to float32 and
// zero-padded to dp; the rows from n to `zero_to` zeroed.
inline void LoadKeyRows(const char* src, int64_t stride, int dtype, int64_t n, int64_t d, int64_t dp, int64_t zero_to,
                        float* dst) {
  for (int64_t j = 0; j < n; ++j) {
    float* row = dst + j * dp;
    LoadRowF32(src + j * stride, dtype, d, 1.0f, row);
    std::fill(row + d, row + dp, 0.f);
  }
  std::fill(dst + n * dp, dst + zero_to * dp, 0.f);
}

}  // namespace

void DecodeChunk(const DecodeChunkArgs& a) {
  const int64_t rows = a.rows, dp = a.dp, group = a.group;
  float* kbuf = a.scratch;                // [kDecodeKeys][dp] K's rows, or Kᵀ: [dp][kDecodeKeys]
  float* vbuf = kbuf + kDecodeKeys * dp;  // [kDecodeKeys][dp] V's rows (first K's, to transpose)
  float* sbuf = vbuf + kDecodeKeys * dp;  // [rows][kDecodeKeys] scores, then probabilities
  const bool gemm_scores = rows >= kGemmScoreRows;
  for (int64_t r = 0; a.init && r < rows; ++r) {
    a.m[r] = kNegInf;
    a.l[r] = 0.f;
    std::memset(a.acc + r * dp, 0, static_cast<size_t>(dp) * sizeof(float));
  }
  // The rows' positions bound the keys any of them sees: none past the last row's (causal), none
  // more than window_left before the first row's. Keys come in increasing positions, so a block
  // past the first bound ends the run and a block before the second is skipped.
  int64_t q_first = a.q_pos[0], q_last = a.q_pos[0];
  for (int64_t t = 1; t < (rows + group - 1) / group; ++t) {
    q_first = std::min(q_first, a.q_pos[t]);
    q_last = std::max(q_last, a.q_pos[t]);
  }
  for (int64_t j0 = 0; j0 < a.count; j0 += kDecodeKeys) {
    const int64_t nk = std::min(kDecodeKeys, a.count - j0);
    const int64_t pos0 = a.pos0 + j0 * a.pos_stride;
    if (a.causal && pos0 > q_last) break;
    if (a.window_left >= 0 && pos0 + (nk - 1) * a.pos_stride < q_first - a.window_left) continue;
    // Keys past the last row's position are hidden from every row: the products stop at the last
    // key some row may see (whole vectors of scores: the columns up to ncols_v are computed).
    const int64_t ncols = a.causal ? std::min(nk, (q_last - pos0) / a.pos_stride + 1) : nk;
    const int64_t ncols_v = (ncols + VL - 1) / VL * VL;
    // K's and V's rows of the block in float32: converted here, or as the backend staged them.
    const float* krows = a.k32 != nullptr ? a.k32 + j0 * dp : nullptr;
    if (gemm_scores) {
      if (krows == nullptr) {
        LoadKeyRows(a.k + j0 * a.k_stride, a.k_stride, a.dtype, ncols, a.d, dp, kDecodeKeys, vbuf);
      } else {
        std::copy(krows, krows + ncols * dp, vbuf);
        std::fill(vbuf + ncols * dp, vbuf + kDecodeKeys * dp, 0.f);
      }
      BlockedTranspose(vbuf, dp, kbuf);
      GemmAnyRows<false>(rows, ncols_v, dp, a.q, dp, 1, kbuf, kDecodeKeys, sbuf, kDecodeKeys);
    } else {
      if (krows == nullptr) {
        LoadKeyRows(a.k + j0 * a.k_stride, a.k_stride, a.dtype, ncols, a.d, dp, ncols, kbuf);
        krows = kbuf;
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < ncols; ++j) sbuf[r * kDecodeKeys + j] = Dot(a.q + r * dp, krows + j * dp, dp);
    }
    const float* vrows = a.v32 != nullptr ? a.v32 + j0 * dp : vbuf;
    if (a.v32 == nullptr) LoadKeyRows(a.v + j0 * a.v_stride, a.v_stride, a.dtype, ncols, a.d, dp, ncols, vbuf);
    // The keys some row sees, [kmin, kmax): the product below takes only those, so that a key no
    // row sees never reaches a row through a probability of 0 (0 times an infinite V is NaN).
    int64_t kmin = ncols, kmax = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t qpos = a.q_pos[r / group];
      float* s = sbuf + r * kDecodeKeys;
      for (int64_t j = ncols; j < kDecodeKeys; ++j) s[j] = kNegInf;
      if (a.softcap2 > 0.f) SoftcapRow<false>(s, kDecodeKeys, 1.0f, a.softcap2);
      // Which keys of the block the row sees, [jlo, jhi): causal, keys at or before it; a window,
      // keys no more than window_left behind it. Positions grow with j, so both are one bound.
      int64_t jlo = 0, jhi = ncols;
      if (a.causal) jhi = qpos < pos0 ? 0 : std::min(ncols, (qpos - pos0) / a.pos_stride + 1);
      if (a.window_left >= 0 && qpos - a.window_left > pos0)
        jlo = std::min(jhi, (qpos - a.window_left - pos0 + a.pos_stride - 1) / a.pos_stride);
      std::fill(s, s + jlo, kNegInf);
      std::fill(s + jhi, s + ncols, kNegInf);
      if (jlo < jhi) {
        kmin = std::min(kmin, jlo);
        kmax = std::max(kmax, jhi);
      }
      vf mv = Splat(kNegInf);
      for (int64_t j = 0; j < kDecodeKeys; j += VL) mv = Max(mv, Load(s + j));
      float bmax = HMax(mv);
      // A NaN score must reach the output (NaN never passes): Max passes NaN lanes over, so look.
      if (HasNaN(s, ncols)) bmax = std::numeric_limits<float>::quiet_NaN();
      if (bmax == kNegInf) {  // the row sees no key of this block: it adds nothing to P·V
        std::fill(s, s + ncols_v, 0.f);
        continue;
      }
      const float m_new = bmax != bmax ? bmax : std::max(a.m[r], bmax);  // a NaN running max stays NaN
      float* acc = a.acc + r * dp;
      if (a.m[r] != kNegInf && a.m[r] != m_new) {
        const float c = std::exp2(a.m[r] - m_new);
        a.l[r] *= c;
        const vf cv = Splat(c);
        for (int64_t d = 0; d < dp; d += VL) Store(acc + d, Load(acc + d) * cv);
      }
      a.m[r] = m_new;
      const vf mn = Splat(m_new);
      vf lsum{};
      for (int64_t j = 0; j < kDecodeKeys; j += VL) {
        const vf p = Exp2(Load(s + j) - mn);
        Store(s + j, p);
        lsum += p;
      }
      a.l[r] += HSum(lsum);
    }
    // O += P·V over the keys some row sees, every row in one product (a key hidden from one row
    // but seen by another has probability 0 in the first: a decode step's rows share their keys,
    // and a prefill's rows see as the ring's tiles do, whose products take a row group's range).
    if (kmin < kmax)
      GemmAnyRows<true>(rows, dp, kmax - kmin, sbuf + kmin, kDecodeKeys, 1, vrows + kmin * dp, dp, a.acc, dp);
  }
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
