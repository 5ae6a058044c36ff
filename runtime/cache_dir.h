// The kernel cache directory as a trust boundary: kiln loads machine code
// from it, so it must be the user's own.
//
// Expects: a directory path (it may not exist yet).
// Guarantees: on success the directory exists, is a real directory (the
// path may pass through symlinks above it, as ~/.cache often does), is
// owned by this process's effective user and is writable by no one else;
// its `kernels`, `graphs` and `tuning` folders, where present, are real directories
// too. A directory kiln creates is created 0700. The folder is kiln's alone:
// it holds kiln's marker (CACHEDIR.TAG, the Cache Directory Tagging
// convention), written when kiln creates the folder or finds it holding
// nothing but kiln's own names; a folder holding anything else without the
// marker, the root folder and the home folder itself are refused, so that
// `cache verify`, `cache clear` and eviction never touch a user's files.
// Otherwise an Error (exit 1) says what is wrong and how to fix it; callers
// compile in memory (a warning) or, for cache commands, stop.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/status.h"

namespace kiln::runtime {

Status secure_cache_dir(const std::string& dir);

// Makes `folder` (a folder of the cache, such as <dir>/graphs) if missing,
// mode 0700 whatever the umask (secure_cache_dir refuses group- or
// world-writable folders). False if it cannot.
bool make_cache_folder(const std::filesystem::path& folder);

// Opens `path` for reading if it is a regular file, without following a
// symlink at `path` itself and without waiting (a FIFO is opened
// non-blocking and refused): empty and `fd`, `st` set, or why not.
std::string open_regular_file(const std::string& path, int& fd, struct stat& st);
// `size` bytes of `fd` from `offset` into `out` (EINTR retried); false if fewer.
bool read_exactly(int fd, int64_t offset, size_t size, char* out);

// Reads a regular file of at most `max_bytes` without following a symlink
// at `path` itself and without waiting (a FIFO is opened non-blocking and
// refused); false on anything else, out empty.
constexpr int64_t kMaxDocumentBytes = int64_t{64} << 20;  // recipes, tuning records: kilobytes in practice
bool read_regular_file(const std::string& path, std::string& out, int64_t max_bytes = kMaxDocumentBytes);

// Writes `text` to `path` atomically: a temporary file beside it (`mode`
// exactly, whatever the umask; never through a symlink), fsync, rename over
// `path` (a link at `path` is replaced, not followed). False on any failure
// (errno says why), with no file left behind; readers see the old file or
// the new, never a part.
bool write_file_atomically(const std::string& path, const std::string& text, unsigned mode = 0600);

// Writes all of `data` to `fd` (several write calls where the kernel takes
// less at once; EINTR retried). False on an error, with errno set.
bool write_all(int fd, const std::string& data);

// Every `*.json` document in <dir>/<folder> that `parse` accepts, with its
// path; the others are reported in `problems` ("<path>: damaged <what>")
// and, with `remove_bad`, deleted.
template <class T, class Parse>
std::vector<std::pair<std::string, T>> list_documents(const std::string& dir, const char* folder, const char* what,
                                                      Parse parse, std::vector<std::string>* problems, bool remove_bad) {
  std::vector<std::pair<std::string, T>> out;
  const std::filesystem::path root = std::filesystem::path(dir) / folder;
  std::error_code ec;
  if (!std::filesystem::exists(root, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    if (e.path().extension() != ".json") continue;
    std::string text;
    read_regular_file(e.path().string(), text);
    std::optional<T> doc = parse(text);
    if (!doc) {
      if (problems) problems->push_back(e.path().string() + ": damaged " + what);
      if (remove_bad) std::filesystem::remove(e.path(), ec);
      continue;
    }
    out.emplace_back(e.path().string(), std::move(*doc));
  }
  return out;
}

// The document at `path` if `parse` accepts it; a damaged one (or anything
// but a regular file there) is deleted.
template <class T, class Parse>
std::optional<T> load_document(const std::string& path, Parse parse) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  std::string text;
  read_regular_file(path, text);  // a symlink or anything but a file reads as nothing: damaged
  std::optional<T> doc = parse(text);
  if (!doc) std::filesystem::remove(path, ec);
  return doc;
}

// The small JSON documents of the cache (graph recipes, tuning records):
// the first line is the XXH3-64 (16 hex digits) of the rest.
std::string with_checksum(const std::string& body);
// The body of such a text; nullopt when the checksum does not match.
std::optional<std::string> checked_body(const std::string& text);

}  // namespace kiln::runtime
