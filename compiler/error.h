// Two kinds of error inside kiln (the public API turns both into kiln::Error):
//  - a user error: the input is wrong. The message names what and where (op
//    index and output name, tensors, shapes, dtypes) and, where it can, a fix.
//    Raised with KILN_USER_CHECK / throw_user_error.
//  - an internal error: kiln has a bug. The message gives file:line and the
//    failed condition. Raised with KILN_INTERNAL_CHECK.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "kiln/status.h"

namespace kiln::detail {

class UserError : public std::runtime_error {
 public:
  UserError(ErrorCode code, const std::string& message)
      : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

class InternalError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] void throw_user_error(std::string message,
                                   ErrorCode code = ErrorCode::InvalidInput);
[[noreturn]] void throw_internal_error(const char* file, int line, const char* condition,
                                       const std::string& detail = {});

// Runs `body`, turning kiln's exceptions (and std::bad_alloc) into an Error.
Error error_from_current_exception();

template <class F>
auto catch_errors(F&& body) -> Expected<decltype(body())> {
  try {
    return body();
  } catch (...) {
    return error_from_current_exception();
  }
}

// Quotes a user-provided string for a message: JSON-style escaping, so that
// control characters and quotes cannot break the message's shape.
std::string quoted(std::string_view text);
// `text` with control characters escaped as quoted() escapes them, without
// the quotes: user text printed to a terminal (graph names).
std::string escaped(std::string_view text);
// A whole message for a terminal: control characters escaped as quoted()
// escapes them, except the newlines and tabs that lay the message out.
std::string printable(std::string_view text);

}  // namespace kiln::detail

namespace kiln {
using detail::throw_user_error;
}

#define KILN_USER_CHECK(condition, ...)                                   \
  do {                                                                    \
    if (!(condition)) ::kiln::detail::throw_user_error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define KILN_INTERNAL_CHECK(condition)                                          \
  do {                                                                          \
    if (!(condition)) ::kiln::detail::throw_internal_error(__FILE__, __LINE__, #condition); \
  } while (0)

#define KILN_UNREACHABLE(what) ::kiln::detail::throw_internal_error(__FILE__, __LINE__, "unreachable", what)
