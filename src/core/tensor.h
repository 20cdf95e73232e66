// A checked, non-owning view of a DLTensor: the pointer with byte_offset applied, the dtype, and
// shape/strides in elements (compact row-major strides filled in when DLPack gives NULL).
#pragma once

#include <cstdint>

#include <dlpack/dlpack.h>

#include "core/dtype.h"
#include "core/status.h"

namespace stria {

constexpr int kMaxDims = 8;

struct TensorView {
  void* data = nullptr;
  DLDataType dl_dtype{};
  DType dtype = DType::kF32;  // valid only for floating attention tensors
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements

  int64_t numel() const;
  int64_t elem_bytes() const { return (dl_dtype.bits * dl_dtype.lanes + 7) / 8; }
  // Pointer to element with the given index tuple (length ndim).
  char* at(const int64_t* index) const;
};

// Generic checks shared by every entry point: non-NULL, 1..kMaxDims dims, non-negative shape,
// whole-byte element type, aligned data, a device equal to `device` (`whose_device` names where
// that device comes from, for the message).
Status ViewOf(const DLTensor* t, const char* name, DLDevice device, TensorView* out,
              const char* whose_device = "the context's device");

// ViewOf plus: exactly `ndim` dims, a float32/float16/bfloat16 dtype (or exactly float32 if
// `float32_only`), and a contiguous last dimension.
// `fp8_as` (a forward's FP8 inputs that the backend takes as they are): float8_e4m3fn is accepted
// too, the view's dtype then set to *fp8_as (the call's dtype; dl_dtype stays the tensor's).
Status AttentionTensor(const DLTensor* t, const char* name, int ndim, DLDevice device, bool float32_only,
                       TensorView* out, const DType* fp8_as = nullptr);

// What a call writes may not be a broadcast view (stride 0 along a dimension of size > 1, as
// torch's expand makes): several elements would land on one, and the result would be whichever
// was written last. Refused rather than silently wrong. (Other overlapping strides are as rare
// as they are costly to detect exactly, and are not looked for, as in PyTorch.)
Status CheckNoBroadcast(const TensorView& v, const char* name);
std::string ShapeString(const TensorView& v);
const char* DeviceName(DLDevice d, char* buf, int buflen);

}  // namespace stria
