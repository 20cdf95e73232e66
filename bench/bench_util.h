// What the GPU benchmarks share: failing loudly on a CUDA or stria error, option lists, medians.
#pragma once

#include <cuda_runtime_api.h>
#include <stria/stria.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)
#define CHECK_STRIA(x)                                              \
  do {                                                              \
    stria_status_t s_ = (x);                                        \
    if (s_ != STRIA_SUCCESS) {                                      \
      std::fprintf(stderr, "%s: %s\n", #x, stria_get_last_error()); \
      std::exit(1);                                                 \
    }                                                               \
  } while (0)

namespace bench {

inline std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
    if (*p == ',') ++p;
  }
  return v;
}

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace bench
