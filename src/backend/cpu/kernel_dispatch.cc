// Picks the CPU kernel build for this machine once, on first use (never in a global
// constructor: the library must be dlopen-safe).
#include <cstdlib>
#include <cstring>

#include "cpu/attention_kernels.h"

namespace stria {
namespace cpu {
namespace generic {
extern const KernelTable kTable;
}
namespace avx2 {
extern const KernelTable kTable;
}
namespace avx512 {
extern const KernelTable kTable;
}

static bool Supports(const char* isa) {
  __builtin_cpu_init();
  if (std::strcmp(isa, "generic") == 0) return true;
  if (std::strcmp(isa, "avx2") == 0)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (std::strcmp(isa, "avx512") == 0)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("f16c");
  return false;
}

const KernelTable* KernelsFor(const char* isa) {
  if (isa == nullptr || !Supports(isa)) return nullptr;
  if (std::strcmp(isa, "avx512") == 0) return &avx512::kTable;
  if (std::strcmp(isa, "avx2") == 0) return &avx2::kTable;
  return &generic::kTable;
}

const KernelTable& SelectKernels() {
  static const KernelTable* chosen = [] {
    const char* forced = std::getenv("STRIA_CPU_ISA");
    if (forced && *forced) {
      if (const KernelTable* t = KernelsFor(forced)) return t;
    }
    for (const char* isa : {"avx512", "avx2"}) {
      if (const KernelTable* t = KernelsFor(isa)) return t;
    }
    return &generic::kTable;
  }();
  return *chosen;
}

}  // namespace cpu
}  // namespace stria
