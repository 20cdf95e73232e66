// Versioned structs (DESIGN.md: "the struct may grow"): a caller compiled against an older
// header passes a smaller struct_size, a newer one a larger. We need at least the fields we
// read; bytes beyond the fields we know must be zero, since a newer caller that set them expects
// behaviour this library does not have.
#pragma once

#include <cstddef>

#include "core/status.h"

namespace stria {

inline Status CheckStructSize(const void* s, size_t struct_size, size_t known, const char* name, const char* init) {
  if (struct_size < known)
    return Error(STRIA_ERROR_INVALID_ARGUMENT,
                 "%s->struct_size is %zu but this library needs at least %zu: set it to sizeof(*%s), or call %s", name,
                 struct_size, known, name, init);
  if (struct_size > (1u << 16))
    return Error(STRIA_ERROR_INVALID_ARGUMENT, "%s->struct_size %zu is implausible: was it initialised (%s)?", name,
                 struct_size, init);
  const unsigned char* bytes = static_cast<const unsigned char*>(s);
  for (size_t i = known; i < struct_size; ++i) {
    if (bytes[i] != 0)
      return Error(STRIA_ERROR_UNSUPPORTED,
                   "%s sets fields beyond the %zu bytes this library version knows (struct_size %zu): the caller was "
                   "built against a newer stria",
                   name, known, struct_size);
  }
  return Status::Ok();
}

}  // namespace stria
