// CodeWriter: the text of a generated kernel, laid out by the writer, not by
// its generators (as Inductor's IndentedBuffer owns indentation).
//
// Expects: CUDA C++ lines whose leading whitespace means nothing (generators
// write statements and blocks without counting spaces).
// Guarantees: lay_out() indents every line by its structure, two spaces a
// level: a block's lines one level below the line that opened its brace
// (its closing brace at that line's level), the statement under an `if`,
// `for`, `while` or `else` without a brace one level below it, the lines
// inside an open parenthesis (a parameter list, arguments over several
// lines) two levels below the line that opened it. Braces and parentheses
// in comments and literals do not count; blank lines stay empty. Only the
// whitespace that starts a line changes.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace kiln::codegen {

class CodeWriter {
 public:
  // One line, formatted, at whatever depth the braces before it say.
  template <class... Args>
  CodeWriter& line(fmt::format_string<Args...> format, Args&&... args) {
    text_ += fmt::format(format, std::forward<Args>(args)...);
    text_ += '\n';
    return *this;
  }
  // Text of whole lines (a block another function wrote, the emitter's statements).
  CodeWriter& lines(std::string_view text) {
    text_ += text;
    if (!text.empty() && text.back() != '\n') text_ += '\n';
    return *this;
  }
  // `head {` ... `}` around what `body` writes.
  template <class Body>
  CodeWriter& block(std::string_view head, Body&& body, std::string_view close = "}") {
    text_ += head;
    text_ += " {\n";
    body();
    text_ += close;
    text_ += '\n';
    return *this;
  }
  // The text as written (each line laid out later, when the kernel is finished).
  std::string take() { return std::move(text_); }

  // `source` with every line indented by its nesting (above).
  static std::string lay_out(std::string_view source);

 private:
  std::string text_;
};

}  // namespace kiln::codegen
