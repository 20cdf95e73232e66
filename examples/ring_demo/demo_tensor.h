// Host tensors for the ring demo: the full-sequence inputs and outputs, each rank's shards, and
// the float64 check of sampled rows. Kept apart from ring_demo.cc so that file reads as the story
// of the demo.
#pragma once

#include <stria/stria.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

enum class DemoDtype { kF32, kBF16, kF16 };

inline bool ParseDtype(const char* s, DemoDtype* out) {
  std::string v = s;
  if (v == "f32" || v == "float32")
    *out = DemoDtype::kF32;
  else if (v == "bf16" || v == "bfloat16")
    *out = DemoDtype::kBF16;
  else if (v == "f16" || v == "float16")
    *out = DemoDtype::kF16;
  else
    return false;
  return true;
}
inline const char* DtypeName(DemoDtype d) {
  return d == DemoDtype::kF32 ? "float32" : d == DemoDtype::kBF16 ? "bfloat16" : "float16";
}

// A compact host tensor of one dtype, viewed by `dl`.
struct HostTensor {
  DemoDtype dtype = DemoDtype::kF32;
  bool force_f32 = false;
  std::vector<int64_t> shape;
  std::vector<unsigned char> data;
  DLTensor dl{};

  HostTensor(std::vector<int64_t> s, DemoDtype d, bool f32 = false) : dtype(d), force_f32(f32), shape(std::move(s)) {
    int64_t n = 1;
    for (int64_t x : shape) n *= x;
    data.resize(static_cast<size_t>(n * esize()));
    dl.data = data.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = static_cast<int>(shape.size());
    dl.shape = shape.data();
    dl.strides = nullptr;
    dl.dtype.code = (!force_f32 && dtype == DemoDtype::kBF16) ? kDLBfloat : kDLFloat;
    dl.dtype.bits = static_cast<uint8_t>(esize() * 8);
    dl.dtype.lanes = 1;
  }
  HostTensor(const HostTensor&) = delete;
  HostTensor(HostTensor&& o) noexcept
      : dtype(o.dtype), force_f32(o.force_f32), shape(std::move(o.shape)), data(std::move(o.data)), dl(o.dl) {
    dl.data = data.data();
    dl.shape = shape.data();
  }
  int64_t esize() const { return force_f32 || dtype == DemoDtype::kF32 ? 4 : 2; }
  int64_t numel() const { return static_cast<int64_t>(data.size()) / esize(); }
  double get(int64_t i) const {
    if (esize() == 4) {
      float f;
      std::memcpy(&f, &data[static_cast<size_t>(i * 4)], 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, &data[static_cast<size_t>(i * 2)], 2);
    if (dtype == DemoDtype::kBF16) {
      uint32_t b = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &b, 4);
      return f;
    }
    _Float16 x;
    std::memcpy(&x, &h, 2);
    return static_cast<double>(x);
  }
  void set(int64_t i, double v) {
    float f = static_cast<float>(v);
    if (esize() == 4) {
      std::memcpy(&data[static_cast<size_t>(i * 4)], &f, 4);
      return;
    }
    uint16_t h;
    if (dtype == DemoDtype::kBF16) {
      uint32_t b;
      std::memcpy(&b, &f, 4);
      b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest even (inputs are finite)
      h = static_cast<uint16_t>(b >> 16);
    } else {
      _Float16 x = static_cast<_Float16>(f);
      std::memcpy(&h, &x, 2);
    }
    std::memcpy(&data[static_cast<size_t>(i * 2)], &h, 2);
  }
};

struct DemoShape {
  int64_t S, Hq, Hkv, D;
};

// Full-sequence tensors in global token order: inputs, and the gathered outputs of the ring.
struct Full {
  DemoShape s;
  HostTensor q, k, v, dout, out, lse, dq, dk, dv;
  template <typename Options>
  explicit Full(const Options& o)
      : s{o.seq, o.heads, o.kv_heads, o.dim},
        q({1, o.seq, o.heads, o.dim}, o.dtype),
        k({1, o.seq, o.kv_heads, o.dim}, o.dtype),
        v({1, o.seq, o.kv_heads, o.dim}, o.dtype),
        dout({1, o.seq, o.heads, o.dim}, o.dtype),
        out({1, o.seq, o.heads, o.dim}, o.dtype),
        lse({1, o.heads, o.seq}, o.dtype, true),
        dq({1, o.seq, o.heads, o.dim}, o.dtype),
        dk({1, o.seq, o.kv_heads, o.dim}, o.dtype),
        dv({1, o.seq, o.kv_heads, o.dim}, o.dtype) {}
  void Randomize(uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> nd(0.0, 1.0);
    for (HostTensor* t : {&q, &k, &v, &dout})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, nd(rng));
  }
  void Poison() {
    for (HostTensor* t : {&out, &lse, &dq, &dk, &dv})
      for (int64_t i = 0; i < t->numel(); ++i) t->set(i, std::numeric_limits<double>::quiet_NaN());
  }
};

// One rank's tensors.
struct Local {
  HostTensor q, k, v, dout, out, lse, dq, dk, dv;
  template <typename Options>
  Local(const Options& o, int64_t L)
      : q({1, L, o.heads, o.dim}, o.dtype),
        k({1, L, o.kv_heads, o.dim}, o.dtype),
        v({1, L, o.kv_heads, o.dim}, o.dtype),
        dout({1, L, o.heads, o.dim}, o.dtype),
        out({1, L, o.heads, o.dim}, o.dtype),
        lse({1, o.heads, L}, o.dtype, true),
        dq({1, L, o.heads, o.dim}, o.dtype),
        dk({1, L, o.kv_heads, o.dim}, o.dtype),
        dv({1, L, o.kv_heads, o.dim}, o.dtype) {}

  static void Check(stria_status_t s, const char* what) {
    if (s != STRIA_SUCCESS) {
      std::fprintf(stderr, "%s failed: %s\n", what, stria_get_last_error());
      std::exit(1);
    }
  }
  void ShardFrom(const Full& f, stria_layout_t layout, int n, int r) {
    Check(stria_shard(layout, n, r, 1, &f.q.dl, &q.dl, nullptr), "stria_shard(q)");
    Check(stria_shard(layout, n, r, 1, &f.k.dl, &k.dl, nullptr), "stria_shard(k)");
    Check(stria_shard(layout, n, r, 1, &f.v.dl, &v.dl, nullptr), "stria_shard(v)");
    Check(stria_shard(layout, n, r, 1, &f.dout.dl, &dout.dl, nullptr), "stria_shard(dout)");
  }
  void UnshardInto(Full* f, stria_layout_t layout, int n, int r) {
    Check(stria_unshard(layout, n, r, 1, &out.dl, &f->out.dl, nullptr), "stria_unshard(out)");
    Check(stria_unshard(layout, n, r, 2, &lse.dl, &f->lse.dl, nullptr), "stria_unshard(lse)");
    Check(stria_unshard(layout, n, r, 1, &dq.dl, &f->dq.dl, nullptr), "stria_unshard(dq)");
    Check(stria_unshard(layout, n, r, 1, &dk.dl, &f->dk.dl, nullptr), "stria_unshard(dk)");
    Check(stria_unshard(layout, n, r, 1, &dv.dl, &f->dv.dl, nullptr), "stria_unshard(dv)");
  }
};

// Relative error accumulator: sqrt(Σ(a−b)²/Σb²); NaN anywhere makes it NaN (never passes).
struct ErrAcc {
  double num = 0, den = 0;
  void Add(double got, double want) {
    num += (got - want) * (got - want);
    den += want * want;
  }
  double value() const { return den > 0 ? std::sqrt(num / den) : std::sqrt(num); }
};

// Checks sampled rows against float64: for each sampled position p, query row p (out, lse, dq:
// all from the reference alone) and key row p (dk, dv: these sum over every later query, so they
// use the ring's own lse and out for those rows, which the sampled forward check vouches for).
inline void CheckSampledRows(const Full& in, const Full& got, const std::vector<int64_t>& rows, double* e_out,
                             double* e_lse, double* e_dq, double* e_dk, double* e_dv) {
  const DemoShape& s = in.s;
  const int64_t group = s.Hq / s.Hkv, D = s.D, S = s.S;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  auto Q = [&](int64_t i, int64_t h, int64_t d) { return in.q.get((i * s.Hq + h) * D + d); };
  auto K = [&](int64_t j, int64_t h, int64_t d) { return in.k.get((j * s.Hkv + h) * D + d); };
  auto V = [&](int64_t j, int64_t h, int64_t d) { return in.v.get((j * s.Hkv + h) * D + d); };
  auto G = [&](int64_t i, int64_t h, int64_t d) { return in.dout.get((i * s.Hq + h) * D + d); };
  ErrAcc out, lse, dq, dk, dv;
  std::vector<double> p(static_cast<size_t>(S)), o(static_cast<size_t>(D)), acc(static_cast<size_t>(D));
  for (int64_t i : rows) {
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t hk = h / group;
      double mx = -INFINITY;
      for (int64_t j = 0; j <= i; ++j) {
        double x = 0;
        for (int64_t d = 0; d < D; ++d) x += Q(i, h, d) * K(j, hk, d);
        p[static_cast<size_t>(j)] = x * scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      double sum = 0;
      for (int64_t j = 0; j <= i; ++j) sum += std::exp(p[static_cast<size_t>(j)] - mx);
      const double l = mx + std::log(sum);
      std::fill(o.begin(), o.end(), 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - l);
        for (int64_t d = 0; d < D; ++d) o[static_cast<size_t>(d)] += p[static_cast<size_t>(j)] * V(j, hk, d);
      }
      lse.Add(got.lse.get(h * S + i), l);
      double delta = 0;
      for (int64_t d = 0; d < D; ++d) {
        out.Add(got.out.get((i * s.Hq + h) * D + d), o[static_cast<size_t>(d)]);
        delta += G(i, h, d) * o[static_cast<size_t>(d)];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j <= i; ++j) {
        double dp = 0;
        for (int64_t d = 0; d < D; ++d) dp += G(i, h, d) * V(j, hk, d);
        const double ds = p[static_cast<size_t>(j)] * (dp - delta) * scale;
        for (int64_t d = 0; d < D; ++d) acc[static_cast<size_t>(d)] += ds * K(j, hk, d);
      }
      for (int64_t d = 0; d < D; ++d) dq.Add(got.dq.get((i * s.Hq + h) * D + d), acc[static_cast<size_t>(d)]);
    }
    // Key row j = i: dK_j = Σ_queries scale·P(dP − δ)·Q, dV_j = Σ P·dO.
    const int64_t j = i;
    for (int64_t hk = 0; hk < s.Hkv; ++hk) {
      std::vector<double> gk(static_cast<size_t>(D), 0.0), gv(static_cast<size_t>(D), 0.0);
      for (int64_t g = 0; g < group; ++g) {
        const int64_t h = hk * group + g;
        for (int64_t qi = j; qi < S; ++qi) {
          double x = 0, dp = 0, delta = 0;
          for (int64_t d = 0; d < D; ++d) {
            x += Q(qi, h, d) * K(j, hk, d);
            dp += G(qi, h, d) * V(j, hk, d);
            delta += G(qi, h, d) * got.out.get((qi * s.Hq + h) * D + d);
          }
          const double pij = std::exp(x * scale - got.lse.get(h * S + qi));
          const double ds = pij * (dp - delta) * scale;
          for (int64_t d = 0; d < D; ++d) {
            gk[static_cast<size_t>(d)] += ds * Q(qi, h, d);
            gv[static_cast<size_t>(d)] += pij * G(qi, h, d);
          }
        }
      }
      for (int64_t d = 0; d < D; ++d) {
        dk.Add(got.dk.get((j * s.Hkv + hk) * D + d), gk[static_cast<size_t>(d)]);
        dv.Add(got.dv.get((j * s.Hkv + hk) * D + d), gv[static_cast<size_t>(d)]);
      }
    }
  }
  *e_out = out.value();
  *e_lse = lse.value();
  *e_dq = dq.value();
  *e_dk = dk.value();
  *e_dv = dv.value();
}
