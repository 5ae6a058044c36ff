// The on-disk kernel cache: one file per compiled kernel.
//
// Key: a hash of the kernel's canonical source, the target arch, the NVRTC
// version, the kiln version and the compile options (kernel_key). Entry:
// <dir>/kernels/<2 hex>/<32 hex>.cubin = header (magic, format, key, size,
// XXH3-64 checksum) + cubin. Writes are atomic (a temporary file in the same
// folder, then rename), so readers never see half an entry and concurrent
// writers of one key are harmless. Every read re-checks magic, key, size
// and checksum; a bad entry is deleted and reported as a miss, never loaded.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "compiler/graph_hash.h"
#include "kiln/status.h"

namespace kiln::runtime {

ir::Hash128 kernel_key(const std::string& canonical_source, const std::string& arch);

// $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln (cli.md).
std::string default_cache_dir();

class KernelCache {
 public:
  explicit KernelCache(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  std::optional<std::string> load(const ir::Hash128& key) const;
  Status store(const ir::Hash128& key, const std::string& cubin) const;
  std::string path_of(const ir::Hash128& key) const;

 private:
  std::string dir_;
};

}  // namespace kiln::runtime
