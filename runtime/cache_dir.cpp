#include "runtime/cache_dir.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kiln::runtime {

namespace {

Error unsafe(const std::string& dir, const std::string& why, const std::string& fix) {
  return Error{ErrorCode::InvalidInput, fmt::format("kernel cache directory '{}' is not safe to load code from: {} ({})", dir, why, fix)};
}

constexpr char kMarkerName[] = "CACHEDIR.TAG";
constexpr char kMarkerSignature[] = "Signature: 8a477f597d28d172789f06886806bc55";
constexpr char kMarkerKilnLine[] = "# This folder is a kernel cache of kiln";
constexpr char kMarkerText[] =
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This folder is a kernel cache of kiln (see https://bford.info/cachedir/).\n"
    "# kiln verifies, clears and evicts only in folders holding this file.\n";

// Whether `dir` holds the marker kiln writes (another program's CACHEDIR.TAG
// has the same signature, but its folder is not kiln's).
bool marked_by_kiln(const std::string& dir) {
  std::string text;
  return read_regular_file((std::filesystem::path(dir) / kMarkerName).string(), text, 4096) &&
         text.rfind(kMarkerSignature, 0) == 0 && text.find(kMarkerKilnLine) != std::string::npos;
}

// The folder is kiln's: marked by kiln, or empty and marked now. Anything in
// an unmarked folder may be the user's, even a folder named `graphs`: kiln
// adopts no such folder, so that it never deletes what it did not write.
Status claim(const std::string& dir) {
  namespace fs = std::filesystem;
  if (marked_by_kiln(dir)) return {};
  std::vector<std::string> held;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(std::string(kMarkerName) + ".tmp.", 0) != 0)  // (another kiln marking this folder right now)
      held.push_back("'" + name + "'");
  }
  if (ec) return Error{ErrorCode::InvalidInput, fmt::format("kernel cache: cannot list '{}': {}", dir, ec.message())};
  const std::string marker = (fs::path(dir) / kMarkerName).string();
  if (held.empty()) {
    if (!write_file_atomically(marker, kMarkerText))
      return Error{ErrorCode::InvalidInput, fmt::format("kernel cache: cannot write '{}': {}", marker, std::strerror(errno))};
    return {};
  }
  if (marked_by_kiln(dir)) return {};  // another kiln process adopted it while this one looked
  std::sort(held.begin(), held.end());
  const size_t shown = std::min<size_t>(held.size(), 3);
  return Error{ErrorCode::InvalidInput,
               fmt::format("'{}' is not a kiln cache folder: it holds {}{} and no {} written by kiln; kiln adopts only a "
                           "new or empty folder, so that it never deletes a file of yours (point --cache-dir or "
                           "KILN_CACHE_DIR at a new or empty folder; a cache left by a kiln older than the marker can "
                           "be deleted)",
                           dir, fmt::join(held.begin(), held.begin() + static_cast<ptrdiff_t>(shown), ", "),
                           held.size() > shown ? fmt::format(" and {} more", held.size() - shown) : "", kMarkerName)};
}

// The root folder, and the home folder itself, are nobody's cache.
bool too_wide(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path path = fs::weakly_canonical(dir, ec);
  if (ec) return false;
  if (path == path.root_path()) return true;
  // getpwuid_r: compiles on several threads ask at once (getpwuid's one
  // static record was a data race, found by tools/tsan.sh).
  struct passwd record {};
  struct passwd* user = nullptr;
  std::vector<char> buffer(16384);
  if (::getpwuid_r(::geteuid(), &record, buffer.data(), buffer.size(), &user) != 0) return false;
  return user && user->pw_dir && path == fs::weakly_canonical(user->pw_dir, ec);
}

}  // namespace

Status secure_cache_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  if (too_wide(dir))
    return Error{ErrorCode::InvalidInput,
                 fmt::format("kernel cache: '{}' is the root or the home folder itself; kiln needs a folder of its own "
                             "(e.g. ~/.cache/kiln)", dir)};
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    if (errno != ENOENT) return unsafe(dir, std::strerror(errno), "check the path");
    std::error_code ec;
    const fs::path parent = fs::path(dir).parent_path();
    if (!parent.empty()) fs::create_directories(parent, ec);
    if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
      return Error{ErrorCode::InvalidInput, fmt::format("kernel cache: cannot create '{}': {}", dir, std::strerror(errno))};
    if (::stat(dir.c_str(), &st) != 0)
      return Error{ErrorCode::InvalidInput, fmt::format("kernel cache: cannot read '{}': {}", dir, std::strerror(errno))};
  }
  if (!S_ISDIR(st.st_mode)) return unsafe(dir, "it is not a directory", "point KILN_CACHE_DIR at a directory");
  if (st.st_uid != ::geteuid())
    return unsafe(dir, fmt::format("it belongs to uid {}, not to this user (uid {})", st.st_uid, ::geteuid()),
                  "use a directory of your own, e.g. set KILN_CACHE_DIR");
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return unsafe(dir, fmt::format("group or others may write to it (mode {:04o})", st.st_mode & 07777),
                  fmt::format("chmod 700 '{}'", dir));
  for (const char* sub : {"kernels", "graphs", "tuning"}) {
    const std::string path = dir + "/" + sub;
    struct stat sub_st {};
    if (::lstat(path.c_str(), &sub_st) != 0) continue;  // created on first write
    if (!S_ISDIR(sub_st.st_mode)) return unsafe(dir, fmt::format("'{}' is not a plain directory (a symlink?)", sub), fmt::format("remove '{}'", path));
    if (sub_st.st_uid != ::geteuid() || (sub_st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
      return unsafe(dir, fmt::format("'{}' belongs to someone else or is writable by others", sub), fmt::format("remove '{}'", path));
  }
  return claim(dir);
}

bool write_all(int fd, const std::string& data) {
  for (size_t done = 0; done < data.size();) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool make_cache_folder(const std::filesystem::path& folder) {
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  return !ec && ::chmod(folder.c_str(), 0700) == 0;
}

std::string open_regular_file(const std::string& path, int& fd, struct stat& st) {
  fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return errno == ELOOP ? "a symbolic link" : fmt::format("cannot open: {}", std::strerror(errno));
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) return {};
  ::close(fd);
  fd = -1;
  return "not a regular file";
}

bool read_exactly(int fd, int64_t offset, size_t size, char* out) {
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, out + done, size - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool read_regular_file(const std::string& path, std::string& out, int64_t max_bytes) {
  out.clear();
  int fd;
  struct stat st {};
  if (!open_regular_file(path, fd, st).empty()) return false;
  bool ok = st.st_size <= max_bytes;
  if (ok) {
    out.resize(static_cast<size_t>(st.st_size));
    ok = read_exactly(fd, 0, out.size(), out.data());
  }
  ::close(fd);
  if (!ok) out.clear();
  return ok;
}

bool write_file_atomically(const std::string& path, const std::string& text, unsigned mode) {
  const std::string temp = fmt::format("{}.tmp.{}.{:08x}", path, ::getpid(), std::random_device{}());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  bool ok = ::fchmod(fd, static_cast<mode_t>(mode)) == 0 && write_all(fd, text) && ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (ok && std::rename(temp.c_str(), path.c_str()) == 0) return true;
  const int why = ok ? errno : saved;
  ::unlink(temp.c_str());
  errno = why;
  return false;
}

bool carries_header(const std::string& path, std::string_view magic, bool or_shorter) {
  int fd;
  struct stat st {};
  if (!open_regular_file(path, fd, st).empty()) return false;
  const size_t size = static_cast<size_t>(std::min<off_t>(st.st_size, static_cast<off_t>(magic.size())));
  std::string head(size, '\0');
  const bool read = read_exactly(fd, 0, size, head.data());
  ::close(fd);
  return read && (size == magic.size() || or_shorter) && magic.compare(0, size, head) == 0;
}

bool remove_if_kilns(const std::string& path, std::string_view magic, bool or_shorter) {
  return carries_header(path, magic, or_shorter) && ::unlink(path.c_str()) == 0;
}

CacheFile classify_cache_file(const std::filesystem::path& path, std::string_view extension, std::string_view magic) {
  const std::string name = path.filename().string();
  const size_t tmp = name.find(".tmp.");
  if (tmp != std::string::npos) {
    // <entry name>.tmp.<pid>.<8 hex>, as write_file_atomically and the kernel cache name them.
    const std::string stem = name.substr(0, tmp), tail = name.substr(tmp + 5);
    const size_t dot = tail.find('.');
    const bool digits = dot != 0 && dot != std::string::npos &&
                        tail.find_first_not_of("0123456789") == dot;
    const bool hex = dot != std::string::npos && tail.size() - dot - 1 == 8 &&
                     tail.find_first_not_of("0123456789abcdef", dot + 1) == std::string::npos;
    const bool entry_stem = stem.size() > extension.size() && stem.compare(stem.size() - extension.size(), extension.size(), extension) == 0;
    if (!digits || !hex || !entry_stem || !carries_header(path.string(), magic, true)) return CacheFile::Foreign;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && st.st_mtime < ::time(nullptr) - 60) return CacheFile::StaleTemporary;
    return CacheFile::FreshTemporary;
  }
  const bool candidate = name.size() > extension.size() && name.compare(name.size() - extension.size(), extension.size(), extension) == 0;
  return candidate ? CacheFile::Candidate : CacheFile::Foreign;
}

bool is_candidate_entry(const std::filesystem::path& path, std::string_view extension, std::string_view magic,
                        std::vector<std::string>* problems, bool remove_bad, std::vector<std::string>* foreign) {
  switch (classify_cache_file(path, extension, magic)) {
    case CacheFile::Candidate:
      return true;
    case CacheFile::FreshTemporary:  // a writer's, at work (entries appear only by rename, never half-written)
      return false;
    case CacheFile::StaleTemporary:
      if (problems) problems->push_back(path.string() + ": stale temporary file (its writer died)");
      if (remove_bad) remove_if_kilns(path.string(), magic, true);
      return false;
    case CacheFile::Foreign:
      if (foreign) foreign->push_back(path.string());
      return false;
  }
  return false;
}

std::string with_checksum(const std::string& body) {
  return fmt::format("{} {:016x}\n{}", kDocumentMagic, XXH3_64bits(body.data(), body.size()), body);
}

std::optional<std::string> checked_body(const std::string& text) {
  const size_t head = kDocumentMagic.size() + 1 + 16;  // "KILNJSON " + checksum
  if (text.size() <= head || text.compare(0, kDocumentMagic.size(), kDocumentMagic) != 0 || text[kDocumentMagic.size()] != ' ' ||
      text[head] != '\n')
    return std::nullopt;
  std::string body = text.substr(head + 1);
  if (fmt::format("{:016x}", XXH3_64bits(body.data(), body.size())) != text.substr(kDocumentMagic.size() + 1, 16)) return std::nullopt;
  return body;
}

}  // namespace kiln::runtime
