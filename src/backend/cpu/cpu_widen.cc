#include "backend/cpu/cpu_widen.h"

#include <array>

#include "common/float8.h"

namespace stria {
namespace {

// All 256 codes decoded once: the widening is then a table lookup and a multiply per value.
const std::array<float, 256>& Float8Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = Float8E4M3ToF32(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

template <typename Store>
void WidenRows(ThreadPool& pool, const TensorView& src, const TensorView* descale, Store store) {
  const int64_t B = src.shape[0], L = src.shape[1], H = src.shape[2], D = src.shape[3];
  const float* table = Float8Table().data();
  const float* scales = descale != nullptr ? static_cast<const float*>(descale->data) : nullptr;
  const int64_t per_head = descale != nullptr && descale->shape[0] > 1 ? 1 : 0;
  pool.ParallelFor(B * L, [&](int64_t item, int) {
    const int64_t b = item / L, l = item % L;
    for (int64_t h = 0; h < H; ++h) {
      const auto* from =
          static_cast<const uint8_t*>(src.data) + b * src.strides[0] + l * src.strides[1] + h * src.strides[2];
      const float scale = scales != nullptr ? scales[h * per_head] : 1.f;
      const int64_t to = ((b * L + l) * H + h) * D;
      for (int64_t d = 0; d < D; ++d) store(to + d, table[from[d]] * scale);
    }
  });
}

}  // namespace

void HostWidenFp8(ThreadPool& pool, const TensorView& src, const TensorView* descale, DType to, void* dst) {
  switch (to) {
    case DType::kF32:
      WidenRows(pool, src, descale, [dst](int64_t i, float x) { static_cast<float*>(dst)[i] = x; });
      return;
    case DType::kF16:
      WidenRows(pool, src, descale, [dst](int64_t i, float x) { static_cast<uint16_t*>(dst)[i] = F32ToF16(x); });
      return;
    case DType::kBF16:
      WidenRows(pool, src, descale, [dst](int64_t i, float x) { static_cast<uint16_t*>(dst)[i] = F32ToBF16(x); });
      return;
  }
}

}  // namespace stria
