// The blocked tile transpose shared by the CPU backend and the per-ISA packing (pack.cc).
#pragma once

#include <algorithm>
#include <cstdint>

#include "cpu/attention_kernels.h"

namespace stria {
namespace cpu {

// src [kBlockK][ld] -> dst [ld][kBlockK], elements moved as they are, in 16 x 16 blocks that
// stay in L1.
template <typename T>
inline void BlockedTranspose(const T* __restrict src, int64_t ld, T* __restrict dst) {
  constexpr int64_t kB = 16;
  for (int64_t d0 = 0; d0 < ld; d0 += kB) {
    const int64_t d1 = std::min(ld, d0 + kB);
    for (int64_t c0 = 0; c0 < kBlockK; c0 += kB)
      for (int64_t d = d0; d < d1; ++d)
        for (int64_t c = c0; c < c0 + kB; ++c) dst[d * kBlockK + c] = src[c * ld + d];
  }
}

}  // namespace cpu
}  // namespace stria
