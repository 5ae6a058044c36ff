// The on-disk kernel cache: one file per compiled kernel.
//
// Key: a hash of its parts (KeyParts): the kernel's canonical source, the
// target arch, the NVRTC version, the kiln version and the compile options.
// Entry: <dir>/kernels/<2 hex>/<32 hex>.cubin = header (magic, format, key,
// sizes, XXH3-64 checksum of the rest) + metadata (the key's parts and the
// kernel's kind, as JSON) + cubin. Writes are atomic (a temporary file in
// the same folder, then rename), so readers never see half an entry and
// concurrent writers of one key are harmless. Every read re-checks magic,
// format, key, sizes and checksum; a bad entry is deleted and reported as a
// miss, never loaded (a file without kiln's header is never deleted:
// cache_dir.h). A read sets the file's modification time: it is the
// entry's last use, which size-limited eviction (least recently used first)
// goes by. Deleting a file another process is reading is safe on POSIX (its
// open handle keeps the data).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "compiler/graph_hash.h"
#include "kiln/status.h"

namespace kiln::runtime {

// What a kernel's cache key is made of (`kiln cache explain` compares them).
struct KeyParts {
  std::string source;   // XXH3-128 of the canonical source and the templates it may include, hex
  std::string arch;
  std::string nvrtc;
  std::string kiln;
  std::string options;  // NVRTC options, space-separated
  ir::Hash128 key() const;
};
KeyParts key_parts(const std::string& canonical_source, const std::string& arch);
inline ir::Hash128 kernel_key(const std::string& canonical_source, const std::string& arch) {
  return key_parts(canonical_source, arch).key();
}

// Options::cache_dir and cache_max_bytes of the settings in force.
std::string default_cache_dir();
int64_t cache_size_limit();

struct CacheEntry {
  std::string path;
  ir::Hash128 key;
  KeyParts parts;
  std::string kind;
  int64_t bytes = 0;
  int64_t last_use = 0;  // seconds since the epoch
};

// The parts of `want` that differ from `have`, in words (`kiln cache explain`).
std::vector<std::string> key_differences(const KeyParts& have, const KeyParts& want);
// The entry closest to `want` (sharing the source first, then the most
// parts), or nullptr when there is none.
const struct CacheEntry* closest_entry(const std::vector<struct CacheEntry>& entries, const KeyParts& want);

class KernelCache {
 public:
  explicit KernelCache(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  std::optional<std::string> load(const ir::Hash128& key) const;
  Status store(const KeyParts& parts, const std::string& kind, const std::string& cubin) const;
  std::string path_of(const ir::Hash128& key) const;
  // On a disk miss, load() asks the remote cache (remote_cache.h), and
  // store() writes through to it.

  // Every readable entry; `problems` gets "path: reason" for damaged
  // entries and stale temporary files of kiln's (removed when
  // `remove_bad`), `foreign` the path of every file without kiln's header
  // (never removed: cache_dir.h).
  std::vector<CacheEntry> list(std::vector<std::string>* problems = nullptr, bool remove_bad = false,
                               std::vector<std::string>* foreign = nullptr) const;
  // Removes least recently used entries until the cache holds at most
  // `limit` bytes; returns how many it removed.
  int evict(int64_t limit) const;

 private:
  std::optional<std::string> from_remote(const ir::Hash128& key) const;
  Status write_entry(const std::string& path, const std::string& bytes) const;
  Status write_entry_once(const std::string& path, const std::string& bytes) const;
  std::string dir_;
};

}  // namespace kiln::runtime
