#include "runtime/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "compiler/error.h"
#include "compiler/numerics.h"
#include "runtime/cache_dir.h"

namespace kiln {
namespace {

struct Header {
  char byte_order = '<';  // '<', '>' or '|'
  char kind = 'f';        // 'f', 'i', 'u', 'b'
  int item_size = 4;
  bool fortran_order = false;
  Shape shape;
};

// The value of `key` in the header's Python dict literal, up to the next
// top-level comma or closing brace.
std::string dict_value(const std::string& dict, const std::string& key, const std::string& path) {
  const size_t at = dict.find("'" + key + "'");
  KILN_USER_CHECK(at != std::string::npos, "{}: the .npy header has no '{}'", path, key);
  size_t i = dict.find(':', at);
  KILN_USER_CHECK(i != std::string::npos, "{}: malformed .npy header", path);
  ++i;
  while (i < dict.size() && dict[i] == ' ') ++i;
  int depth = 0;
  size_t end = i;
  for (; end < dict.size(); ++end) {
    const char c = dict[end];
    if (c == '(' || c == '[') ++depth;
    else if (c == ')' || c == ']') --depth;
    else if ((c == ',' || c == '}') && depth == 0) break;
  }
  return dict.substr(i, end - i);
}

Header parse_header(const std::string& dict, const std::string& path) {
  Header h;
  std::string descr = dict_value(dict, "descr", path);
  KILN_USER_CHECK(descr.size() >= 5 && (descr.front() == '\'' || descr.front() == '"'),
                  "{}: unsupported .npy dtype {} (structured arrays are not supported)", path, descr);
  descr = descr.substr(1, descr.size() - 2);
  KILN_USER_CHECK(descr.size() >= 3 && std::strchr("<>|=", descr[0]) && std::strchr("fiub", descr[1]),
                  "{}: unsupported .npy dtype '{}' (kiln reads float, integer and bool arrays)", path, descr);
  h.byte_order = descr[0] == '=' ? (std::endian::native == std::endian::little ? '<' : '>') : descr[0];
  h.kind = descr[1];
  h.item_size = std::atoi(descr.c_str() + 2);
  const bool size_ok = h.kind == 'f' ? (h.item_size == 2 || h.item_size == 4 || h.item_size == 8)
                       : h.kind == 'b' ? h.item_size == 1
                                       : (h.item_size == 1 || h.item_size == 2 || h.item_size == 4 || h.item_size == 8);
  KILN_USER_CHECK(size_ok, "{}: unsupported .npy dtype '{}'", path, descr);
  const std::string order = dict_value(dict, "fortran_order", path);
  KILN_USER_CHECK(order == "True" || order == "False", "{}: malformed fortran_order {}", path, order);
  h.fortran_order = order == "True";
  std::string shape = dict_value(dict, "shape", path);
  KILN_USER_CHECK(shape.size() >= 2 && shape.front() == '(' && shape.back() == ')', "{}: malformed shape {}",
                  path, shape);
  std::istringstream dims(shape.substr(1, shape.size() - 2));
  std::string dim;
  while (std::getline(dims, dim, ',')) {
    const size_t first = dim.find_first_not_of(' '), last = dim.find_last_not_of(' ');
    if (first == std::string::npos) continue;  // the empty entry after "(3,"
    const std::string digits = dim.substr(first, last - first + 1);
    KILN_USER_CHECK(digits.size() <= 18 && digits.find_first_not_of("0123456789") == std::string::npos,
                    "{}: malformed shape {}", path, shape);
    h.shape.push_back(std::stoll(digits));
  }
  return h;
}

double load_element(const unsigned char* p, const Header& h) {
  unsigned char bytes[8];
  std::memcpy(bytes, p, static_cast<size_t>(h.item_size));
  const bool swap = (h.byte_order == '>') != (std::endian::native == std::endian::big) && h.byte_order != '|';
  if (swap) std::reverse(bytes, bytes + h.item_size);
  auto as = [&](auto zero) {
    decltype(zero) v;
    std::memcpy(&v, bytes, sizeof v);
    return v;
  };
  switch (h.kind) {
    case 'b': return bytes[0] != 0;
    case 'f':
      if (h.item_size == 2) return f16_bits_to_f32(as(uint16_t{}));
      if (h.item_size == 4) return as(float{});
      return as(double{});
    case 'i':
      if (h.item_size == 1) return as(int8_t{});
      if (h.item_size == 2) return as(int16_t{});
      if (h.item_size == 4) return as(int32_t{});
      return static_cast<double>(as(int64_t{}));
    default:
      if (h.item_size == 1) return as(uint8_t{});
      if (h.item_size == 2) return as(uint16_t{});
      if (h.item_size == 4) return as(uint32_t{});
      return static_cast<double>(as(uint64_t{}));
  }
}

// The bytes of a regular file from `offset`, at most `limit` of them:
// opened without following a link and without blocking (a FIFO or a device
// in place of a file is refused before anything is read).
class InputFile {
 public:
  explicit InputFile(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    KILN_USER_CHECK(fd_ >= 0, "{}: cannot open the file: {}{}", path, std::strerror(errno),
                    errno == ELOOP ? " (a link: kiln reads input files only, not links)" : "");
    struct stat st {};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      const bool directory = S_ISDIR(st.st_mode);
      ::close(fd_);
      throw_user_error(fmt::format("{}: not a regular file ({})", path, directory ? "a directory" : "a FIFO, socket or device"));
    }
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~InputFile() { ::close(fd_); }
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  uint64_t size() const { return size_; }
  std::string read(uint64_t offset, uint64_t count) const {
    std::string out(static_cast<size_t>(count), '\0');
    uint64_t done = 0;
    while (done < count) {
      const ssize_t n = ::pread(fd_, out.data() + done, static_cast<size_t>(count - done), static_cast<off_t>(offset + done));
      KILN_USER_CHECK(n > 0, "{}: the file ends early", path_);
      done += static_cast<uint64_t>(n);
    }
    return out;
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

HostTensor read(const std::string& path, DType dtype) {
  const InputFile file(path);
  // Only the header first (the format caps it at 4 GiB; kiln at 1 MiB), then exactly the data the shape needs.
  const std::string data = file.read(0, std::min<uint64_t>(file.size(), 12 + (1u << 20)));
  KILN_USER_CHECK(data.size() >= 10 && data.compare(0, 6, "\x93NUMPY") == 0, "{}: not a .npy file", path);
  const int major = static_cast<unsigned char>(data[6]);
  KILN_USER_CHECK(major >= 1 && major <= 3, "{}: unsupported .npy format version {}", path, major);
  size_t header_len, offset;
  if (major == 1) {
    header_len = static_cast<unsigned char>(data[8]) | static_cast<size_t>(static_cast<unsigned char>(data[9])) << 8;
    offset = 10;
  } else {
    KILN_USER_CHECK(data.size() >= 12, "{}: truncated .npy header", path);
    header_len = 0;
    for (int i = 0; i < 4; ++i) header_len |= static_cast<size_t>(static_cast<unsigned char>(data[8 + static_cast<size_t>(i)])) << (8 * i);
    offset = 12;
  }
  KILN_USER_CHECK(header_len <= data.size() - offset, "{}: truncated .npy header (or one over 1 MiB)", path);
  const Header h = parse_header(data.substr(offset, header_len), path);
  offset += header_len;
  // The product of the non-zero dimensions bounds every stride (an empty array's too: (0, 6, 8888888888, ...)
  // once overflowed them).
  int64_t extent = 1;
  bool empty = false;
  for (int64_t d : h.shape) {
    empty = empty || d == 0;
    KILN_USER_CHECK(d == 0 || extent <= kMaxElements / d, "{}: the array is too large", path);
    extent *= std::max<int64_t>(d, 1);
  }
  const int64_t count = empty ? 0 : extent;
  uint64_t needed = 0;
  KILN_USER_CHECK(!__builtin_mul_overflow(static_cast<uint64_t>(count), static_cast<uint64_t>(h.item_size), &needed),
                  "{}: the array is too large", path);
  KILN_USER_CHECK(needed <= file.size() - offset, "{}: the file holds {} bytes of data but shape {} needs {}", path,
                  file.size() - offset, to_string(h.shape), needed);
  const std::string payload = file.read(offset, needed);
  HostTensor t{h.shape, dtype, std::vector<float>(static_cast<size_t>(count))};
  const Strides row_major = contiguous_strides(h.shape);
  // Fortran order: element (i0, i1, ...) is stored at sum(i_d * prod(shape[:d])).
  Strides stored(h.shape.size());
  int64_t step = 1;
  for (size_t d = 0; d < h.shape.size(); ++d) {
    stored[d] = h.fortran_order ? step : row_major[d];
    step *= h.shape[d];
  }
  const auto* base = reinterpret_cast<const unsigned char*>(payload.data());
  std::vector<int64_t> index(h.shape.size(), 0);
  for (int64_t i = 0; i < count; ++i) {
    int64_t at = 0;
    for (size_t d = 0; d < index.size(); ++d) at += index[d] * stored[d];
    t.values[static_cast<size_t>(i)] = round_from_f64(dtype, load_element(base + at * h.item_size, h));
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < h.shape[d]) break;
      index[d] = 0;
    }
  }
  return t;
}

}  // namespace

float round_from_f64(DType dtype, double value) {
  if (dtype == DType::boolean) return value != 0 ? 1.0f : 0.0f;
  float f = static_cast<float>(value);
  if (dtype == DType::f32 || std::isnan(value) || std::isinf(f)) return round_to(dtype, f);
  // Round to odd into f32 first: then rounding f32 to f16/bf16 is correctly
  // rounded from the f64 value.
  if (static_cast<double>(f) != value) {
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof bits);
    if ((bits & 1u) == 0) f = std::nextafter(f, value > f ? INFINITY : -INFINITY);
  }
  return round_to(dtype, f);
}

Expected<HostTensor> read_npy(const std::string& path, DType dtype) {
  return detail::catch_errors([&] { return read(path, dtype); });
}

Status write_npy(const std::string& path, const HostTensor& t) {
  const bool is_bool = t.dtype == DType::boolean;
  std::string shape = "(";
  for (int64_t d : t.shape) shape += fmt::format("{}, ", d);
  if (t.shape.size() == 1) shape.resize(shape.size() - 1);           // "(3,)"
  else if (!t.shape.empty()) shape.resize(shape.size() - 2);         // "(3, 4)"
  shape += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   is_bool ? "|b1" : "<f4", shape);
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::string out = "\x93NUMPY";
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  out += header;
  for (float v : t.values) {
    if (is_bool) {
      out += static_cast<char>(v != 0.0f);
    } else {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      for (int i = 0; i < 4; ++i) out += static_cast<char>((bits >> (8 * i)) & 0xff);
    }
  }
  // Whole or not at all: a full disk or a kill leaves no truncated .npy.
  if (!runtime::write_file_atomically(path, out, 0644))
    return Error{ErrorCode::InvalidInput, fmt::format("{}: cannot write the file: {}", path, std::strerror(errno))};
  return {};
}

}  // namespace kiln
