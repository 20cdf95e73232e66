#include "core/dtype.h"

#include <cstdio>

namespace stria {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
  }
  return "?";
}

bool DTypeFromDL(DLDataType dt, DType* out) {
  if (dt.lanes != 1) return false;
  if (dt.code == kDLFloat && dt.bits == 32) {
    *out = DType::kF32;
  } else if (dt.code == kDLFloat && dt.bits == 16) {
    *out = DType::kF16;
  } else if (dt.code == kDLBfloat && dt.bits == 16) {
    *out = DType::kBF16;
  } else {
    return false;
  }
  return true;
}

const char* DLDataTypeName(DLDataType dt, char* buf, int buflen) {
  const char* base = "unknown";
  switch (dt.code) {
    case kDLInt:
      base = "int";
      break;
    case kDLUInt:
      base = "uint";
      break;
    case kDLFloat:
      base = "float";
      break;
    case kDLBfloat:
      base = "bfloat";
      break;
    case kDLComplex:
      base = "complex";
      break;
    case kDLOpaqueHandle:
      base = "opaque";
      break;
    default:
      break;
  }
  if (dt.lanes == 1) {
    std::snprintf(buf, static_cast<size_t>(buflen), "%s%d", base, static_cast<int>(dt.bits));
  } else {
    std::snprintf(buf, static_cast<size_t>(buflen), "%s%dx%d", base, static_cast<int>(dt.bits),
                  static_cast<int>(dt.lanes));
  }
  return buf;
}

}  // namespace stria
