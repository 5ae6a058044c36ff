#include "runtime/kernel_cache.h"

#include "kiln/options.h"
#include "runtime/remote_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "runtime/cache_dir.h"
#include "runtime/embedded_templates.h"
#include "runtime/nvrtc.h"

namespace kiln::runtime {
namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'C', 'U', 'B', 'N'};
constexpr std::string_view kMagicText(kMagic, sizeof kMagic);
constexpr uint32_t kFormat = 3;  // 3: the checksum covers the key
constexpr int64_t kMaxEntryBytes = int64_t{1} << 30;  // cubins are megabytes; a larger file is not kiln's entry

struct Header {
  char magic[8];
  uint32_t format;
  uint32_t meta_size;
  uint64_t key_high, key_low;
  uint64_t size;      // metadata + cubin
  uint64_t checksum;  // of the key, the metadata and the cubin
};
static_assert(sizeof(Header) == 48);

struct Parsed {
  Header header;
  nlohmann::json meta;
  std::string cubin;
};

uint64_t entry_checksum(uint64_t key_high, uint64_t key_low, const char* body, size_t size) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  XXH3_64bits_update(&state, &key_high, sizeof key_high);
  XXH3_64bits_update(&state, &key_low, sizeof key_low);
  XXH3_64bits_update(&state, body, size);
  return XXH3_64bits_digest(&state);
}

KeyParts parts_of(const nlohmann::json& meta) {
  return {meta.value("source", ""), meta.value("arch", ""), meta.value("nvrtc", ""), meta.value("kiln", ""),
          meta.value("options", "")};
}

// Why `data` is not a valid entry for `key` (empty when it is). The key in
// the header must be the name's, the checksum must cover it, and the
// metadata's parts (source hash, arch, versions, options) must hash to it:
// an entry copied under another kernel's name, or patched, is refused.
std::string parse(const std::string& data, const ir::Hash128* key, Parsed& out) {
  if (data.size() < sizeof(Header)) return "truncated header";
  std::memcpy(&out.header, data.data(), sizeof(Header));
  const Header& h = out.header;
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) return "not a kiln cache entry";
  if (h.format != kFormat) return fmt::format("entry format {} (this kiln writes {})", h.format, kFormat);
  if (key && (h.key_high != key->high || h.key_low != key->low)) return "its key does not match its name";
  if (h.size != data.size() - sizeof(Header)) return "truncated";
  if (h.meta_size > h.size) return "bad metadata size";
  if (entry_checksum(h.key_high, h.key_low, data.data() + sizeof(Header), h.size) != h.checksum) return "checksum mismatch";
  try {
    out.meta = nlohmann::json::parse(data.substr(sizeof(Header), h.meta_size));
  } catch (const std::exception&) {
    return "unreadable metadata";
  }
  if (!out.meta.is_object()) return "unreadable metadata";
  const ir::Hash128 described = parts_of(out.meta).key();
  if (described.high != h.key_high || described.low != h.key_low) return "its metadata does not hash to its key";
  out.cubin = data.substr(sizeof(Header) + h.meta_size);
  return {};
}

// An entry's bytes, or why there are none: a symlink, a FIFO or anything
// but a regular file, and a file whose size is not the one its header
// states, are refused before the rest is read (kiln never follows links in
// its cache, never waits on a FIFO, never reads a grown file whole).
std::string read_entry(const std::string& path, std::string& out) {
  out.clear();
  int fd;
  struct stat st {};
  if (std::string why = open_regular_file(path, fd, st); !why.empty()) return why;
  std::string why;
  Header h{};
  if (st.st_size < static_cast<off_t>(sizeof(Header)) || !read_exactly(fd, 0, sizeof h, reinterpret_cast<char*>(&h))) {
    why = "truncated header";
  } else if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0) {
    why = "not a kiln cache entry";
  } else if (h.size > static_cast<uint64_t>(kMaxEntryBytes) || static_cast<uint64_t>(st.st_size) != sizeof(Header) + h.size) {
    why = fmt::format("{} bytes where its header states {}", st.st_size, sizeof(Header) + h.size);
  } else {
    out.resize(static_cast<size_t>(st.st_size));
    if (!read_exactly(fd, 0, out.size(), out.data())) why = "truncated", out.clear();
  }
  ::close(fd);
  return why;
}

// The entry at `path` parsed for `key`: why it is not valid, empty when it is.
std::string load_entry(const std::string& path, const ir::Hash128* key, Parsed& out) {
  std::string bytes;
  if (std::string why = read_entry(path, bytes); !why.empty()) return why;
  return parse(bytes, key, out);
}

}  // namespace

ir::Hash128 KeyParts::key() const {
  ir::HashBuilder h;
  h.add(std::string_view("kiln-kernel-v2"));
  for (const std::string* part : {&source, &arch, &nvrtc, &kiln, &options}) h.add(std::string_view(*part));
  return h.digest();
}

KeyParts key_parts(const std::string& canonical_source, const std::string& arch) {
  KeyParts p;
  // The source hash covers the templates it includes: a changed template
  // with an unchanged kiln version never reuses an old cubin.
  static const ir::Hash128 templates = [] {  // fixed for the life of the process
    ir::HashBuilder h;
    for (const EmbeddedFile& f : embedded_templates()) h.add(f.name).add(f.text);
    return h.digest();
  }();
  p.source = ir::HashBuilder().add(std::string_view(canonical_source)).add(templates).digest().hex();
  p.arch = arch;
  p.nvrtc = nvrtc_version();
  p.kiln = KILN_VERSION;
  for (const std::string& o : nvrtc_options(arch, false))  // the arch is a part of its own
    if (o.rfind("--gpu-architecture", 0) != 0) p.options += (p.options.empty() ? "" : " ") + o;
  return p;
}

std::string default_cache_dir() { return current_options()->cache_dir; }

int64_t cache_size_limit() { return current_options()->cache_max_bytes; }

std::vector<std::string> key_differences(const KeyParts& have, const KeyParts& want) {
  std::vector<std::string> diff;
  if (have.source != want.source) diff.push_back("source (the generated kernel differs: another graph, or another kiln's codegen)");
  if (have.arch != want.arch) diff.push_back(fmt::format("arch ({} cached, {} wanted)", have.arch, want.arch));
  if (have.nvrtc != want.nvrtc) diff.push_back(fmt::format("NVRTC version ({} cached, {} here)", have.nvrtc, want.nvrtc));
  if (have.kiln != want.kiln) diff.push_back(fmt::format("kiln version ({} cached, {} here)", have.kiln, want.kiln));
  if (have.options != want.options) diff.push_back(fmt::format("compile options ('{}' cached, '{}' now)", have.options, want.options));
  return diff;
}

const CacheEntry* closest_entry(const std::vector<CacheEntry>& entries, const KeyParts& want) {
  const CacheEntry* best = nullptr;
  size_t best_diff = SIZE_MAX;
  for (const CacheEntry& e : entries) {
    const size_t d = key_differences(e.parts, want).size() + (e.parts.source != want.source ? 10 : 0);
    if (d < best_diff) best = &e, best_diff = d;
  }
  return best;
}

std::string KernelCache::path_of(const ir::Hash128& key) const {
  const std::string hex = key.hex();
  return fmt::format("{}/kernels/{}/{}.cubin", dir_, hex.substr(0, 2), hex);
}

// A disk miss: the remote's entry, verified (its tag by the remote cache,
// then magic, format, key and checksum as a disk entry), written to disk.
std::optional<std::string> KernelCache::from_remote(const ir::Hash128& key) const {
  RemoteCache* remote = RemoteCache::instance();
  if (!remote) return std::nullopt;
  std::optional<std::string> bytes = remote->get("kernel", key.hex());
  if (!bytes) return std::nullopt;
  Parsed p;
  if (const std::string problem = parse(*bytes, &key, p); !problem.empty()) {
    remote->note_refused("kernel", key.hex(), problem);
    return std::nullopt;
  }
  (void)write_entry(path_of(key), *bytes);  // a failed write only costs the next process a remote read
  return p.cubin;
}

std::optional<std::string> KernelCache::load(const ir::Hash128& key) const {
  const std::string path = path_of(key);
  std::error_code exists_ec;
  if (!fs::exists(fs::symlink_status(path, exists_ec))) return from_remote(key);
  Parsed p;
  if (!load_entry(path, &key, p).empty()) {  // corrupt, truncated or grown: drop it, recompile
    remove_if_kilns(path, kMagicText);        // (not kiln's: left; the store replaces it)
    return std::nullopt;
  }
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, 0);  // last use
  return p.cubin;
}

namespace {

// A disk entry: header (magic, format, key, sizes, checksum) + meta + cubin.
std::string entry_bytes(const KeyParts& parts, const std::string& kind, const std::string& cubin) {
  const ir::Hash128 key = parts.key();
  const std::string meta = nlohmann::json{{"source", parts.source}, {"arch", parts.arch}, {"nvrtc", parts.nvrtc},
                                          {"kiln", parts.kiln}, {"options", parts.options}, {"kind", kind}}.dump();
  const std::string body = meta + cubin;
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.format = kFormat;
  h.meta_size = static_cast<uint32_t>(meta.size());
  h.key_high = key.high;
  h.key_low = key.low;
  h.size = body.size();
  h.checksum = entry_checksum(h.key_high, h.key_low, body.data(), body.size());
  return std::string(reinterpret_cast<const char*>(&h), sizeof h) + body;
}

}  // namespace

Status KernelCache::write_entry(const std::string& path, const std::string& bytes) const {
  // A `cache clear` running beside this writer may remove the folder
  // between its creation and the rename: make it again and retry.
  Status written;
  for (int attempt = 0; attempt < 3; ++attempt) {
    written = write_entry_once(path, bytes);
    if (written || errno != ENOENT) break;
  }
  return written;
}

Status KernelCache::write_entry_once(const std::string& path, const std::string& bytes) const {
  const fs::path folder = fs::path(path).parent_path();
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec) return Error{ErrorCode::CompileOrDevice, fmt::format("kernel cache: cannot create {}: {}", folder.string(), ec.message())};
  for (fs::path p = folder; p.string().size() >= dir_.size() && p != p.parent_path(); p = p.parent_path()) ::chmod(p.c_str(), 0700);
  const std::string temp = fmt::format("{}.tmp.{}.{:08x}", path, ::getpid(), std::random_device{}());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, 0600);
  if (fd < 0) return Error{ErrorCode::CompileOrDevice, fmt::format("kernel cache: cannot write {}: {}", temp, std::strerror(errno))};
  const bool ok = write_all(fd, bytes) && ::fsync(fd) == 0;
  int saved_errno = errno;
  ::close(fd);
  if (ok && std::rename(temp.c_str(), path.c_str()) == 0) return {};
  if (ok) saved_errno = errno;
  ::unlink(temp.c_str());
  errno = saved_errno;
  return Error{ErrorCode::CompileOrDevice, fmt::format("kernel cache: writing {} failed: {}", path, std::strerror(saved_errno))};
}

Status KernelCache::store(const KeyParts& parts, const std::string& kind, const std::string& cubin) const {
  const ir::Hash128 key = parts.key();
  const std::string bytes = entry_bytes(parts, kind, cubin);
  if (Status s = write_entry(path_of(key), bytes); !s) return s;
  publish("kernel", key.hex(), bytes);  // write-through: the fleet gets it too
  return {};
}

std::vector<CacheEntry> KernelCache::list(std::vector<std::string>* problems, bool remove_bad,
                                         std::vector<std::string>* foreign) const {
  std::vector<CacheEntry> out;
  const fs::path root = fs::path(dir_) / "kernels";
  std::error_code ec;
  if (!fs::exists(root, ec)) return out;
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::skip_permission_denied, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    if (ec) break;
    if (it->is_directory(ec) && !it->is_symlink(ec)) continue;  // the <2 hex> folders (walked into)
    const std::string path = it->path().string();
    if (!is_candidate_entry(it->path(), ".cubin", kMagicText, problems, remove_bad, foreign)) continue;
    const std::optional<ir::Hash128> key = ir::Hash128::from_hex(it->path().stem().string());
    Parsed p;
    const std::string why = key ? load_entry(path, &*key, p) : "not named after a key";
    if (!why.empty()) {
      if (!carries_header(path, kMagicText)) {
        if (foreign) foreign->push_back(path);
        continue;
      }
      if (problems) problems->push_back(fmt::format("{}: {}", path, why));
      if (remove_bad) remove_if_kilns(path, kMagicText);
      continue;
    }
    CacheEntry e;
    e.path = path;
    e.key = *key;
    e.parts = parts_of(p.meta);
    e.kind = p.meta.value("kind", "");
    e.bytes = static_cast<int64_t>(it->file_size(ec));
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) e.last_use = st.st_mtime;
    out.push_back(std::move(e));
  }
  return out;
}

int KernelCache::evict(int64_t limit) const {
  // Stale temporaries of writers that died and damaged entries go first: they count against the limit too.
  std::vector<CacheEntry> entries = list(nullptr, true);
  int64_t total = 0;
  for (const CacheEntry& e : entries) total += e.bytes;
  if (total <= limit) return 0;
  std::sort(entries.begin(), entries.end(), [](const CacheEntry& a, const CacheEntry& b) { return a.last_use < b.last_use; });
  int removed = 0;
  for (const CacheEntry& e : entries) {
    if (total <= limit) break;
    if (remove_if_kilns(e.path, kMagicText)) total -= e.bytes, ++removed;
  }
  return removed;
}

}  // namespace kiln::runtime
