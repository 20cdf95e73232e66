// The CPU kernels' tanh against the C library's, in each instruction set's build that this machine
// runs: Tanh (the float32 kernels' softcap) within 5e-7 relative, TanhFast (the bf16 kernels')
// within 3e-7 absolute and never past 1 by more than 2e-6; the sign right, saturating, NaN kept.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

extern "C" void stria_tanh_probe_generic(const float* x, int n, float* fast, float* accurate);
extern "C" void stria_tanh_probe_avx512(const float* x, int n, float* fast, float* accurate);

namespace {

void Check(void (*probe)(const float*, int, float*, float*), const std::string& isa) {
  SCOPED_TRACE(isa);
  std::vector<float> x;
  for (int i = -400000; i < 400000; ++i) x.push_back(static_cast<float>(i) * 5e-5f);  // [-20, 20)
  for (float v : {0.f, -0.f, 1e-30f, -1e-30f, 8.5f, -8.5f, 9.f, 50.f, -1e30f, INFINITY, -INFINITY, NAN}) x.push_back(v);
  while (x.size() % 16 != 0) x.push_back(0.5f);
  std::vector<float> fast(x.size()), accurate(x.size());
  probe(x.data(), static_cast<int>(x.size()), fast.data(), accurate.data());
  double worst_fast = 0, worst_accurate = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(fast[i]) && std::isnan(accurate[i])) << "NaN in, " << fast[i] << " / " << accurate[i];
      continue;
    }
    const double want = std::tanh(static_cast<double>(x[i]));
    worst_fast = std::max(worst_fast, std::fabs(fast[i] - want));
    if (want != 0) worst_accurate = std::max(worst_accurate, std::fabs(accurate[i] - want) / std::fabs(want));
    EXPECT_LE(std::fabs(fast[i]), 1.0 + 2e-6) << "x " << x[i];
    // The sign where it is more than the error bound (TanhFast is accurate in absolute terms only).
    if (std::fabs(want) > 3e-7) {
      EXPECT_EQ(std::signbit(fast[i]), std::signbit(x[i])) << "x " << x[i];
    }
    if (x[i] != 0) {
      EXPECT_EQ(std::signbit(accurate[i]), std::signbit(x[i])) << "x " << x[i];
    }
  }
  EXPECT_LT(worst_fast, 3e-7) << "TanhFast, absolute";
  EXPECT_LT(worst_accurate, 5e-7) << "Tanh, relative";
}

TEST(CpuTanh, GenericBuild) {
  Check(stria_tanh_probe_generic, "generic");
}

TEST(CpuTanh, Avx512Build) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "no AVX-512 on this CPU";
  Check(stria_tanh_probe_avx512, "avx512");
}

}  // namespace
