// Vector helpers of the CPU tile kernels, written once with GCC vector extensions and compiled
// per instruction set (the including file is built once per ISA, see kernels/CMakeLists.txt):
// vectors of 4 (generic x86-64), 8 (AVX2) or 16 floats (AVX-512, and the AMX build, which is
// AVX-512 plus tile instructions).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "cpu/attention_kernels.h"

#if defined(STRIA_ISA_avx512) || defined(STRIA_ISA_avx512bf16) || defined(STRIA_ISA_amx)
#define STRIA_SIMD_AVX512 1
#endif
#if defined(__SSE2__)
#include <immintrin.h>
#endif

// Micro-tile: MR rows x NV vectors of accumulators. AVX-512 takes 4 x 4 (16 of its 32 registers):
// per k step 4 vector loads and 4 broadcasts feed 16 FMAs, where 8 x 2 needed 2 + 8, and the
// finer row groups compute less of each diagonal tile (about +7% forward on an Intel Xeon).
#if defined(STRIA_SIMD_AVX512)
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
// Horizontal reductions as a tree of log2(VL) steps, not VL - 1 scalar ones: they run once per row
// and key tile, which makes them a noticeable share of the softmax, and once per score in the
// decode kernel's dot products. Each step halves the vector (extracting its upper half, where
// writing it as a generic shuffle made GCC build each step's index vector in registers, lane by
// lane, every time). Max keeps Max's operand order: a NaN lane is passed over.
#if defined(__SSE2__)
inline float Reduce4Sum(__m128 x) {
  x = _mm_add_ps(x, _mm_movehl_ps(x, x));
  x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
  return _mm_cvtss_f32(x);
}
inline float Reduce4Max(__m128 x) {
  x = _mm_max_ps(_mm_movehl_ps(x, x), x);
  x = _mm_max_ss(_mm_shuffle_ps(x, x, 1), x);
  return _mm_cvtss_f32(x);
}
#if defined(__AVX__)
inline __m128 Lower4(__m256 x) {
  return _mm256_castps256_ps128(x);
}
inline __m128 Upper4(__m256 x) {
  return _mm256_extractf128_ps(x, 1);
}
#endif
#if defined(STRIA_SIMD_AVX512)
// The zero-masked forms: GCC 12 warns of an uninitialised operand in the plain ones (as in Exp2),
// _mm512_castps512_ps256 included.
inline __m256 Lower8(__m512 x) {
  return _mm512_maskz_extractf32x8_ps(static_cast<__mmask8>(0xFF), x, 0);
}
inline __m256 Upper8(__m512 x) {
  return _mm512_maskz_extractf32x8_ps(static_cast<__mmask8>(0xFF), x, 1);
}
#endif

inline float HMax(vf v) {
#if defined(STRIA_SIMD_AVX512)
  const __m256 x = _mm256_max_ps(Upper8((__m512)v), Lower8((__m512)v));
  return Reduce4Max(_mm_max_ps(Upper4(x), Lower4(x)));
#elif defined(__AVX__)
  return Reduce4Max(_mm_max_ps(Upper4((__m256)v), Lower4((__m256)v)));
#else
  return Reduce4Max((__m128)v);
#endif
}
inline float HSum(vf v) {
#if defined(STRIA_SIMD_AVX512)
  const __m256 x = _mm256_add_ps(Lower8((__m512)v), Upper8((__m512)v));
  return Reduce4Sum(_mm_add_ps(Lower4(x), Upper4(x)));
#elif defined(__AVX__)
  return Reduce4Sum(_mm_add_ps(Lower4((__m256)v), Upper4((__m256)v)));
#else
  return Reduce4Sum((__m128)v);
#endif
}
#else
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
#endif

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

#if defined(STRIA_SIMD_AVX512)
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

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// tanh(x), for logit softcapping, within about 3.6e-7 relative (test_cpu_tanh). Near 0 an odd Taylor polynomial
// (|x| < 0.3, the terms past x^11 below 2e-8); further out (1 - e) / (1 + e) with e = e^(-2|x|),
// where 1 - e >= 0.45 keeps the exponential's error from cancelling. NaN stays NaN.
inline vf Tanh(vf x) {
  const vf ax = (vf)((vi)x & 0x7fffffff);
  const vf x2 = x * x;
  vf p = Splat(-1382.0f / 155925.0f);
  p = p * x2 + 62.0f / 2835.0f;
  p = p * x2 - 17.0f / 315.0f;
  p = p * x2 + 2.0f / 15.0f;
  p = p * x2 - 1.0f / 3.0f;
  const vf small = x + x * x2 * p;
  const vf e = Exp2(ax * Splat(-2.0f * 1.4426950408889634f));
  const vf large = (vf)((vi)((Splat(1.0f) - e) / (Splat(1.0f) + e)) | ((vi)x & (int32_t)0x80000000u));
  return ax < Splat(0.3f) ? small : large;
}

// tanh(x) within about 1.5e-7 absolute (not relative near 0), for the bf16 kernels, whose
// probabilities are rounded to bf16 (relative 4e-3) right after: Tanh's exponential branch alone,
// and on AVX-512 a reciprocal estimate refined by one Newton step in place of the division. About
// half of Tanh's work, which is a visible share beside the bf16 tile products.
inline vf TanhFast(vf x) {
  const vf ax = (vf)((vi)x & 0x7fffffff);
  const vf e = Exp2(ax * Splat(-2.0f * 1.4426950408889634f));
  const vf den = Splat(1.0f) + e;
#if defined(STRIA_SIMD_AVX512)
  // The zero-masked form: GCC 12 warns of an uninitialised operand in the plain one (as in Exp2).
  vf r = (vf)_mm512_maskz_rcp14_ps(static_cast<__mmask16>(0xFFFF), (__m512)den);
  r = r * (Splat(2.0f) - den * r);
  const vf t = (Splat(1.0f) - e) * r;
#else
  const vf t = (Splat(1.0f) - e) / den;
#endif
  return (vf)((vi)t | ((vi)x & (int32_t)0x80000000u));
}

// How far a score may exceed the row's reference maximum before the row is rescaled: the
// probabilities stay below 2^8, far from float32's range, and most tiles rescale nothing.
constexpr float kRescaleSlack = 8.0f;

// Whether any lane of v exceeds t (false for NaN lanes).
inline bool AnyGreater(vf v, float t) {
#if defined(STRIA_SIMD_AVX512)
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

}  // namespace
}  // namespace STRIA_ISA_NAME
}  // namespace cpu
}  // namespace stria
