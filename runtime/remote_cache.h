// The remote cache: a Redis server behind the disk cache, shared by a fleet
// (cli.md, "Remote cache").
//
// Expects: Options::remote_cache (redis://[user[:password]@]host[:port][/db])
// and Options::remote_secret_file (a regular file of the user's, readable by
// no one else, holding the fleet's secret).
// Guarantees: get() returns a payload only when its value carries a valid
// HMAC-SHA256 tag, made with the secret, over the entry's full key and the
// payload; anything else (another secret, a tampered or truncated value, a
// value copied under another key) is counted as refused and reported as a
// miss. Nothing here reaches NVRTC or the loader: callers check the payload
// again as they check disk entries (key parts, checksums). A value is
// refused once per process: asked for again, it is a miss, neither fetched,
// warned about nor counted again.
// Time and memory: each request (send and the whole reply) and the connect
// have a deadline of one timeout (redis_connection.h), not a limit per read.
// A server that is down, silent, trickling or speaking anything but Redis
// costs at most one timeout, after which a breaker keeps the remote off for
// a while; so does one that answers, but slowly: kSlowTrips of the last
// kSlowWindow answers taking over half the timeout trip the breaker too. A
// value longer than kMaxRemoteValueBytes is refused from its announced
// length, before any of it is read, and never written. Failures are never
// errors.
// One value per entry, a Redis string under kiln:v1:<kind>:<id>:
//   "KILNR1" + tag (32 bytes) + payload.
// Thread-safe (one connection, one request at a time).
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/options.h"
#include "kiln/status.h"

namespace kiln::runtime {

// The longest remote value kiln reads or writes. kiln's largest entries are
// kernels (header, metadata and cubin): the largest of the examples'
// (attention, matmul and conv for sm_90) is 173 KiB; recipes and tuning
// records are a few KiB. 16 MiB is about ninety times that, room for far
// larger kernels, while a planted value costs a client at most 16 MiB of
// memory (a 500 MB one cost a compile 11.9 s and 3.1 GB).
constexpr size_t kMaxRemoteValueBytes = size_t{16} << 20;
// A slow answer takes more than half the timeout; kSlowTrips of the last
// kSlowWindow trip the breaker (a server just under the timeout every time
// would otherwise delay every request by almost all of it, unnoticed).
constexpr int kSlowWindow = 8;
constexpr int kSlowTrips = 3;

struct RemoteCounters {
  int64_t hits = 0, misses = 0, writes = 0, refused = 0, errors = 0;
};

class RemoteCache {
 public:
  // The process's remote cache from the settings in force, or null when
  // none is configured or it cannot be used (said once, through the log).
  static RemoteCache* instance();

  // kind: "kernel", "recipe", "tuning"; id: the entry's hex key.
  std::optional<std::string> get(std::string_view kind, const std::string& id);
  void put(std::string_view kind, const std::string& id, const std::string& payload);
  // Whether the server holds a value under that key (not verified); nullopt
  // when the server cannot be asked.
  std::optional<bool> holds(std::string_view kind, const std::string& id);

  RemoteCounters counters() const;
  // A payload whose tag verified but that the caller's own checks refuse.
  void note_refused(std::string_view kind, const std::string& id, const std::string& why);
  const std::string& description() const { return description_; }  // the URL without the password
  ~RemoteCache();

  struct Impl;

 private:
  explicit RemoteCache(std::unique_ptr<Impl> impl, std::string description);
  std::unique_ptr<Impl> impl_;
  std::string description_;
  std::string cache_dir_;  // where the counters are kept
};

// The full key of an entry (kiln:v1:kernel:<id>).
std::string remote_key(std::string_view kind, const std::string& id);
// value = "KILNR1" + HMAC-SHA256(secret, key + '\0' + payload) + payload.
std::string seal(const std::string& secret, const std::string& key, const std::string& payload);
// The payload of a sealed value, if its tag verifies for this key.
std::optional<std::string> unseal(const std::string& secret, const std::string& key, const std::string& value);
// The secret in `path`, or an Error saying why it is refused.
Expected<std::string> read_secret_file(const std::string& path);

// Writes `payload` to the remote cache, where one is configured.
void publish(std::string_view kind, const std::string& id, const std::string& payload);

// Writes a document fetched from the remote (its folder made private first).
void write_document(const std::string& path, const std::string& text);

// A document (graph recipe, tuning record) the remote holds, accepted by
// `parse` (its own checksum and fields), then written to `path` on disk.
template <class T, class Parse>
std::optional<T> fetch_document(std::string_view kind, const std::string& id, const std::string& path, Parse parse) {
  RemoteCache* remote = RemoteCache::instance();
  if (!remote) return std::nullopt;
  std::optional<std::string> text = remote->get(kind, id);
  if (!text) return std::nullopt;
  std::optional<T> doc = parse(*text);
  if (!doc) {
    remote->note_refused(kind, id, "it does not parse as one");
    return std::nullopt;
  }
  write_document(path, *text);
  return doc;
}

// Counters of earlier processes, kept in <cache dir>/remote_counters; this
// process's are added when it ends.
RemoteCounters stored_counters(const std::string& cache_dir);

}  // namespace kiln::runtime
