// Errors as values for kiln's public API.
//
// Every API call that can fail returns `Status` or `Expected<T>`, both
// [[nodiscard]], so no failure is silently dropped. An `Error` carries a code
// (which maps onto the exit codes of cli.md) and a message that names what is
// wrong and where: the op (index and output name), tensors, shapes, dtypes.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

namespace kiln {

enum class ErrorCode {
  InvalidInput = 1,     // a graph, input file or option value is wrong
  Usage = 2,            // unknown command or flag
  CompileOrDevice = 3,  // NVRTC or CUDA failure, or no GPU where one is needed
  CheckFailed = 4,      // a result outside tolerance
  OutOfMemory = 5,      // the device (or host) has not the memory asked for; the CLI exits 3
  Interrupted = 130,    // stopped on request (run_reference's cancel flag), as a shell reports Ctrl-C
  Internal = 70,        // a bug in kiln: please report it
};

struct Error {
  ErrorCode code = ErrorCode::InvalidInput;
  std::string message;
};

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Error error) : error_(std::move(error)) {}
  static Status success() { return {}; }

  bool ok() const { return !error_.has_value(); }
  explicit operator bool() const { return ok(); }
  const Error& error() const { return *error_; }

 private:
  std::optional<Error> error_;
};

template <class T>
class [[nodiscard]] Expected {
 public:
  Expected(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  Expected(Error error) : state_(std::in_place_index<1>, std::move(error)) {}

  bool ok() const { return state_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  const Error& error() const { return std::get<1>(state_); }
  Status status() const { return ok() ? Status() : Status(error()); }

 private:
  std::variant<T, Error> state_;
};

}  // namespace kiln
