// The CPU kernels' tanh (kernels/cpu/simd.h: Tanh, TanhFast) over an array, built once per
// instruction set like the kernels themselves (tests/CMakeLists.txt), for test_cpu_tanh.
#include <cstring>

#include "cpu/simd.h"

#define STRIA_PROBE_NAME_(isa) stria_tanh_probe_##isa
#define STRIA_PROBE_NAME(isa) STRIA_PROBE_NAME_(isa)

namespace isa = stria::cpu::STRIA_ISA_NAME;

// n a multiple of the vector length (16 covers every build).
extern "C" void STRIA_PROBE_NAME(STRIA_ISA_NAME)(const float* x, int n, float* fast, float* accurate) {
  for (int i = 0; i < n; i += isa::VL) {
    const isa::vf v = isa::Load(x + i);
    isa::Store(fast + i, isa::TanhFast(v));
    isa::Store(accurate + i, isa::Tanh(v));
  }
}
