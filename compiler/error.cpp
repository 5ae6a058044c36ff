#include "compiler/error.h"

#include <new>

namespace kiln::detail {

void throw_user_error(std::string message, ErrorCode code) {
  throw UserError(code, message);
}

void throw_internal_error(const char* file, int line, const char* condition,
                          const std::string& detail) {
  throw InternalError(fmt::format("internal error at {}:{}: check '{}' failed{}{} "
                                  "(this is a bug in kiln; please report it)",
                                  file, line, condition, detail.empty() ? "" : ": ", detail));
}

Error error_from_current_exception() {
  try {
    throw;
  } catch (const UserError& e) {
    return Error{e.code(), e.what()};
  } catch (const InternalError& e) {
    return Error{ErrorCode::Internal, e.what()};
  } catch (const std::bad_alloc&) {
    return Error{ErrorCode::InvalidInput, "out of memory"};
  } catch (const std::exception& e) {
    return Error{ErrorCode::Internal,
                 fmt::format("internal error: unexpected exception: {} (this is a bug in "
                             "kiln; please report it)",
                             e.what())};
  }
}

std::string escaped(std::string_view text) {
  const std::string q = quoted(text);
  return q.substr(1, q.size() - 2);
}

namespace {
// One character as quoted() and printable() write it: control characters
// as \n, \t, \r or \xNN, the rest as they are.
void append_escaped(std::string& out, unsigned char c) {
  switch (c) {
    case '\n': out += "\\n"; break;
    case '\t': out += "\\t"; break;
    case '\r': out += "\\r"; break;
    default:
      if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
      else out += static_cast<char>(c);
  }
}
}  // namespace

std::string quoted(std::string_view text) {
  std::string out = "'";
  for (unsigned char c : text) {
    if (c == '\'' || c == '\\') out += '\\';
    append_escaped(out, c);
  }
  out += "'";
  return out;
}

std::string printable(std::string_view text) {
  std::string out;
  for (unsigned char c : text)
    if (c == '\n' || c == '\t') out += static_cast<char>(c);
    else append_escaped(out, c);
  return out;
}

}  // namespace kiln::detail
