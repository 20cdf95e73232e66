// Launcher of the tensor-core decode kernel (decode_mma.cuh), a translation unit of its own so that
// its instantiations build beside the SIMT decode's.
#include <cuda_runtime.h>

#include "cuda/decode_launch.h"
#include "cuda/decode_mma.cuh"
#include "cuda/smem_optin.cuh"

namespace stria {
namespace cuda {

namespace {

template <typename T, int D, bool kWide>
cudaError_t LaunchDecodeMmaOf(const DecodeArgs& a, int64_t items, cudaStream_t s) {
  using Tile = DecodeMmaTile<D, kWide>;
  void (*kernel)(DecodeArgs) = DecodeMmaKernel<T, D, kWide>;
  const cudaError_t allowed = AllowSmem(kernel, Tile::kSmemBytes);
  if (allowed != cudaSuccess) return allowed;
  const int rows = a.T * (a.Hq / a.Hkv);
  const dim3 grid(static_cast<unsigned>(items), static_cast<unsigned>(a.Hkv),
                  static_cast<unsigned>((rows + Tile::kRows - 1) / Tile::kRows));
  return STRIA_LAUNCH(kernel, grid, Tile::kThreads, Tile::kSmemBytes, s)(a);
}

// The narrow form for up to 16 rows per K/V head, the wide one above (DecodeMmaRowsPerCta).
template <typename T, int D>
cudaError_t LaunchDecodeMmaRows(const DecodeArgs& a, int64_t items, cudaStream_t s) {
  const int rows = a.T * (a.Hq / a.Hkv);
  return DecodeMmaRowsPerCta(rows) == kDecodeMmaWideRows ? LaunchDecodeMmaOf<T, D, true>(a, items, s)
                                                         : LaunchDecodeMmaOf<T, D, false>(a, items, s);
}

template <typename T>
cudaError_t LaunchDecodeMmaDims(const DecodeArgs& a, int64_t items, cudaStream_t s) {
  switch (a.D) {
    case 64:
      return LaunchDecodeMmaRows<T, 64>(a, items, s);
    case 128:
      return LaunchDecodeMmaRows<T, 128>(a, items, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchDecodeMma(Elem e, const DecodeArgs& a, int64_t items, cudaStream_t s) {
  if (items == 0) return cudaSuccess;
  const int rows = a.T * (a.Hq / a.Hkv);
  if (items > 0x7fffffff || a.Hkv > 65535 || (rows + kDecodeMmaRows - 1) / kDecodeMmaRows > 65535)
    return cudaErrorInvalidValue;
  switch (e) {
    case Elem::kF16:
      return LaunchDecodeMmaDims<Half>(a, items, s);
    case Elem::kBF16:
      return LaunchDecodeMmaDims<BFloat>(a, items, s);
    case Elem::kF32:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace cuda
}  // namespace stria
