// Status: the engine's error value. Every fallible internal function returns one; the C layer
// turns it into a stria_status_t plus the thread's last-error message. Exceptions are used for
// nothing but allocation failure, and the C layer catches those too.
#pragma once

#include <string>
#include <utility>

#include "stria/stria.h"

namespace stria {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(stria_status_t code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == STRIA_SUCCESS; }
  stria_status_t code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  stria_status_t code_ = STRIA_SUCCESS;
  std::string message_;
};

// printf-style constructors, so call sites read as one line.
Status Error(stria_status_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
std::string Format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace stria

#define STRIA_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::stria::Status stria_status_ = (expr);        \
    if (!stria_status_.ok()) return stria_status_; \
  } while (0)
