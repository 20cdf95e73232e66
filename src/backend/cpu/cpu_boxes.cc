#include "backend/cpu/cpu_boxes.h"

#include <cstring>
#include <vector>

#include "core/dtype.h"

namespace stria {
namespace {

// Calls f(row pointer) for each innermost row of `box`, in row-major order; rows are contiguous
// (an attention tensor's last dimension always is).
template <typename F>
void ForEachRow(const TensorView& box, F f) {
  const int outer = box.ndim - 1;
  int64_t rows = 1;
  for (int d = 0; d < outer; ++d) rows *= box.shape[d];
  const int64_t elem = box.elem_bytes();
  int64_t index[kMaxDims] = {};
  for (int64_t i = 0; i < rows; ++i) {
    int64_t offset = 0;
    for (int d = 0; d < outer; ++d) offset += index[d] * box.strides[d];
    f(static_cast<char*>(box.data) + offset * elem);
    for (int d = outer - 1; d >= 0; --d) {
      if (++index[d] < box.shape[d]) break;
      index[d] = 0;
    }
  }
}

float Load(DType t, const char* p) {
  uint16_t h;
  switch (t) {
    case DType::kF16:
      std::memcpy(&h, p, 2);
      return F16ToF32(h);
    case DType::kBF16:
      std::memcpy(&h, p, 2);
      return BF16ToF32(h);
    case DType::kF32:
      break;
  }
  float f;
  std::memcpy(&f, p, 4);
  return f;
}

void Store(DType t, float f, char* p) {
  uint16_t h;
  switch (t) {
    case DType::kF16:
      h = F32ToF16(f);
      std::memcpy(p, &h, 2);
      return;
    case DType::kBF16:
      h = F32ToBF16(f);
      std::memcpy(p, &h, 2);
      return;
    case DType::kF32:
      break;
  }
  std::memcpy(p, &f, 4);
}

}  // namespace

void HostPackBox(const TensorView& box, void* dst) {
  const size_t row = static_cast<size_t>(box.shape[box.ndim - 1] * box.elem_bytes());
  char* to = static_cast<char*>(dst);
  ForEachRow(box, [&](const char* p) {
    std::memcpy(to, p, row);
    to += row;
  });
}

void HostSumIntoBox(const void* src, size_t src_step, int count, const TensorView& box) {
  const int64_t width = box.shape[box.ndim - 1], elem = box.elem_bytes();
  const size_t row = static_cast<size_t>(width * elem);
  const char* from = static_cast<const char*>(src);
  size_t packed = 0;
  if (count == 1) {
    ForEachRow(box, [&](char* p) {
      std::memcpy(p, from + packed, row);
      packed += row;
    });
    return;
  }
  std::vector<float> acc(static_cast<size_t>(width));
  ForEachRow(box, [&](char* p) {
    for (float& a : acc) a = 0.f;
    for (int k = 0; k < count; ++k)
      for (int64_t j = 0; j < width; ++j)
        acc[static_cast<size_t>(j)] += Load(box.dtype, from + k * src_step + packed + j * elem);
    for (int64_t j = 0; j < width; ++j) Store(box.dtype, acc[static_cast<size_t>(j)], p + j * elem);
    packed += row;
  });
}

}  // namespace stria
