// Flash-style attention tiles for the CPU, written once with GCC vector extensions and compiled
// per instruction set (kernels/CMakeLists.txt): the same source gives 4-, 8- and 16-float vectors.
//
// The hot loops are small register-blocked GEMMs, C[MR x NV*VL] (+)= A·B, with A read as
// broadcast scalars through two strides (so Aᵀ costs nothing) and B as contiguous vectors. Every
// product of attention is one of those once K (and V for the backward) is stored transposed per
// tile: S = Q·Kᵀ, O += P·V, dV += Pᵀ·dO, dP = dO·Vᵀ, dQ += dS·K, dK += dSᵀ·Q.
// Softmax runs in the log2 domain (Q is pre-scaled by log2 e) so each exponential is one exp2.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "cpu/attention_kernels.h"

#if defined(STRIA_ISA_avx512)
#include <immintrin.h>
#endif

// Micro-tile: MR rows x NV vectors of accumulators. AVX-512 takes 4 x 4 (16 of its 32 registers):
// per k step 4 vector loads and 4 broadcasts feed 16 FMAs, where 8 x 2 needed 2 + 8, and the
// finer row groups compute less of each diagonal tile (about +7% forward on an Intel Xeon).
#if defined(STRIA_ISA_avx512)
#define STRIA_VL 16
#define STRIA_MR 4
#define STRIA_NV 4
#elif defined(STRIA_ISA_avx2)
#define STRIA_VL 8
#define STRIA_MR 4
#define STRIA_NV 2
#else
#define STRIA_VL 4
#define STRIA_MR 4
#define STRIA_NV 2
#endif

namespace stria {
namespace cpu {
namespace STRIA_ISA_NAME {
namespace {

constexpr int VL = STRIA_VL;  // floats per vector
constexpr int MR = STRIA_MR;  // rows per micro-tile
constexpr int NV = STRIA_NV;  // vectors per micro-tile row
static_assert(kBlockQ % MR == 0 && kBlockK % MR == 0, "tiles must be whole micro-tiles");
static_assert(kBlockK % VL == 0, "key tiles must be whole vectors");

typedef float vf __attribute__((vector_size(VL * 4)));
typedef float vf_u __attribute__((vector_size(VL * 4), aligned(4)));  // unaligned access
typedef int32_t vi __attribute__((vector_size(VL * 4)));

inline vf Load(const float* p) {
  return *reinterpret_cast<const vf_u*>(p);
}
inline void Store(float* p, vf v) {
  *reinterpret_cast<vf_u*>(p) = v;
}
// Every lane x: x times a vector of ones, which GCC folds to a bare broadcast (x * 1 is exact, so
// it may), one load-port vbroadcastss when x comes from memory. vf{} + x is not an identity
// (0 + -0 is +0), so it compiles to a scalar add and a register broadcast, which on Intel take
// the FMA ports and halve the GEMM loops.
inline vf Splat(float x) {
  return x * (vf{} + 1.0f);
}
// Lane-wise maximum, one vmaxps: a NaN in x is passed over (x > m is false). Scores are
// reduced this way and a NaN score is caught by the exponential instead (see ForwardTile).
inline vf Max(vf m, vf x) {
  return x > m ? x : m;
}
// Horizontal reductions as a tree of log2(VL) shuffles, not VL - 1 scalar steps: they run once per
// row and key tile, which makes them a noticeable share of the softmax.
template <typename Op>
inline float Reduce(vf v, Op op) {
  for (int w = VL / 2; w >= 1; w /= 2) {
    vi rot;
    for (int i = 0; i < VL; ++i) rot[i] = (i + w) % VL;
    v = op(v, __builtin_shuffle(v, rot));
  }
  return v[0];
}
inline float HMax(vf v) {
  return Reduce(v, [](vf a, vf b) { return Max(a, b); });
}
inline float HSum(vf v) {
  return Reduce(v, [](vf a, vf b) { return a + b; });
}

// 2^f on [-0.5, 0.5]: a degree-5 polynomial fitted for relative error (7.5e-8; 2.3e-7 evaluated
// in float32, below what the fp32 bar of 1e-5 can notice).
inline vf Exp2Fraction(vf f) {
  vf p = Splat(1.327647196e-3f);
  p = p * f + 9.675541503e-3f;
  p = p * f + 5.550713275e-2f;
  p = p * f + 2.402211972e-1f;
  p = p * f + 6.931469671e-1f;
  return p * f + 1.000000072f;
}

#if defined(STRIA_ISA_avx512)
// 2^x for x <= 0 (scores minus a running maximum) in nine instructions, the softmax's inner loop:
// vrndscaleps splits off the integer part, vscalefps puts it in the exponent. Below -126 (and for
// -inf) the result is an exact 0 through the zeroing mask, so no denormal is ever produced; a NaN
// stays NaN.
inline vf Exp2(vf x) {
  const __mmask16 keep = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-126.0f), _CMP_NLT_UQ);
  // Lanes outside `keep` get n = 0 (their result is zeroed anyway); the masked form also avoids
  // GCC 12's false -Wmaybe-uninitialized on _mm512_roundscale_ps.
  const __m512 n = _mm512_maskz_roundscale_ps(keep, (__m512)x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return (vf)_mm512_maskz_scalef_ps(keep, (__m512)Exp2Fraction(x - (vf)n), n);
}
#else
// 2^x for x <= 0: exact 0 below -126 (and for -inf), NaN for NaN, the integer part added into the
// exponent bits.
inline vf Exp2(vf x) {
  vi keep = (x >= Splat(-126.0f)) | (x != x);
  x = x < Splat(-126.0f) ? Splat(-126.0f) : x;
  x = x > Splat(127.0f) ? Splat(127.0f) : x;
  const vf shifter = Splat(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  vf t = x + shifter;
  vf n = t - shifter;
  vi ni = (vi)t - 0x4B400000;
  vi scale_bits = (ni + 127) << 23;
  vf r = Exp2Fraction(x - n) * (vf)scale_bits;
  return (vf)((vi)r & keep);
}
#endif

// C[M x NVV*VL] (+)= sum_k A[i*ars + k*acs] * B[k*ldb + j].
template <int M, int NVV, bool kAccumulate>
inline void MicroKernel(int64_t K, const float* __restrict A, int64_t ars, int64_t acs, const float* __restrict B,
                        int64_t ldb, float* __restrict C, int64_t ldc) {
  vf c[M][NVV];
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NVV; ++v) c[i][v] = kAccumulate ? Load(C + i * ldc + v * VL) : vf{};
  for (int64_t k = 0; k < K; ++k) {
    vf b[NVV];
    for (int v = 0; v < NVV; ++v) b[v] = Load(B + k * ldb + v * VL);
    const float* a = A + k * acs;
    for (int i = 0; i < M; ++i) {
      vf ai = Splat(a[i * ars]);
      for (int v = 0; v < NVV; ++v) c[i][v] += ai * b[v];
    }
  }
  for (int i = 0; i < M; ++i)
    for (int v = 0; v < NVV; ++v) Store(C + i * ldc + v * VL, c[i][v]);
}

// C[M x N] (+)= A[M x K] · B[K x N]; M a multiple of MR, N of VL.
// pf, when given: pf_floats of data the next step needs, prefetched into L2 a slice per row group
// (see ForwardTile).
template <bool kAccumulate>
void Gemm(int64_t M, int64_t N, int64_t K, const float* A, int64_t ars, int64_t acs, const float* B, int64_t ldb,
          float* C, int64_t ldc, const float* pf = nullptr, int64_t pf_floats = 0) {
  const int64_t pf_slice = pf_floats / (M / MR);
  for (int64_t i = 0; i < M; i += MR) {
    if (pf != nullptr)
      for (int64_t f = 0; f < pf_slice; f += 64 / sizeof(float)) __builtin_prefetch(pf + i / MR * pf_slice + f, 0, 1);
    int64_t j = 0;
    for (; j + NV * VL <= N; j += NV * VL)
      MicroKernel<MR, NV, kAccumulate>(K, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc);
    for (; j < N; j += VL) MicroKernel<MR, 1, kAccumulate>(K, A + i * ars, ars, acs, B + j, ldb, C + i * ldc + j, ldc);
  }
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// How far a score may exceed the row's reference maximum before the row is rescaled: the
// probabilities stay below 2^8, far from float32's range, and most tiles rescale nothing.
constexpr float kRescaleSlack = 8.0f;

// Whether any lane of v exceeds t (false for NaN lanes).
inline bool AnyGreater(vf v, float t) {
#if defined(STRIA_ISA_avx512)
  return _mm512_cmp_ps_mask((__m512)v, _mm512_set1_ps(t), _CMP_GT_OQ) != 0;
#else
  return HMax(v) > t;
#endif
}

inline bool HasNaN(const float* row, int64_t n) {
  for (int64_t c = 0; c < n; ++c)
    if (row[c] != row[c]) return true;
  return false;
}

// Visible key columns [lo, hi) of local query row i (empty when the row is outside the mask).
inline void RowRange(const BlockMask& m, int64_t i, int64_t* lo, int64_t* hi) {
  if (i < m.q_begin || i >= m.q_end) {
    *lo = *hi = 0;
    return;
  }
  *lo = m.k_begin;
  *hi = m.diagonal ? std::min(m.k_end, i + m.offset + 1) : m.k_end;
  if (*hi < *lo) *hi = *lo;
}

// True when every pair of the tile rows [i0, i0+kBlockQ) x cols [j0, j0+kBlockK) is visible.
inline bool TileFull(const BlockMask& m, int64_t i0, int64_t j0) {
  if (i0 < m.q_begin || i0 + kBlockQ > m.q_end || j0 < m.k_begin || j0 + kBlockK > m.k_end) return false;
  return !m.diagonal || j0 + kBlockK - 1 <= i0 + m.offset;
}

void ApplyMask(const BlockMask& m, int64_t i0, int64_t j0, float* s);

// The key columns [0, n) of tile (i0, j0) that rows r0 .. r0 + MR - 1 may see, n rounded up to
// whole vectors: on a tile the diagonal crosses, a micro-tile row group computes only these
// (about half the tile), instead of the whole tile and then masking it.
inline int64_t GroupCols(const BlockMask& m, int64_t i0, int64_t r0, int64_t j0) {
  int64_t hi = 0;
  for (int64_t r = r0; r < r0 + MR; ++r) {
    int64_t lo, h;
    RowRange(m, i0 + r, &lo, &h);
    if (h > lo) hi = std::max(hi, h - j0);
  }
  hi = std::min<int64_t>(hi, kBlockK);
  return (hi + VL - 1) / VL * VL;
}

// S = Q·Kᵀ for a tile: whole, or on a masked tile per row group over its GroupCols (the columns
// left out are set to -inf by ApplyMask, which follows). cols[g] gets group g's width.
void TileScores(const BlockMask& mk, bool full, int64_t i0, int64_t j0, int64_t D, const float* q, int64_t Dp,
                const float* kt_tile, float* s, int64_t* cols, const float* pf = nullptr, int64_t pf_floats = 0) {
  if (full) {
    Gemm<false>(kBlockQ, kBlockK, D, q, Dp, 1, kt_tile, kBlockK, s, kBlockK, pf, pf_floats);
    for (int64_t g = 0; g < kBlockQ / MR; ++g) cols[g] = kBlockK;
    return;
  }
  for (int64_t g = 0; g < kBlockQ / MR; ++g) {
    cols[g] = GroupCols(mk, i0, g * MR, j0);
    if (cols[g] > 0)
      Gemm<false>(MR, cols[g], D, q + g * MR * Dp, Dp, 1, kt_tile, kBlockK, s + g * MR * kBlockK, kBlockK);
  }
  ApplyMask(mk, i0, j0, s);
}

// Sets the scores of invisible pairs of a tile to -inf.
void ApplyMask(const BlockMask& m, int64_t i0, int64_t j0, float* s) {
  for (int64_t r = 0; r < kBlockQ; ++r) {
    int64_t lo, hi;
    RowRange(m, i0 + r, &lo, &hi);
    float* row = s + r * kBlockK;
    // Visible columns are one interval: fill what lies before and after it.
    const int64_t c_lo = std::min<int64_t>(kBlockK, std::max<int64_t>(0, lo - j0));
    const int64_t c_hi = std::max(c_lo, std::min<int64_t>(kBlockK, std::max<int64_t>(0, hi - j0)));
    std::fill(row, row + c_lo, kNegInf);
    std::fill(row + c_hi, row + kBlockK, kNegInf);
  }
}

void ForwardTile(const FwdTileArgs& a) {
  const PackedShape& sh = *a.shape;
  const BlockMask& mk = *a.mask;
  const int64_t Dp = sh.Dp, D = sh.D;
  const int64_t i0 = a.q0;
  // The keys any row of this tile may see.
  const int64_t row_lo = std::max(i0, mk.q_begin), row_hi = std::min(i0 + kBlockQ, mk.q_end);
  if (row_lo >= row_hi) return;
  int64_t k_lo = mk.k_begin, k_hi = mk.k_end;
  if (mk.diagonal) k_hi = std::min(k_hi, row_hi - 1 + mk.offset + 1);
  if (k_hi <= k_lo) return;

  const float* q = a.q + i0 * Dp;
  float* acc = a.acc + i0 * Dp;
  float* m = a.m + i0;
  float* l = a.l + i0;
  float* s = a.scratch;
  int64_t cols[kBlockQ / MR];
  vf lsum[kBlockQ] = {};  // per-lane partial row sums, added into l at the end
  for (int64_t kt = k_lo / kBlockK; kt * kBlockK < k_hi; ++kt) {
    const int64_t j0 = kt * kBlockK;
    const bool full = TileFull(mk, i0, j0);
    // Each block of K and V comes from L3 or memory once per query tile: while the FMA units
    // work on one operand, the next is prefetched into L2, V during S = Q·Kᵀ and the next Kᵀ
    // tile during O += P·V (about +5% once a head's K and V outgrow L2).
    const float* next_kt = (kt + 1) * kBlockK < k_hi ? a.kt + (kt + 1) * Dp * kBlockK : nullptr;
    TileScores(mk, full, i0, j0, D, q, Dp, a.kt + kt * Dp * kBlockK, s, cols, a.v + j0 * Dp, Dp * kBlockK);
    for (int64_t r = 0; r < kBlockQ; ++r) {
      float* row = s + r * kBlockK;
      const int64_t n = cols[r / MR];  // columns past n are invisible and never read
      vf mx = Splat(kNegInf);
      for (int64_t c = 0; c < n; c += VL) mx = Max(mx, Load(row + c));
      // The reference m only moves when a score exceeds it by more than kRescaleSlack (or on the
      // row's first visible scores): the common tile skips the horizontal maximum, the exp2 of
      // the correction and the rescaling of the output row.
      if (m[r] == kNegInf || AnyGreater(mx, m[r] + kRescaleSlack)) {
        const float m_old = m[r];
        // Max passes over NaN scores: they turn into NaN probabilities below and poison the row
        // sum and the output. Only a row with no finite score yet must look for them itself.
        float m_new = std::max(m_old, HMax(mx));
        if (m_new == kNegInf) {
          if (!HasNaN(row, n)) {  // nothing visible yet: this row contributes nothing
            std::memset(row, 0, sizeof(float) * n);
            continue;
          }
          m_new = std::numeric_limits<float>::quiet_NaN();
        }
        const float alpha = std::exp2(m_old - m_new);  // 0 when m_old is -inf
        l[r] = (l[r] + HSum(lsum[r])) * alpha;
        lsum[r] = vf{};
        m[r] = m_new;
        float* o = acc + r * Dp;
        const vf av = Splat(alpha);
        for (int64_t d = 0; d < Dp; d += VL) Store(o + d, Load(o + d) * av);
      }
      const vf mv = Splat(m[r]);
      vf sum = lsum[r];
      for (int64_t c = 0; c < n; c += VL) {
        vf p = Exp2(Load(row + c) - mv);
        Store(row + c, p);
        sum += p;
      }
      lsum[r] = sum;
    }
    // O += P·V, on a masked tile per row group over the columns it computed.
    if (full) {
      Gemm<true>(kBlockQ, Dp, kBlockK, s, kBlockK, 1, a.v + j0 * Dp, Dp, acc, Dp, next_kt, Dp * kBlockK);
      continue;
    }
    for (int64_t g = 0; g < kBlockQ / MR; ++g)
      if (cols[g] > 0)
        Gemm<true>(MR, Dp, cols[g], s + g * MR * kBlockK, kBlockK, 1, a.v + j0 * Dp, Dp, acc + g * MR * Dp, Dp);
  }
  for (int64_t r = 0; r < kBlockQ; ++r) l[r] += HSum(lsum[r]);
}

void BackwardItem(const BwdItemArgs& a) {
  const PackedShape& sh = *a.shape;
  const BlockMask& mk = *a.mask;
  const int64_t Dp = sh.Dp, D = sh.D;
  float* s = a.scratch;                    // scores, then P
  float* dp = s + kBlockQ * kBlockK;       // dP, then dS
  float* dk_acc = dp + kBlockQ * kBlockK;  // [kBlockK][Dp]
  float* dv_acc = dk_acc + kBlockK * Dp;   // [kBlockK][Dp]
  int64_t cols[kBlockQ / MR];
  for (int64_t kt = a.kt0; kt < a.kt_end; kt += a.kt_stride) {
    const int64_t j0 = kt * kBlockK;
    // Queries that see any key of this tile.
    const int64_t j_lo = std::max(j0, mk.k_begin), j_hi = std::min(j0 + kBlockK, mk.k_end);
    if (j_lo >= j_hi) continue;
    int64_t i_lo = mk.q_begin, i_hi = mk.q_end;
    if (mk.diagonal) i_lo = std::max(i_lo, j_lo - mk.offset);
    if (i_lo >= i_hi) continue;
    std::memset(dk_acc, 0, sizeof(float) * 2 * kBlockK * Dp);
    const float* kt_tile = a.kt + kt * Dp * kBlockK;
    const float* vt_tile = a.vt + kt * Dp * kBlockK;
    const float* k_rows = a.k + j0 * Dp;
    for (int g = 0; g < a.group; ++g) {
      const float* q = a.q + g * a.head_stride;
      const float* dout = a.dout + g * a.head_stride;
      float* dq = a.dq + g * a.head_stride;
      const float* lse2 = a.lse2 + g * a.row_head_stride;
      const float* delta = a.delta + g * a.row_head_stride;
      for (int64_t i0 = (i_lo / kBlockQ) * kBlockQ; i0 < i_hi; i0 += kBlockQ) {
        const float* qt = q + i0 * Dp;
        const float* dot = dout + i0 * Dp;
        // S, dP, dS and dQ run per row group over the columns it may see (GroupCols) on a
        // masked tile; P and dS are zeroed past them for the key-row products dV and dK.
        const bool full = TileFull(mk, i0, j0);
        TileScores(mk, full, i0, j0, D, qt, Dp, kt_tile, s, cols);
        for (int64_t r = 0; r < kBlockQ; ++r) {
          float* row = s + r * kBlockK;
          const int64_t n = cols[r / MR];
          const float lse = lse2[i0 + r];
          if (lse == kNegInf) {  // a row that saw no key anywhere has no gradient
            std::memset(row, 0, sizeof(float) * kBlockK);
            continue;
          }
          const vf lv = Splat(lse);
          for (int64_t c = 0; c < n; c += VL) Store(row + c, Exp2(Load(row + c) - lv));
          std::memset(row + n, 0, sizeof(float) * (kBlockK - n));
        }
        // dV += Pᵀ·dO
        Gemm<true>(kBlockK, Dp, kBlockQ, s, 1, kBlockK, dot, Dp, dv_acc, Dp);
        // dP = dO·Vᵀ, then dS = P ∘ (dP − delta)
        for (int64_t g = 0; g < kBlockQ / MR; ++g)
          if (cols[g] > 0)
            Gemm<false>(MR, cols[g], D, dot + g * MR * Dp, Dp, 1, vt_tile, kBlockK, dp + g * MR * kBlockK, kBlockK);
        for (int64_t r = 0; r < kBlockQ; ++r) {
          const int64_t n = cols[r / MR];
          const vf dl = Splat(delta[i0 + r]);
          float* prow = s + r * kBlockK;
          float* drow = dp + r * kBlockK;
          for (int64_t c = 0; c < n; c += VL) Store(drow + c, Load(prow + c) * (Load(drow + c) - dl));
          std::memset(drow + n, 0, sizeof(float) * (kBlockK - n));
        }
        // dQ += dS·K ; dK += dSᵀ·Q
        for (int64_t g = 0; g < kBlockQ / MR; ++g)
          if (cols[g] > 0)
            Gemm<true>(MR, Dp, cols[g], dp + g * MR * kBlockK, kBlockK, 1, k_rows, Dp, dq + (i0 + g * MR) * Dp, Dp);
        Gemm<true>(kBlockK, Dp, kBlockQ, dp, 1, kBlockK, qt, Dp, dk_acc, Dp);
      }
    }
    // Q was pre-scaled by scale·log2(e); dK wants scale·dSᵀ·Q, hence the ln 2.
    const int64_t rows = std::min(kBlockK, sh.Lk - j0);
    for (int64_t r = 0; r < rows; ++r) {
      float* dkr = a.dk + (j0 + r) * a.dkv_row_stride;
      float* dvr = a.dv + (j0 + r) * a.dkv_row_stride;
      const float* ka = dk_acc + r * Dp;
      const float* va = dv_acc + r * Dp;
      for (int64_t d = 0; d < D; ++d) {
        dkr[d] += ka[d] * kLn2;
        dvr[d] += va[d];
      }
    }
  }
}

}  // namespace

#define STRIA_STR2(x) #x
#define STRIA_STR(x) STRIA_STR2(x)
extern const KernelTable kTable;
const KernelTable kTable = {
    STRIA_STR(STRIA_ISA_NAME),
    VL,
    ForwardTile,
    BackwardItem,
};

}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
