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
// convention, with kiln's own line), written only when kiln creates the
// folder or finds it empty; a folder that holds anything without that
// marker (even folders named like kiln's own), the root folder and the home
// folder itself are refused. Inside its folder, kiln deletes only files
// that carry its header (below), so `cache verify`, `cache clear` and
// eviction never touch a user's files. Otherwise an Error (exit 1) says
// what is wrong and how to fix it; callers compile in memory (a warning)
// or, for cache commands, stop.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
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

// The header of the cache's JSON documents (with_checksum).
constexpr std::string_view kDocumentMagic = "KILNJSON";

// Writes all of `data` to `fd` (several write calls where the kernel takes
// less at once; EINTR retried). False on an error, with errno set.
bool write_all(int fd, const std::string& data);

// ---- What kiln may delete ----
// Every file kiln writes in its cache begins with a header of its own:
// kernel entries with "KILNCUBN" (kernel_cache.h), graph recipes and
// tuning records with kDocumentMagic (with_checksum). kiln deletes a file
// of its cache only when it carries that header; anything else found there
// is reported as foreign and left, whatever its name.

// Whether `path` (not followed if a link) is a regular file that begins
// with `magic`; with `or_shorter`, a file shorter than `magic` whose bytes
// begin it counts too (a temporary file of a writer that died early).
bool carries_header(const std::string& path, std::string_view magic, bool or_shorter = false);
// Removes `path` only if it carries_header(); false if it is left.
bool remove_if_kilns(const std::string& path, std::string_view magic, bool or_shorter = false);

// How a file found in one of the cache's folders stands, by its name and
// (for temporaries) its first bytes: a candidate entry (named *<extension>:
// its content decides), a writer's temporary file (<entry>.tmp.<pid>.<hex>
// beginning with `magic`; stale when a minute old: its writer died), or
// foreign (anything else).
enum class CacheFile { Candidate, FreshTemporary, StaleTemporary, Foreign };
CacheFile classify_cache_file(const std::filesystem::path& path, std::string_view extension, std::string_view magic);

// What a walk over a cache folder does with each file it meets: true for a
// candidate entry (the caller reads it); a writer's fresh temporary is
// skipped, a stale one goes to `problems` (and, with `remove_bad`, is
// deleted), anything else goes to `foreign` and is left.
bool is_candidate_entry(const std::filesystem::path& path, std::string_view extension, std::string_view magic,
                        std::vector<std::string>* problems, bool remove_bad, std::vector<std::string>* foreign);

// Every document in <dir>/<folder> (<key>.json) that `parse` accepts, with
// its path. Damaged ones of kiln's and stale temporaries go to `problems`
// ("<path>: <why>") and, with `remove_bad`, are deleted; files kiln did not
// write go to `foreign` and are left.
template <class T, class Parse>
std::vector<std::pair<std::string, T>> list_documents(const std::string& dir, const char* folder, const char* what,
                                                      Parse parse, std::vector<std::string>* problems, bool remove_bad,
                                                      std::vector<std::string>* foreign = nullptr) {
  std::vector<std::pair<std::string, T>> out;
  const std::filesystem::path root = std::filesystem::path(dir) / folder;
  std::error_code ec;
  if (!std::filesystem::exists(root, ec)) return out;
  for (const auto& e : std::filesystem::directory_iterator(root, ec)) {
    const std::string path = e.path().string();
    if (!is_candidate_entry(e.path(), ".json", kDocumentMagic, problems, remove_bad, foreign)) continue;
    std::string text;
    read_regular_file(path, text);
    if (std::optional<T> doc = parse(text)) {
      out.emplace_back(path, std::move(*doc));
    } else if (carries_header(path, kDocumentMagic)) {
      if (problems) problems->push_back(path + ": damaged " + what);
      if (remove_bad) remove_if_kilns(path, kDocumentMagic);
    } else if (foreign) {
      foreign->push_back(path);
    }
  }
  return out;
}

// The document at `path` if `parse` accepts it; a damaged one of kiln's is
// deleted (anything else there is left: the next store replaces it).
template <class T, class Parse>
std::optional<T> load_document(const std::string& path, Parse parse) {
  std::error_code ec;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, ec))) return std::nullopt;
  std::string text;
  read_regular_file(path, text);  // a symlink or anything but a file reads as nothing: not a document
  std::optional<T> doc = parse(text);
  if (!doc) remove_if_kilns(path, kDocumentMagic);
  return doc;
}

// The small JSON documents of the cache (graph recipes, tuning records):
// the first line is kDocumentMagic, a space and the XXH3-64 (16 hex
// digits) of the rest.
std::string with_checksum(const std::string& body);
// The body of such a text; nullopt when the checksum does not match.
std::optional<std::string> checked_body(const std::string& text);

}  // namespace kiln::runtime
