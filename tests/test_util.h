// Shared helpers for the tests: host tensors in any of our dtypes, a float64 dense reference of
// attention over the whole sequence (forward and backward), and running a local group's ranks
// on their own threads.
#pragma once

#include <stria/stria.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <vector>

namespace stria_test {

enum class Dt { kF32, kF16, kBF16 };

inline const char* DtName(Dt d) {
  return d == Dt::kF32 ? "f32" : d == Dt::kF16 ? "f16" : "bf16";
}
inline DLDataType DlType(Dt d) {
  DLDataType t;
  t.code = d == Dt::kBF16 ? kDLBfloat : kDLFloat;
  t.bits = d == Dt::kF32 ? 32 : 16;
  t.lanes = 1;
  return t;
}

// Scalar conversions, written independently of the library's (so a shared bug cannot hide).
inline float Bf16ToFloat(uint16_t h) {
  uint32_t b = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint16_t FloatToBf16(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  b += 0x7fffu + ((b >> 16) & 1u);
  return static_cast<uint16_t>(b >> 16);
}
inline float HalfToFloat(uint16_t h) {
  const int e = (h >> 10) & 31, m = h & 1023;
  const float s = (h & 0x8000) ? -1.f : 1.f;
  if (e == 0) return s * std::ldexp(static_cast<float>(m), -24);
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN() : s * std::numeric_limits<float>::infinity();
  return s * std::ldexp(static_cast<float>(m + 1024), e - 25);
}
inline uint16_t FloatToHalf(float f) {  // round to nearest even via search (tests only: slow is fine)
  if (std::isnan(f)) return 0x7e00;
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  float a = std::fabs(f);
  if (a >= 65520.f) return sign | 0x7c00;
  uint16_t lo = 0, hi = 0x7c00;
  while (hi - lo > 1) {  // largest code with value <= a
    uint16_t mid = static_cast<uint16_t>((lo + hi) / 2);
    if (HalfToFloat(mid) <= a)
      lo = mid;
    else
      hi = mid;
  }
  float dl = a - HalfToFloat(lo), dh = HalfToFloat(hi) - a;
  uint16_t r = (dl < dh || (dl == dh && (lo & 1) == 0)) ? lo : hi;
  return sign | r;
}

// A host tensor with its own storage; `dl` views it (optionally through custom strides).
struct Tensor {
  Dt dt = Dt::kF32;
  bool is_f32_only = false;
  std::vector<int64_t> shape, strides;
  std::vector<uint8_t> storage;
  DLTensor dl{};

  Tensor() = default;
  Tensor(std::vector<int64_t> s, Dt d) { Init(std::move(s), d); }
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;
  Tensor(Tensor&& o) noexcept { *this = std::move(o); }
  Tensor& operator=(Tensor&& o) noexcept {
    dt = o.dt;
    shape = std::move(o.shape);
    strides = std::move(o.strides);
    storage = std::move(o.storage);
    dl = o.dl;
    Relink();
    return *this;
  }

  void Init(std::vector<int64_t> s, Dt d) {
    dt = d;
    shape = std::move(s);
    strides.assign(shape.size(), 1);
    for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i)
      strides[static_cast<size_t>(i)] = strides[static_cast<size_t>(i) + 1] * shape[static_cast<size_t>(i) + 1];
    storage.assign(static_cast<size_t>(numel() * esize()), 0);
    dl = DLTensor{};
    dl.device = DLDevice{kDLCPU, 0};
    dl.dtype = DlType(d);
    Relink();
  }
  void Relink() {
    dl.data = storage.data();
    dl.ndim = static_cast<int>(shape.size());
    dl.shape = shape.data();
    dl.strides = strides.data();
  }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    return n;
  }
  int64_t esize() const { return dt == Dt::kF32 ? 4 : 2; }
  // Flat (row-major logical) index -> element offset via strides.
  int64_t Offset(int64_t flat) const {
    int64_t off = 0;
    for (int i = static_cast<int>(shape.size()) - 1; i >= 0; --i) {
      off += (flat % shape[static_cast<size_t>(i)]) * strides[static_cast<size_t>(i)];
      flat /= shape[static_cast<size_t>(i)];
    }
    return off;
  }
  uint8_t* Ptr(int64_t flat) { return static_cast<uint8_t*>(dl.data) + Offset(flat) * esize(); }
  const uint8_t* Ptr(int64_t flat) const { return static_cast<const uint8_t*>(dl.data) + Offset(flat) * esize(); }
  double Get(int64_t flat) const {
    const uint8_t* p = Ptr(flat);
    if (dt == Dt::kF32) {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, p, 2);
    return dt == Dt::kF16 ? HalfToFloat(h) : Bf16ToFloat(h);
  }
  void Set(int64_t flat, double v) {
    uint8_t* p = Ptr(flat);
    float f = static_cast<float>(v);
    if (dt == Dt::kF32) {
      std::memcpy(p, &f, 4);
      return;
    }
    uint16_t h = dt == Dt::kF16 ? FloatToHalf(f) : FloatToBf16(f);
    std::memcpy(p, &h, 2);
  }
  void FillRandom(std::mt19937_64& rng, double scale = 1.0) {
    std::normal_distribution<double> nd(0.0, scale);
    for (int64_t i = 0; i < numel(); ++i) Set(i, nd(rng));
  }
  void Poison() {
    for (int64_t i = 0; i < numel(); ++i) Set(i, std::numeric_limits<double>::quiet_NaN());
  }
  std::vector<double> ToDouble() const {
    std::vector<double> out(static_cast<size_t>(numel()));
    for (int64_t i = 0; i < numel(); ++i) out[static_cast<size_t>(i)] = Get(i);
    return out;
  }
};

inline const char* LayoutName(stria_layout_t layout) {
  switch (layout) {
    case STRIA_LAYOUT_CONTIGUOUS:
      return "contiguous";
    case STRIA_LAYOUT_STRIPED:
      return "striped";
    case STRIA_LAYOUT_ZIGZAG:
      return "zigzag";
  }
  return "?";
}

// One rank's tensors of a forward/backward call ([B, L, Hq, D] and [B, L, Hkv, D]), inputs filled
// with finite random values from `seed`.
struct AttentionTensors {
  Tensor q, k, v, out, lse, dout, dq, dk, dv;
  AttentionTensors(int64_t B, int64_t L, int64_t Hq, int64_t Hkv, int64_t D, Dt dt, uint64_t seed)
      : q({B, L, Hq, D}, dt),
        k({B, L, Hkv, D}, dt),
        v({B, L, Hkv, D}, dt),
        out({B, L, Hq, D}, dt),
        lse({B, Hq, L}, Dt::kF32),
        dout({B, L, Hq, D}, dt),
        dq({B, L, Hq, D}, dt),
        dk({B, L, Hkv, D}, dt),
        dv({B, L, Hkv, D}, dt) {
    std::mt19937_64 rng(seed);
    for (Tensor* t : {&q, &k, &v, &out, &dout}) t->FillRandom(rng);
  }
};

// ‖a − b‖ / ‖b‖; NaN or inf anywhere gives +inf (so it never passes).
inline double RelError(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) && !(std::isinf(a[i]) && a[i] == b[i])) return std::numeric_limits<double>::infinity();
    if (std::isinf(b[i]) && a[i] == b[i]) continue;  // -inf LSE rows match exactly
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// float64 dense attention over the full sequence. q [B,S,Hq,D], k/v [B,S,Hkv,D]; causal by global
// position. Outputs: out [B,S,Hq,D], lse [B,Hq,S]; with dout given, dq/dk/dv. With documents
// ([B][n + 1] boundaries, as params->cu_seqlens) a query sees only its own document's keys; with
// a window, query i only keys i - left .. i + right.
struct Reference {
  std::vector<double> out, lse, dq, dk, dv;
  std::vector<double> dsinks;  // with sinks and dout: [Hq]
  // The sum of the terms' magnitudes, sum |e^(z - lse) * delta|, per head: dsinks sums terms of
  // either sign, so its own size can be far below the rounding error of 16-bit outputs' terms.
  std::vector<double> dsinks_terms;
};

// What changes the scores beyond the mask (stria.h): logit softcapping and attention sinks.
struct ScoreMods {
  double softcap = 0;                          // > 0: a score s becomes softcap·tanh(s / softcap)
  const std::vector<double>* sinks = nullptr;  // [Hq] logits joining each row's denominator
};

// A sliding window as stria_attention_forward_window takes it (-1: unbounded on that side).
struct Window {
  int64_t left = -1, right = -1;
  bool active() const { return left != -1 || right != -1; }
};
// "<left>x<right>" for test names, "inf" for an unbounded side.
inline std::string WindowName(const Window& w) {
  auto side = [](int64_t x) { return x < 0 ? std::string("inf") : std::to_string(x); };
  return side(w.left) + "x" + side(w.right);
}

// a · b over n terms, in four interleaved partial sums (term d joins sum d mod 4, the last n mod 4
// terms the first) added at the end: independent chains the compiler vectorises, where one running
// sum is a chain of dependent adds it may not reorder. In float64 the order changes the result far
// below any tolerance.
inline double Dot(const double* a, const double* b, int64_t n) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  const int64_t whole = n - n % 4;
  int64_t d = 0;
  for (; d < whole; d += 4) {
    s0 += a[d] * b[d];
    s1 += a[d + 1] * b[d + 1];
    s2 += a[d + 2] * b[d + 2];
    s3 += a[d + 3] * b[d + 3];
  }
  for (; d < n; ++d) s0 += a[d] * b[d];
  return (s0 + s1) + (s2 + s3);
}

inline Reference DenseAttention(const std::vector<double>& q, const std::vector<double>& k,
                                const std::vector<double>& v, const std::vector<double>* dout, int64_t B, int64_t S,
                                int64_t Hq, int64_t Hkv, int64_t D, bool causal, double scale,
                                const std::vector<int64_t>* documents = nullptr, Window window = {},
                                ScoreMods mods = {}) {
  Reference r;
  if (mods.sinks != nullptr && dout) r.dsinks.assign(static_cast<size_t>(Hq), 0.0);
  r.dsinks_terms = r.dsinks;
  r.out.assign(static_cast<size_t>(B * S * Hq * D), 0.0);
  r.lse.assign(static_cast<size_t>(B * Hq * S), 0.0);
  if (dout) {
    r.dq.assign(r.out.size(), 0.0);
    r.dk.assign(static_cast<size_t>(B * S * Hkv * D), 0.0);
    r.dv.assign(r.dk.size(), 0.0);
  }
  const int64_t group = Hq / Hkv;
  std::vector<double> p(static_cast<size_t>(S)), dp(static_cast<size_t>(S)), slope(static_cast<size_t>(S), 1.0);
  auto Q = [&](int64_t b, int64_t i, int64_t h) { return &q[static_cast<size_t>(((b * S + i) * Hq + h) * D)]; };
  auto K = [&](int64_t b, int64_t j, int64_t h) { return &k[static_cast<size_t>(((b * S + j) * Hkv + h) * D)]; };
  auto V = [&](int64_t b, int64_t j, int64_t h) { return &v[static_cast<size_t>(((b * S + j) * Hkv + h) * D)]; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < S; ++i) {
        int64_t j0 = 0, n = causal ? i + 1 : S;  // the keys [j0, n) of query i
        if (documents != nullptr) {
          const size_t per_row = documents->size() / static_cast<size_t>(B);
          const int64_t* cu = documents->data() + static_cast<size_t>(b) * per_row;
          size_t d = 0;
          while (cu[d + 1] <= i) ++d;
          j0 = cu[d];
          n = std::min(n, cu[d + 1]);
        }
        if (window.left >= 0) j0 = std::max(j0, i - window.left);
        if (window.right >= 0) n = std::min(n, i + window.right + 1);
        double mx = -INFINITY;
        for (int64_t j = j0; j < n; ++j) {
          double s = Dot(Q(b, i, h), K(b, j, hk), D) * scale;
          if (mods.softcap > 0) {
            const double t = std::tanh(s / mods.softcap);
            s = mods.softcap * t;
            slope[static_cast<size_t>(j)] = 1.0 - t * t;
          }
          p[static_cast<size_t>(j)] = s;
          mx = std::max(mx, p[static_cast<size_t>(j)]);
        }
        const double sink = mods.sinks != nullptr ? (*mods.sinks)[static_cast<size_t>(h)] : -INFINITY;
        mx = std::max(mx, sink);
        double sum = sink == -INFINITY ? 0.0 : std::exp(sink - mx);
        for (int64_t j = j0; j < n; ++j) sum += std::exp(p[static_cast<size_t>(j)] - mx);
        const double lse = mx + std::log(sum);
        r.lse[static_cast<size_t>((b * Hq + h) * S + i)] = lse;
        double* o = &r.out[static_cast<size_t>(((b * S + i) * Hq + h) * D)];
        for (int64_t j = j0; j < n; ++j) {
          p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - lse);
          for (int64_t d = 0; d < D; ++d) o[d] += p[static_cast<size_t>(j)] * V(b, j, hk)[d];
        }
        if (!dout) continue;
        const double* g = &(*dout)[static_cast<size_t>(((b * S + i) * Hq + h) * D)];
        const double delta = Dot(g, o, D);
        // The sink's probability times (0 - delta): it carries no value.
        if (!r.dsinks.empty() && sink != -INFINITY) {
          r.dsinks[static_cast<size_t>(h)] -= std::exp(sink - lse) * delta;
          r.dsinks_terms[static_cast<size_t>(h)] += std::abs(std::exp(sink - lse) * delta);
        }
        for (int64_t j = j0; j < n; ++j) {
          const double dpj = Dot(g, V(b, j, hk), D);
          const double ds = p[static_cast<size_t>(j)] * (dpj - delta) * scale * slope[static_cast<size_t>(j)];
          double* dqi = &r.dq[static_cast<size_t>(((b * S + i) * Hq + h) * D)];
          double* dkj = &r.dk[static_cast<size_t>(((b * S + j) * Hkv + hk) * D)];
          double* dvj = &r.dv[static_cast<size_t>(((b * S + j) * Hkv + hk) * D)];
          // Three loops, not one: each has one store the compiler can vectorise.
          const double* kj = K(b, j, hk);
          const double* qi = Q(b, i, h);
          const double pj = p[static_cast<size_t>(j)];
          for (int64_t d = 0; d < D; ++d) dqi[d] += ds * kj[d];
          for (int64_t d = 0; d < D; ++d) dkj[d] += ds * qi[d];
          for (int64_t d = 0; d < D; ++d) dvj[d] += pj * g[d];
        }
      }
    }
  return r;
}

// float64 decode over a whole KV cache (stria_attention_decode's result): q [B, T, Hq, D], query t
// of sequence b at position lens[b] + t, against the keys and values kf, vf [B, S, Hkv, D] at
// positions 0 .. lens[b] + added - 1 (causal: those up to the query's; window_left >= 0: no more
// than that far behind it). out [B, T, Hq, D], lse [B, Hq, T] (-inf for a row that sees nothing).
inline Reference DecodeReference(const Tensor& q, const Tensor& kf, const Tensor& vf, const std::vector<int64_t>& lens,
                                 int64_t added, bool causal, int64_t window_left, ScoreMods mods = {}) {
  const int64_t B = q.shape[0], T = q.shape[1], Hq = q.shape[2], D = q.shape[3], S = kf.shape[1], Hkv = kf.shape[2];
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // The operands as doubles once: Tensor::Get converts from the storage dtype per element, which
  // the long prefill cases would pay per score and dimension.
  const std::vector<double> qd = q.ToDouble(), kd = kf.ToDouble(), vd = vf.ToDouble();
  Reference r;
  r.out.assign(static_cast<size_t>(B * T * Hq * D), 0.0);
  r.lse.assign(static_cast<size_t>(B * Hq * T), 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq; ++h) {
        const int64_t p = lens[static_cast<size_t>(b)] + t, hk = h / (Hq / Hkv);
        const int64_t end = lens[static_cast<size_t>(b)] + added;
        std::vector<double> s;
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < end; ++j) {
          if (causal && j > p) continue;
          if (window_left >= 0 && p - j > window_left) continue;
          double x = 0;
          const double* qr = qd.data() + ((b * T + t) * Hq + h) * D;
          const double* kr = kd.data() + ((b * S + j) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) x += qr[d] * kr[d];
          x *= scale;
          if (mods.softcap > 0) x = mods.softcap * std::tanh(x / mods.softcap);
          s.push_back(x);
          keys.push_back(j);
        }
        const double z = mods.sinks != nullptr ? (*mods.sinks)[static_cast<size_t>(h)] : -INFINITY;
        double mx = z;
        for (double x : s) mx = std::max(mx, x);
        double sum = z == -INFINITY ? 0.0 : std::exp(z - mx);
        for (double x : s) sum += std::exp(x - mx);
        const double lse = mx == -INFINITY ? -INFINITY : mx + std::log(sum);
        r.lse[static_cast<size_t>((b * Hq + h) * T + t)] = lse;
        for (size_t i = 0; i < s.size(); ++i) {
          const double w = std::exp(s[i] - lse);
          const double* vr = vd.data() + ((b * S + keys[i]) * Hkv + hk) * D;
          for (int64_t d = 0; d < D; ++d) r.out[static_cast<size_t>(((b * T + t) * Hq + h) * D + d)] += w * vr[d];
        }
      }
  return r;
}

// Document boundaries for B rows of S tokens, [B][docs + 1] as cu_seqlens takes them: docs - 1
// random cuts per row (cuts may coincide: empty documents); odd rows get half as many documents
// and repeat S at their end, as a caller pads rows with fewer documents.
// `docs` documents per batch row of S tokens: one of S / 2 (longer than a rank's share: the plan
// shares it), the (b % docs)-th of row b, and short ones cut at random from the rest (which the
// plan keeps whole, past it: a home part on most ranks).
inline std::vector<int64_t> HomeDocuments(int64_t B, int64_t S, int docs, std::mt19937_64& rng) {
  std::vector<int64_t> cu;
  const int64_t long_len = S / 2;
  std::uniform_int_distribution<int64_t> pos(1, S - long_len - 1);
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> cuts;
    for (int d = 2; d < docs; ++d) cuts.push_back(pos(rng));
    std::sort(cuts.begin(), cuts.end());
    std::vector<int64_t> lengths;
    int64_t at = 0;
    for (int64_t x : cuts) {
      lengths.push_back(x - at);
      at = x;
    }
    lengths.push_back(S - long_len - at);
    lengths.insert(lengths.begin() + b % docs, long_len);
    cu.push_back(0);
    for (int64_t n : lengths) cu.push_back(cu.back() + n);
  }
  return cu;
}

inline std::vector<int64_t> RandomDocuments(int64_t B, int64_t S, int docs, std::mt19937_64& rng) {
  std::vector<int64_t> cu;
  std::uniform_int_distribution<int64_t> pos(0, S);
  for (int64_t b = 0; b < B; ++b) {
    const int used = b % 2 == 1 ? std::max(1, docs / 2) : docs;
    std::vector<int64_t> cuts;
    for (int d = 1; d < used; ++d) cuts.push_back(pos(rng));
    std::sort(cuts.begin(), cuts.end());
    cu.push_back(0);
    cu.insert(cu.end(), cuts.begin(), cuts.end());
    while (static_cast<int64_t>(cu.size()) % (docs + 1) != 0) cu.push_back(S);
  }
  return cu;
}

// The forward and backward calls, through the _documents entry points when `documents` holds
// boundaries ([B][num_seqs + 1]; empty: the plain calls), and through the _window ones when a
// window is given (with the documents, if any).
inline stria_status_t AttentionForward(stria_context_t ctx, const stria_attention_params_t* p,
                                       const std::vector<int64_t>& documents, int64_t num_seqs, const DLTensor* q,
                                       const DLTensor* k, const DLTensor* v, DLTensor* out, DLTensor* lse, void* stream,
                                       Window window = {}) {
  if (window.active())
    return stria_attention_forward_window(ctx, p, window.left, window.right,
                                          documents.empty() ? nullptr : documents.data(),
                                          documents.empty() ? 0 : num_seqs, q, k, v, out, lse, stream);
  if (documents.empty()) return stria_attention_forward(ctx, p, q, k, v, out, lse, stream);
  return stria_attention_forward_documents(ctx, p, documents.data(), num_seqs, q, k, v, out, lse, stream);
}
inline stria_status_t AttentionBackward(stria_context_t ctx, const stria_attention_params_t* p,
                                        const std::vector<int64_t>& documents, int64_t num_seqs, const DLTensor* q,
                                        const DLTensor* k, const DLTensor* v, const DLTensor* out, const DLTensor* lse,
                                        const DLTensor* dout, DLTensor* dq, DLTensor* dk, DLTensor* dv, void* stream,
                                        Window window = {}) {
  if (window.active())
    return stria_attention_backward_window(
        ctx, p, window.left, window.right, documents.empty() ? nullptr : documents.data(),
        documents.empty() ? 0 : num_seqs, q, k, v, out, lse, dout, dq, dk, dv, stream);
  if (documents.empty()) return stria_attention_backward(ctx, p, q, k, v, out, lse, dout, dq, dk, dv, stream);
  return stria_attention_backward_documents(ctx, p, documents.data(), num_seqs, q, k, v, out, lse, dout, dq, dk, dv,
                                            stream);
}

// True where a CUDA context can be created (the CUDA module is built and a GPU is present): tests
// of what happens without one then check the GPU behaviour instead, or skip.
inline bool CudaContextWorks() {
  stria_context_config_t cfg;
  stria_context_config_init(&cfg);
  cfg.device = DLDevice{kDLCUDA, 0};
  stria_context_t ctx = nullptr;
  if (stria_context_create(&cfg, &ctx) != STRIA_SUCCESS) return false;
  stria_context_destroy(ctx);
  return true;
}

// Runs fn(rank) on world_size threads and joins them.
inline void RunRanks(int world_size, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world_size; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// A local group that is destroyed at scope exit.
struct LocalGroup {
  std::vector<stria_context_t> ctx;
  explicit LocalGroup(int n, double timeout_s = 60.0, int threads = 1) : ctx(static_cast<size_t>(n), nullptr) {
    stria_context_config_t cfg;
    stria_context_config_init(&cfg);
    cfg.timeout_s = timeout_s;
    cfg.num_threads = threads;
    status = stria_context_create_local_group(&cfg, n, ctx.data());
  }
  ~LocalGroup() {
    for (auto c : ctx)
      if (c) stria_context_destroy(c);
  }
  stria_status_t status;
};

}  // namespace stria_test
