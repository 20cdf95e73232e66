// C callers may pass any int where the ABI names an enum; in C++ merely loading an out-of-range
// enum value is undefined (UBSan's -fsanitize=enum flags it). So the C layer reads enum
// arguments as raw integers and validates them before converting.
#pragma once

#include <cstring>

namespace stria {

template <typename E>
inline int RawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(int), "ABI enums are int-sized");
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

inline bool ValidLayout(int v) {
  return v >= 0 && v <= 2;
}
inline bool ValidTransport(int v) {
  return v >= 0 && v <= 2;
}

}  // namespace stria
