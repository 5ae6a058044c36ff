#include "codegen/code_writer.h"

#include <vector>

namespace kiln::codegen {
namespace {

// Where the string or character literal that opens at `i` closes (its
// closing quote, or the end of the line).
size_t literal_end(std::string_view line, size_t i) {
  const char quote = line[i];
  for (++i; i < line.size() && line[i] != quote; ++i)
    if (line[i] == '\\') ++i;
  return i;
}

// The line without a trailing `//` comment and trailing blanks (literals kept whole).
std::string_view code_part(std::string_view line) {
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (c == '"' || c == '\'') {
      i = literal_end(line, i);
    } else if (c == '/' && i + 1 < line.size() && line[i + 1] == '/') {
      line = line.substr(0, i);
      break;
    }
  }
  while (!line.empty() && (line.back() == ' ' || line.back() == '\t')) line.remove_suffix(1);
  return line;
}

// `if (...)`, `for (...)`, `while (...)`, `else` with its statement on the next line.
bool heads_next_statement(std::string_view code) {
  if (code.empty() || code.back() == ';' || code.back() == '{' || code.back() == '}') return false;
  for (std::string_view keyword : {"if", "for", "while", "else"})
    if (code.substr(0, keyword.size()) == keyword &&
        (code.size() == keyword.size() || code[keyword.size()] == ' ' || code[keyword.size()] == '('))
      return true;
  return false;
}

// Where the lines of a kernel stand: a level per open brace (that of the
// line that opened it), the level of the line that opened the outermost
// open parenthesis, and a statement hanging under a control header.
class Layout {
 public:
  int level_of(std::string_view line) const {
    size_t closing = 0;
    while (closing < line.size() && line[closing] == '}') ++closing;
    if (closing > 0) return closing <= braces_.size() ? braces_[braces_.size() - closing] : 0;
    if (hanging_ >= 0) return hanging_;
    const int content = braces_.empty() ? 0 : braces_.back() + 1;
    if (paren_opener_ >= 0) return line.front() == ')' && parens_ == 1 ? paren_opener_ : paren_opener_ + 2;
    return content;
  }

  // After `line` was written at `level`.
  void advance(std::string_view line, int level) {
    const std::string_view code = code_part(line);
    for (size_t i = 0; i < code.size(); ++i) {
      const char c = code[i];
      if (c == '"' || c == '\'') {
        i = literal_end(code, i);
      } else if (c == '{') {
        braces_.push_back(level);
      } else if (c == '}') {
        if (!braces_.empty()) braces_.pop_back();
      } else if (c == '(') {
        if (parens_++ == 0) paren_opener_ = level;
      } else if (c == ')') {
        if (parens_ > 0 && --parens_ == 0) paren_opener_ = -1;
      }
    }
    hanging_ = heads_next_statement(code) ? level + 1 : -1;
  }

 private:
  std::vector<int> braces_;
  int parens_ = 0, paren_opener_ = -1, hanging_ = -1;
};

}  // namespace

std::string CodeWriter::lay_out(std::string_view source) {
  std::string out;
  out.reserve(source.size() + source.size() / 4);
  Layout layout;
  for (size_t at = 0; at < source.size();) {
    size_t end = source.find('\n', at);
    const bool last = end == std::string_view::npos;
    if (last) end = source.size();
    std::string_view line = source.substr(at, end - at);
    at = end + 1;
    const size_t first = line.find_first_not_of(" \t");
    if (first != std::string_view::npos) {
      line.remove_prefix(first);
      const int level = layout.level_of(line);
      out.append(static_cast<size_t>(2 * level), ' ');
      out += line;
      layout.advance(line, level);
    }
    if (!last) out += '\n';
  }
  return out;
}

}  // namespace kiln::codegen
