// Picks the CPU kernel build for a context when it is created (never in a global constructor:
// the library must be dlopen-safe).
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
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
namespace avx512bf16 {
extern const KernelTable kTable;
}
namespace amx {
extern const KernelTable kTable;
}

// CPUID leaf 7: AMX-BF16 (EDX bit 22) and AMX-TILE (EDX bit 24) in subleaf 0, AVX512-BF16 (EAX
// bit 5) in subleaf 1. Read directly: not every compiler's __builtin_cpu_supports knows them.
static bool CpuHasAvx512Bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1);
}
static bool CpuHasAmxBf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 22 & 1) && (d >> 24 & 1) && CpuHasAvx512Bf16();
}

// Linux hands out AMX tile state only to a process that asks for it (arch_prctl
// ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, process-wide, once); a refusal (an old kernel, or
// a thread's alternate signal stack too small for the larger signal frame) means no AMX here.
static bool AmxPermitted() {
  static const bool permitted = [] {
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return permitted;
}

static bool Supports(const char* isa) {
  __builtin_cpu_init();
  if (std::strcmp(isa, "generic") == 0) return true;
  if (std::strcmp(isa, "avx2") == 0)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                      __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (std::strcmp(isa, "avx512") == 0) return avx512;
  if (std::strcmp(isa, "avx512bf16") == 0) return avx512 && CpuHasAvx512Bf16();
  if (std::strcmp(isa, "amx") == 0) return avx512 && CpuHasAmxBf16() && AmxPermitted();
  return false;
}

const KernelTable* KernelsFor(const char* isa) {
  if (isa == nullptr || !Supports(isa)) return nullptr;
  if (std::strcmp(isa, "amx") == 0) return &amx::kTable;
  if (std::strcmp(isa, "avx512bf16") == 0) return &avx512bf16::kTable;
  if (std::strcmp(isa, "avx512") == 0) return &avx512::kTable;
  if (std::strcmp(isa, "avx2") == 0) return &avx2::kTable;
  return &generic::kTable;
}

ForcedIsa CheckForcedIsa(char* why, int size) {
  const char* forced = std::getenv("STRIA_CPU_ISA");
  if (forced == nullptr || *forced == '\0') return ForcedIsa::kOk;
  for (const char* isa : {"generic", "avx2", "avx512", "avx512bf16", "amx"}) {
    if (std::strcmp(forced, isa) != 0) continue;
    if (KernelsFor(isa) != nullptr) return ForcedIsa::kOk;
    std::snprintf(why, static_cast<size_t>(size), "STRIA_CPU_ISA=%s: this CPU cannot run the %s kernels", isa, isa);
    return ForcedIsa::kUnsupported;
  }
  std::snprintf(why, static_cast<size_t>(size),
                "STRIA_CPU_ISA=\"%.32s\" is not a kernel build: use generic, avx2, avx512, avx512bf16 or amx, or "
                "leave it unset",
                forced);
  return ForcedIsa::kUnknown;
}

// Read at every context's creation, as CheckForcedIsa is: a choice made once per process would
// keep the first context's build for every later one, so a program (a test, a benchmark) that
// forces another build later would silently run the first. CPUID and getenv cost nothing next
// to a context.
//
// Without AMX, where bf16 products run on VDPBF16PS depends on the vendor. AMD's Zen 4 and 5 issue
// it at the rate of a float32 FMA with twice the multiply-adds, and the avx512bf16 build measured
// 1.5-3x the float32 kernels' on bf16 inputs. Intel's server cores (Cooper Lake to Emerald Rapids)
// issue it on one port where FMAs have two, so it only matches the FMAs' peak, and the bf16
// kernels' pairing costs more than the conversion it saves: on an Emerald Rapids (its AMX not
// exposed) the avx512 build ran bf16 calls 1.35-1.8x faster, a ring's steps converting each bf16
// message included (docs/design/cpu-kernels.md, "bf16 without AMX"). float32 calls run the same
// code in either build.
const KernelTable& SelectKernels() {
  const char* forced = std::getenv("STRIA_CPU_ISA");
  if (forced && *forced) {
    if (const KernelTable* t = KernelsFor(forced)) return *t;
  }
  __builtin_cpu_init();
  const bool intel = __builtin_cpu_is("intel");
  for (const char* isa : {"amx", intel ? "avx512" : "avx512bf16", intel ? "avx512bf16" : "avx512", "avx2"}) {
    if (const KernelTable* t = KernelsFor(isa)) return *t;
  }
  return generic::kTable;
}

}  // namespace cpu
}  // namespace stria
