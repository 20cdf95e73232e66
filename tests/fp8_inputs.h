// FP8 (float8_e4m3fn) test inputs, written independently of the library's decoding: codes made
// from random values by round-to-nearest under a descale, and the values those codes stand for,
// for the float64 reference. Shared by the CPU suite (test_fp8.cc) and the CUDA ring's.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <stria/stria.h>

#include "test_util.h"

namespace stria_test {

// What an e4m3fn code stands for: (-1)^s * 2^(e-7) * (1 + m/8), subnormal 2^-6 * m/8, NaN at
// S.1111.111 (no infinities).
inline double Fp8Value(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (c & 0x80) ? -mag : mag;
}

// The nearest code to x (ties to the even code), saturating at +-448; x's sign (zero too).
inline uint8_t Fp8Nearest(double x) {
  const double a = std::min(std::fabs(x), 448.0);
  int best = 0;
  double best_err = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 127; ++c) {  // the non-negative finite codes, in increasing order
    const double err = std::fabs(Fp8Value(static_cast<uint8_t>(c)) - a);
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

// How a test scales its FP8 inputs: no descale (params' NULL), one per tensor, or one per head.
enum class Descale { kNone, kTensor, kHead };
inline const char* DescaleName(Descale d) {
  return d == Descale::kNone ? "nodescale" : d == Descale::kTensor ? "tensorscale" : "headscale";
}

// A [B, S, H, D] float8_e4m3fn tensor on the host and its descale: codes of normal random values
// of standard deviation `spread`, divided by their head's (or the tensor's) scale, which maps the
// largest magnitude to 448 (or by 1 with kNone, where values beyond 448 saturate).
struct Fp8Input {
  std::vector<int64_t> shape;
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // [1] or [H]; empty with kNone
  DLTensor dl{};

  Fp8Input(std::vector<int64_t> s, Descale mode, double spread, std::mt19937_64& rng) : shape(std::move(s)) {
    const int64_t H = shape[2], D = shape[3], rows = shape[0] * shape[1];
    std::normal_distribution<double> nd(0.0, spread);
    std::vector<double> x(static_cast<size_t>(rows * H * D));
    for (double& e : x) e = nd(rng);
    std::vector<double> most(static_cast<size_t>(H), 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      double& m = most[(i / static_cast<size_t>(D)) % static_cast<size_t>(H)];
      m = std::max(m, std::fabs(x[i]));
    }
    if (mode == Descale::kTensor) {
      const double all = *std::max_element(most.begin(), most.end());
      scales.assign(1, static_cast<float>(all / 448.0));
    } else if (mode == Descale::kHead) {
      for (double m : most) scales.push_back(static_cast<float>(m / 448.0));
    }
    codes.resize(x.size());
    for (size_t i = 0; i < x.size(); ++i) codes[i] = Fp8Nearest(x[i] / Scale(i));
    Relink();
  }
  Fp8Input(const Fp8Input&) = delete;
  Fp8Input& operator=(const Fp8Input&) = delete;

  void Relink() {
    dl = DLTensor{};
    dl.data = codes.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = 4;
    dl.dtype = DLDataType{STRIA_DL_FLOAT8_E4M3FN, 8, 1};
    dl.shape = shape.data();
  }
  // The descale of flat element i, as the library multiplies it (in float32).
  double Scale(size_t i) const {
    if (scales.empty()) return 1.0;
    if (scales.size() == 1) return scales[0];
    return scales[(i / static_cast<size_t>(shape[3])) % static_cast<size_t>(shape[2])];
  }
  // The values the attention sees: code times descale, rounded to float32 as the widening rounds.
  std::vector<double> Values() const {
    std::vector<double> v(codes.size());
    for (size_t i = 0; i < codes.size(); ++i)
      v[i] = static_cast<float>(static_cast<float>(Fp8Value(codes[i])) * static_cast<float>(Scale(i)));
    return v;
  }
};

// A rank's FP8 block on the host: room for its codes (NaN until sharded into), the full input's
// descale as a float32 tensor.
struct Fp8Shard {
  std::vector<int64_t> shape;
  std::vector<uint8_t> codes;
  Tensor scale;
  DLTensor dl{};
  Fp8Shard(const Fp8Input& full, int64_t L) : shape(full.shape) {
    shape[1] = L;
    codes.assign(static_cast<size_t>(shape[0] * shape[1] * shape[2] * shape[3]), 0xff);  // NaN until sharded
    dl.data = codes.data();
    dl.device = DLDevice{kDLCPU, 0};
    dl.ndim = 4;
    dl.dtype = full.dl.dtype;
    dl.shape = shape.data();
    if (!full.scales.empty()) {
      scale = Tensor({static_cast<int64_t>(full.scales.size())}, Dt::kF32);
      for (size_t i = 0; i < full.scales.size(); ++i) scale.Set(static_cast<int64_t>(i), full.scales[i]);
    }
  }
  const DLTensor* descale() const { return scale.shape.empty() ? nullptr : &scale.dl; }
};

}  // namespace stria_test
