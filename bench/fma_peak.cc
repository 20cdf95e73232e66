// The physical anchor of the CPU figures: this machine's fp32 FMA throughput, measured with
// independent accumulator chains (enough to cover FMA latency × FMA ports) on every thread at
// once. Built with the widest vectors the compiler may use here (see bench/CMakeLists.txt).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#if defined(__AVX512F__)
constexpr int kVL = 16;
#elif defined(__AVX2__)
constexpr int kVL = 8;
#else
constexpr int kVL = 4;
#endif
typedef float vf __attribute__((vector_size(kVL * 4)));
constexpr int kChains = 16;

static double Run(long iters, float seed) {
  vf acc[kChains];
  vf a = vf{} + (1.0f + seed * 1e-9f), b = vf{} + 0.999999f;
  for (int c = 0; c < kChains; ++c) acc[c] = vf{} + static_cast<float>(c);
  for (long i = 0; i < iters; ++i) {
    for (int c = 0; c < kChains; ++c) acc[c] = acc[c] * b + a;
  }
  float s = 0;
  for (int c = 0; c < kChains; ++c) s += acc[c][0];
  return s;
}

int main(int argc, char** argv) {
  int threads = argc > 1 ? std::atoi(argv[1]) : static_cast<int>(std::thread::hardware_concurrency());
  const long iters = 200000000L / kChains;
  std::vector<double> best(static_cast<size_t>(threads), 0.0);
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> ts;
    std::vector<double> sink(static_cast<size_t>(threads));
    auto t0 = std::chrono::steady_clock::now();
    for (int t = 0; t < threads; ++t) ts.emplace_back([&, t] { sink[static_cast<size_t>(t)] = Run(iters, t); });
    for (auto& t : ts) t.join();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double gflops = 2.0 * kChains * kVL * static_cast<double>(iters) * threads / s / 1e9;
    if (gflops > best[0]) best[0] = gflops;
    if (sink[0] == 12345.f) std::printf("!");
  }
  std::printf("fma_peak threads=%d vector_floats=%d gflops=%.1f\n", threads, kVL, best[0]);
  return 0;
}
