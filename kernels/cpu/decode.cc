// The decode kernel: a few query rows (the new tokens of one sequence, times the query heads of
// one K/V head) against a run of cached keys read straight from the cache, flash-decoding style:
// each work item returns its run's softmax state (row maximum, row sum, unnormalised output) and
// the backend merges the runs. Decode reads every cached key once per call, so the kernel converts
// each 64-key block to float32 once (into this thread's scratch) and reuses it for every row.
#include <cstring>

#include "cpu/softcap.h"

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

}  // namespace

void DecodeChunk(const DecodeChunkArgs& a) {
  const int64_t rows = a.rows, dp = a.dp, group = a.group;
  float* kbuf = a.scratch;                // [kDecodeKeys][dp]
  float* vbuf = kbuf + kDecodeKeys * dp;  // [kDecodeKeys][dp]
  float* sbuf = vbuf + kDecodeKeys * dp;  // [rows][kDecodeKeys]
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
    // Which keys of the block some row sees: the rows' positions bound them (causal: keys at or
    // before the row; window: keys no more than window_left behind it).
    for (int64_t j = 0; j < nk; ++j) {
      float* kr = kbuf + j * dp;
      float* vr = vbuf + j * dp;
      LoadRowF32(a.k + (j0 + j) * a.k_stride, a.dtype, a.d, 1.0f, kr);
      LoadRowF32(a.v + (j0 + j) * a.v_stride, a.dtype, a.d, 1.0f, vr);
      for (int64_t d = a.d; d < dp; ++d) kr[d] = vr[d] = 0.f;
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t qpos = a.q_pos[r / group];
      float* s = sbuf + r * kDecodeKeys;
      const float* q = a.q + r * dp;
      for (int64_t j = 0; j < nk; ++j) s[j] = Dot(q, kbuf + j * dp, dp);
      for (int64_t j = nk; j < kDecodeKeys; ++j) s[j] = kNegInf;
      if (a.softcap2 > 0.f) SoftcapRow<false>(s, kDecodeKeys, 1.0f, a.softcap2);
      for (int64_t j = 0; j < nk; ++j) {
        const int64_t kpos = pos0 + j * a.pos_stride;
        const bool hidden = (a.causal && kpos > qpos) || (a.window_left >= 0 && qpos - kpos > a.window_left);
        if (hidden) s[j] = kNegInf;
      }
      vf mv = Splat(kNegInf);
      for (int64_t j = 0; j < kDecodeKeys; j += VL) mv = Max(mv, Load(s + j));
      float bmax = HMax(mv);
      // A NaN score must reach the output (NaN never passes): Max passes NaN lanes over, so look.
      if (HasNaN(s, nk)) bmax = std::numeric_limits<float>::quiet_NaN();
      if (bmax == kNegInf) continue;                                     // the row sees no key of this block
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
      for (int64_t j = 0; j < nk; ++j) {
        const float p = s[j];
        if (p == 0.f) continue;
        const vf pv = Splat(p);
        const float* vr = vbuf + j * dp;
        for (int64_t d = 0; d < dp; d += VL) Store(acc + d, Load(acc + d) + pv * Load(vr + d));
      }
    }
  }
}

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
