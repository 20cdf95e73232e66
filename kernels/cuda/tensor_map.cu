// The host side of TMA (tma_api.cuh): tensor maps from the driver's cuTensorMapEncodeTiled. The
// module links only the CUDA runtime, not libcuda, so the driver function is looked up once per
// process (DriverSymbol). (The emulator's build has its own EncodeRowsMap, in tests/cuda_emu.)
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <atomic>

#include "cuda/driver_symbol.h"
#include "cuda/tma_api.cuh"

namespace stria {
namespace cuda {
namespace {

// Maps not made: each one sent a block to the cp.async kernel (TmaMapFailures).
std::atomic<uint64_t> tma_fallbacks{0};

static_assert(sizeof(TensorMap) == sizeof(CUtensorMap) && alignof(TensorMap) == alignof(CUtensorMap),
              "TensorMap must be a CUtensorMap");

// Null when this driver has no tensor maps (older than CUDA 12): the caller falls back.
PFN_cuTensorMapEncodeTiled_v12000 Encoder() {
  static const auto fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(DriverSymbol("cuTensorMapEncodeTiled"));
  return fn;
}

bool Encode(TensorMap* map, const void* base, int B, int L, int H, int D, int64_t sb, int64_t sl, int64_t sh,
            int box_rows) {
  if (D % 64 != 0 || box_rows < 1 || box_rows > 256 || B < 1 || L < 1 || H < 1) return false;
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return false;
  const PFN_cuTensorMapEncodeTiled_v12000 encode = Encoder();
  if (encode == nullptr) return false;
  // Innermost first: columns, heads, rows, batch. A dimension of extent 1 is never stepped along,
  // so its stride is the caller's to leave arbitrary (0, say): it gets the compact value instead,
  // the previous dimension's stride times its extent (what the driver's examples use).
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(D), static_cast<cuuint64_t>(H), static_cast<cuuint64_t>(L),
                              static_cast<cuuint64_t>(B)};
  const int64_t given[3] = {sh, sl, sb};
  cuuint64_t strides[3];
  int64_t compact = int64_t{D} * 2;  // bytes
  for (int i = 0; i < 3; ++i) {
    int64_t s = compact;
    if (dims[i + 1] != 1 && __builtin_mul_overflow(given[i], int64_t{2}, &s)) return false;
    if (s <= 0 || s % 16 != 0 || s >= (int64_t{1} << 40)) return false;
    strides[i] = static_cast<cuuint64_t>(s);
    if (__builtin_mul_overflow(s, static_cast<int64_t>(dims[i + 1]), &compact)) return false;
  }
  const cuuint32_t box[4] = {64, 1, static_cast<cuuint32_t>(box_rows), 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult r =
      encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_UINT16, 4, const_cast<void*>(base), dims,
             strides, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS;
}

}  // namespace

bool EncodeRowsMap(TensorMap* map, const void* base, int B, int L, int H, int D, int64_t sb, int64_t sl, int64_t sh,
                   int box_rows) {
  const bool ok = Encode(map, base, B, L, H, D, sb, sl, sh, box_rows);
  if (!ok) tma_fallbacks.fetch_add(1, std::memory_order_relaxed);
  return ok;
}

uint64_t TmaMapFailures() {
  return tma_fallbacks.load(std::memory_order_relaxed);
}

}  // namespace cuda
}  // namespace stria
