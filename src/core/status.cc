#include "core/status.h"

#include <cstdarg>
#include <cstdio>

namespace stria {

static std::string VFormat(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  if (n <= 0) return std::string();
  std::string out(static_cast<size_t>(n) + 1, '\0');
  std::vsnprintf(&out[0], out.size(), fmt, args);
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string Format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = VFormat(fmt, args);
  va_end(args);
  return s;
}

Status Error(stria_status_t code, const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string s = VFormat(fmt, args);
  va_end(args);
  return Status(code, std::move(s));
}

}  // namespace stria
