#include "runtime/temp_files.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "runtime/cache_dir.h"

namespace kiln::runtime {

Expected<std::filesystem::path> make_private_folder(const std::string& prefix) {
  std::error_code ec;
  const std::filesystem::path temp = std::filesystem::temp_directory_path(ec);
  if (ec)
    return Error{ErrorCode::InvalidInput,
                 fmt::format("no usable temporary folder (TMPDIR or /tmp): {}", ec.message())};
  std::string pattern = (temp / (prefix + "XXXXXX")).string();
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  if (::mkdtemp(name.data()) == nullptr)
    return Error{ErrorCode::InvalidInput,
                 fmt::format("cannot make a private folder in the temporary folder '{}': {}", temp.string(),
                             std::strerror(errno))};
  return std::filesystem::path(name.data());
}

Expected<bool> write_new_file(const std::filesystem::path& path, const std::string& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Error{ErrorCode::InvalidInput, fmt::format("cannot create '{}': {}", path.string(), std::strerror(errno))};
  if (!write_all(fd, data)) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Error{ErrorCode::InvalidInput, fmt::format("cannot write '{}': {}", path.string(), why)};
  }
  if (::close(fd) != 0)
    return Error{ErrorCode::InvalidInput, fmt::format("cannot write '{}': {}", path.string(), std::strerror(errno))};
  return true;
}

}  // namespace kiln::runtime
