#include "core/tensor.h"

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/raw_enum.h"

namespace stria {

int64_t TensorView::numel() const {
  // An empty tensor may have other dimensions too large to multiply (CheckExtent bounds only the
  // non-empty ones): zero first.
  for (int i = 0; i < ndim; ++i)
    if (shape[i] == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < ndim; ++i) n *= shape[i];
  return n;
}

char* TensorView::at(const int64_t* index) const {
  int64_t off = 0;
  for (int i = 0; i < ndim; ++i) off += index[i] * strides[i];
  return static_cast<char*>(data) + off * elem_bytes();
}

Status CheckNoBroadcast(const TensorView& v, const char* name) {
  for (int i = 0; i < v.ndim; ++i)
    if (v.shape[i] > 1 && v.strides[i] == 0)
      return Error(STRIA_ERROR_INVALID_ARGUMENT,
                   "%s has stride 0 in dimension %d (of size %lld): the elements of an output must not overlap", name,
                   i, static_cast<long long>(v.shape[i]));
  return Status::Ok();
}

std::string ShapeString(const TensorView& v) {
  std::string s = "[";
  for (int i = 0; i < v.ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(v.shape[i]);
  }
  return s + "]";
}

const char* DeviceName(DLDevice d, char* buf, int buflen) {
  const char* kind = "device";
  switch (RawEnum(d.device_type)) {
    case kDLCPU:
      kind = "cpu";
      break;
    case kDLCUDA:
      kind = "cuda";
      break;
    case kDLCUDAHost:
      kind = "cuda_host";
      break;
    case kDLCUDAManaged:
      kind = "cuda_managed";
      break;
    case kDLROCM:
      kind = "rocm";
      break;
    case kDLVulkan:
      kind = "vulkan";
      break;
    case kDLMetal:
      kind = "metal";
      break;
    default:  // not one stria knows: its number
      std::snprintf(buf, static_cast<size_t>(buflen), "device type %d:%d", RawEnum(d.device_type), d.device_id);
      return buf;
  }
  std::snprintf(buf, static_cast<size_t>(buflen), "%s:%d", kind, d.device_id);
  return buf;
}

namespace {

// No tensor may hold or span more than this many bytes (a pebibyte: beyond any machine's
// memory). Below it, every size and offset computed from shapes and strides later on (element
// counts, workspaces of a few times a tensor, packing loops) fits int64 without a check.
constexpr int64_t kMaxTensorBytes = int64_t{1} << 50;

// The element count and the farthest element the strides reach, both in bytes and without
// overflow: shapes like [2^62, 4, 2, 8] or a stride of 2^62 would otherwise wrap to small sizes
// and let the backend read and write past the caller's buffers.
Status CheckExtent(const TensorView& v, const char* name) {
  for (int i = 0; i < v.ndim; ++i)
    if (v.shape[i] == 0) return Status::Ok();  // empty: no element is ever addressed
  int64_t count = 1, reach = 0;                // reach: the largest |offset| of an element, in elements
  bool overflow = false;
  for (int i = 0; i < v.ndim && !overflow; ++i) {
    const int64_t stride = v.strides[i];
    int64_t span = 0;
    overflow = __builtin_mul_overflow(count, v.shape[i], &count) || stride == INT64_MIN ||
               __builtin_mul_overflow(v.shape[i] - 1, stride < 0 ? -stride : stride, &span) ||
               __builtin_add_overflow(reach, span, &reach);
  }
  const int64_t elem = v.elem_bytes();
  int64_t count_bytes = 0, reach_bytes = 0;
  overflow = overflow || __builtin_mul_overflow(count, elem, &count_bytes) ||
             __builtin_mul_overflow(reach + 1, elem, &reach_bytes);
  if (overflow || count_bytes > kMaxTensorBytes || reach_bytes > kMaxTensorBytes)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "%s with shape %s is too large: its elements or the memory its strides span exceed 2^50 bytes", name,
                 ShapeString(v).c_str());
  return Status::Ok();
}

}  // namespace

Status ViewOf(const DLTensor* t, const char* name, DLDevice device, TensorView* out, const char* whose_device) {
  if (t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  if (t->ndim < 1 || t->ndim > kMaxDims)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has ndim %d (expected 1..%d)", name, t->ndim, kMaxDims);
  if (t->shape == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has a NULL shape", name);
  if (t->dtype.lanes < 1 || t->dtype.bits == 0 || (t->dtype.bits * t->dtype.lanes) % 8 != 0) {
    char b[32];
    return Error(STRIA_ERROR_UNSUPPORTED, "%s has dtype %s, which is not a whole number of bytes", name,
                 DLDataTypeName(t->dtype, b, sizeof b));
  }
  if (RawEnum(t->device.device_type) != RawEnum(device.device_type) || t->device.device_id != device.device_id) {
    char a[32], b[32];
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s is on %s but must be on %s (%s)", name,
                 DeviceName(t->device, a, sizeof a), DeviceName(device, b, sizeof b), whose_device);
  }
  TensorView v;
  v.dl_dtype = t->dtype;
  v.ndim = t->ndim;
  int64_t expect = 1;
  for (int i = t->ndim - 1; i >= 0; --i) {
    if (t->shape[i] < 0) return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has negative dimension %d", name, i);
    v.shape[i] = t->shape[i];
    // The stride of a dimension of size 1 never moves to another element, and DLPack lets it
    // be anything (torch gives views such strides): the compact value instead, so that no
    // offset computed from it (a batch row's byte stride, say) can overflow.
    v.strides[i] = t->strides && t->shape[i] != 1 ? t->strides[i] : expect;
    // May wrap for absurd shapes; CheckExtent then rejects the tensor (its count overflows too).
    (void)__builtin_mul_overflow(expect, t->shape[i] > 0 ? t->shape[i] : 1, &expect);
  }
  int64_t elem = v.elem_bytes();
  STRIA_RETURN_IF_ERROR(CheckExtent(v, name));
  if (v.numel() == 0) {
    v.data = t->data;  // addresses nothing: byte_offset may be anything, data NULL
    *out = v;
    return Status::Ok();
  }
  if (t->data == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has NULL data", name);
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data);
  if (t->byte_offset > UINTPTR_MAX - base)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s: data + byte_offset %llu wraps around the address space", name,
                 static_cast<unsigned long long>(t->byte_offset));
  v.data = reinterpret_cast<char*>(base + t->byte_offset);
  int64_t align = elem >= 8 ? 8 : elem;
  if (reinterpret_cast<uintptr_t>(v.data) % static_cast<uintptr_t>(align) != 0)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s data (with byte_offset %llu) is not aligned to %lld bytes", name,
                 static_cast<unsigned long long>(t->byte_offset), static_cast<long long>(align));
  *out = v;
  return Status::Ok();
}

Status AttentionTensor(const DLTensor* t, const char* name, int ndim, DLDevice device, bool float32_only,
                       TensorView* out, const DType* fp8_as) {
  if (t == nullptr) return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s is NULL", name);
  if (t->ndim != ndim)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has ndim %d, expected %d (%s)", name, t->ndim, ndim,
                 ndim == 4 ? "[B, L, H, D]" : "[B, H, L]");
  STRIA_RETURN_IF_ERROR(ViewOf(t, name, device, out));
  char b[32];
  if (float32_only) {
    if (!(t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1))
      return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has dtype %s, expected float32", name,
                   DLDataTypeName(t->dtype, b, sizeof b));
    out->dtype = DType::kF32;
  } else if (fp8_as != nullptr && IsFloat8E4M3(t->dtype)) {
    out->dtype = *fp8_as;
  } else if (!DTypeFromDL(t->dtype, &out->dtype)) {
    if (IsFloat8E4M3(t->dtype))
      return Error(STRIA_ERROR_UNSUPPORTED,
                   "%s has dtype float8_e4m3fn, which only stria_attention_forward takes (as q, k and v, with "
                   "out float32, float16 or bfloat16); here: float32, float16, bfloat16",
                   name);
    return Error(STRIA_ERROR_UNSUPPORTED, "%s has dtype %s; supported: float32, float16, bfloat16", name,
                 DLDataTypeName(t->dtype, b, sizeof b));
  }
  // An empty tensor addresses nothing (numpy gives them zero strides): its shape says what is wrong.
  if (out->numel() > 0 && out->shape[ndim - 1] > 1 && out->strides[ndim - 1] != 1)
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s has stride %lld in its last dimension; it must be contiguous (1)",
                 name, static_cast<long long>(out->strides[ndim - 1]));
  return Status::Ok();
}

}  // namespace stria
