// A grow-only, 64-byte aligned host buffer: workspaces are sized by the first call of a shape
// and then reused, so steady-state calls allocate nothing.
#pragma once

#include <cstddef>
#include <cstdlib>

#include "core/status.h"

namespace stria {

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer() { std::free(data_); }
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Makes room for `bytes`; the contents are undefined after growing.
  Status Reserve(size_t bytes, const char* what) {
    if (bytes <= capacity_) return Status::Ok();
    std::free(data_);
    data_ = nullptr;
    capacity_ = 0;
    size_t rounded = (bytes + 63) & ~static_cast<size_t>(63);
    if (posix_memalign(&data_, 64, rounded) != 0 || data_ == nullptr) {
      data_ = nullptr;
      return Error(STRIA_ERROR_OUT_OF_MEMORY, "cannot allocate %zu bytes for %s", rounded, what);
    }
    capacity_ = rounded;
    return Status::Ok();
  }
  float* f32() const { return static_cast<float*>(data_); }
  uint16_t* bf16() const { return static_cast<uint16_t*>(data_); }
  void* data() const { return data_; }
  size_t capacity() const { return capacity_; }

 private:
  void* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace stria
