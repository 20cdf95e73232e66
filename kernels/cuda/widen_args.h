// The FP8 widening kernel's arguments (WidenFp8Kernel, elementwise.cuh): a header of its own, so
// that the kernel's includers need no CUDA runtime header and params.h stays as every unit has it.
#pragma once

#include <cstdint>

namespace stria {
namespace cuda {

// A float8_e4m3fn tensor of n0 x n1 x n2 rows of w values (its strides ss0..ss2, in bytes, which
// are its elements) into a compact tensor at dst, each value times its row's head descale:
// descale[i2 * descale_step], or 1 where descale is NULL (descale_step 0: one scale for all).
struct WidenArgs {
  int64_t n0, n1, n2, w;
  const unsigned char* src;
  int64_t ss0, ss1, ss2;
  const float* descale;
  int64_t descale_step;
  void* dst;
};

}  // namespace cuda
}  // namespace stria
