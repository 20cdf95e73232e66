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

namespace {

// DLPack's type codes in order, named as dlpack.h 1.1 names them: the dlpack.h we build with may
// predate the codes from 6 on (torch exports its bool tensors as code 6). `bits` is the width a
// name already says (the small float types), 0 where the width follows the name ("float32").
constexpr struct {
  const char* name;
  int bits;
} kDLTypeNames[] = {
    {"int", 0},
    {"uint", 0},
    {"float", 0},
    {"opaque", 0},
    {"bfloat", 0},
    {"complex", 0},
    {"bool", 0},
    {"float8_e3m4", 8},
    {"float8_e4m3", 8},
    {"float8_e4m3b11fnuz", 8},
    {"float8_e4m3fn", 8},
    {"float8_e4m3fnuz", 8},
    {"float8_e5m2", 8},
    {"float8_e5m2fnuz", 8},
    {"float8_e8m0fnu", 8},
    {"float6_e2m3fn", 6},
    {"float6_e3m2fn", 6},
    {"float4_e2m1fn", 4},
};
static_assert(kDLInt == 0 && kDLUInt == 1 && kDLFloat == 2 && kDLOpaqueHandle == 3 && kDLBfloat == 4 && kDLComplex == 5,
              "kDLTypeNames follows DLPack's numbering");

}  // namespace

const char* DLDataTypeName(DLDataType dt, char* buf, int buflen) {
  const auto size = static_cast<size_t>(buflen);
  const int bits = dt.bits;
  const char* base = "unknown";
  int named_bits = 0;
  if (dt.code < sizeof kDLTypeNames / sizeof kDLTypeNames[0]) {
    base = kDLTypeNames[dt.code].name;
    named_bits = kDLTypeNames[dt.code].bits;
  }
  char lanes[16] = "";
  if (dt.lanes != 1) std::snprintf(lanes, sizeof lanes, "x%d", static_cast<int>(dt.lanes));
  if (named_bits == 0) {
    std::snprintf(buf, size, "%s%d%s", base, bits, lanes);
  } else if (bits == named_bits) {
    std::snprintf(buf, size, "%s%s", base, lanes);
  } else {  // not a width DLPack specifies for this type: say what it claims
    std::snprintf(buf, size, "%s%s (%d bits)", base, lanes, bits);
  }
  return buf;
}

}  // namespace stria
