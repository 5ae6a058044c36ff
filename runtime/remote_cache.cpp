#include "runtime/remote_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bitset>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "runtime/cache_dir.h"
#include "runtime/log.h"

#ifdef KILN_HAVE_REMOTE_CACHE
#include <hiredis/hiredis.h>  // (its version, for the TLS message)
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "runtime/redis_connection.h"
#endif

namespace kiln::runtime {

namespace {
constexpr std::string_view kMagic = "KILNR1";
constexpr size_t kTagBytes = 32;

struct Url {
  std::string host = "127.0.0.1", user, password;
  int port = 6379, db = 0;
  bool tls = false;
};

// redis://[user[:password]@]host[:port][/db], rediss:// for TLS.
Expected<Url> parse_url(const std::string& text) {
  Url u;
  std::string rest;
  if (text.rfind("redis://", 0) == 0) {
    rest = text.substr(8);
  } else if (text.rfind("rediss://", 0) == 0) {
    rest = text.substr(9);
    u.tls = true;
  } else {
    return Error{ErrorCode::InvalidInput,
                 fmt::format("remote cache '{}': expected redis://[user:password@]host[:port][/db] or rediss://...", text)};
  }
  if (const size_t at = rest.rfind('@'); at != std::string::npos) {
    const std::string credentials = rest.substr(0, at);
    rest = rest.substr(at + 1);
    const size_t colon = credentials.find(':');
    if (colon == std::string::npos) {
      u.password = credentials;
    } else {
      u.user = credentials.substr(0, colon);
      u.password = credentials.substr(colon + 1);
    }
  }
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
    char* end = nullptr;
    const long n = db.empty() ? 0 : std::strtol(db.c_str(), &end, 10);
    if (!db.empty() && (*end != '\0' || n < 0 || n > 1 << 20))
      return Error{ErrorCode::InvalidInput, fmt::format("remote cache: database '{}' is not a number", db)};
    u.db = static_cast<int>(n);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    char* end = nullptr;
    const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || port < 1 || port > 65535)
      return Error{ErrorCode::InvalidInput, fmt::format("remote cache: port '{}' is not a port number", rest.substr(colon + 1))};
    u.port = static_cast<int>(port);
    rest = rest.substr(0, colon);
  }
  if (!rest.empty()) u.host = rest;
  return u;
}

std::string described(const Url& u) {
  return fmt::format("{}://{}{}:{}/{}", u.tls ? "rediss" : "redis", u.user.empty() && u.password.empty() ? "" : "***@", u.host,
                     u.port, u.db);
}

// Counters of this process, added to the cache folder's when it ends.
std::atomic<int64_t> hits{0}, misses{0}, writes{0}, refused{0}, errors{0};

}  // namespace

std::string remote_key(std::string_view kind, const std::string& id) { return fmt::format("kiln:v1:{}:{}", kind, id); }

#ifdef KILN_HAVE_REMOTE_CACHE

std::string seal(const std::string& secret, const std::string& key, const std::string& payload) {
  std::string message = key;
  message.push_back('\0');
  message += payload;
  unsigned char tag[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(message.data()),
       message.size(), tag, &length);
  std::string value(kMagic);
  value.append(reinterpret_cast<const char*>(tag), length);
  value += payload;
  return value;
}

std::optional<std::string> unseal(const std::string& secret, const std::string& key, const std::string& value) {
  if (value.size() < kMagic.size() + kTagBytes || value.compare(0, kMagic.size(), kMagic) != 0) return std::nullopt;
  const std::string payload = value.substr(kMagic.size() + kTagBytes);
  const std::string expected = seal(secret, key, payload);
  if (CRYPTO_memcmp(expected.data() + kMagic.size(), value.data() + kMagic.size(), kTagBytes) != 0) return std::nullopt;
  return payload;
}

#else

std::string seal(const std::string&, const std::string&, const std::string& payload) { return std::string(kMagic) + payload; }
std::optional<std::string> unseal(const std::string&, const std::string&, const std::string&) { return std::nullopt; }

#endif

Expected<std::string> read_secret_file(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return Error{ErrorCode::InvalidInput, fmt::format("remote cache secret '{}': {} (it must be a regular file, not a link)",
                                                      path, std::strerror(errno))};
  struct stat st {};
  std::string secret;
  auto refuse = [&](const std::string& why) {
    ::close(fd);
    return Error{ErrorCode::InvalidInput, fmt::format("remote cache secret '{}': {}", path, why)};
  };
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return refuse("not a regular file");
  if (st.st_uid != ::geteuid()) return refuse(fmt::format("owned by uid {}, not by this user (uid {})", st.st_uid, ::geteuid()));
  if ((st.st_mode & 077) != 0)
    return refuse(fmt::format("others may read it (mode {:04o}); chmod 600 '{}'", st.st_mode & 07777, path));
  if (st.st_size > (1 << 16)) return refuse("larger than 64 KiB");
  secret.resize(static_cast<size_t>(st.st_size));
  if (st.st_size > 0 && ::read(fd, secret.data(), secret.size()) != st.st_size) return refuse("could not be read");
  ::close(fd);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.size() < 16) return Error{ErrorCode::InvalidInput, fmt::format("remote cache secret '{}': shorter than 16 bytes", path)};
  return secret;
}

#ifdef KILN_HAVE_REMOTE_CACHE

struct RemoteCache::Impl {
  Url url;
  std::string secret;
  int timeout_ms = 250;
  int breaker_ms = 30000;
  std::mutex mutex;
  std::unique_ptr<RedisConnection> connection;
  RemoteClock::time_point down_until{};
  unsigned recent_slow = 0;              // the last kSlowWindow exchanges, newest in bit 0 (1: slow)
  std::set<std::string> refused_keys;    // refused once: not asked, warned about or counted again

  std::chrono::milliseconds timeout() const { return std::chrono::milliseconds(timeout_ms); }

  void trip(const std::string& why) {
    connection.reset();
    recent_slow = 0;
    ++errors;
    down_until = RemoteClock::now() + std::chrono::milliseconds(breaker_ms);
    detail::warn(fmt::format("remote cache {}: {}; not asked again for {} s (compiling goes on locally)", described(url), why,
                             breaker_ms / 1000));
  }

  // Counts an exchange that took `took`; trips the breaker (true) when the
  // server has become too slow to be worth asking.
  bool note_time(RemoteClock::duration took) {
    recent_slow = ((recent_slow << 1) | (took * 2 > timeout() ? 1u : 0u)) & ((1u << kSlowWindow) - 1);
    if (std::bitset<kSlowWindow>(recent_slow).count() < kSlowTrips) return false;
    trip(fmt::format("{} of its last {} answers took more than half the {} ms timeout", kSlowTrips, kSlowWindow, timeout_ms));
    return true;
  }

  // One request on the open connection, bounded by the timeout as a whole.
  // Anything but a reply trips the breaker, except, for a GET, a value
  // longer than kMaxRemoteValueBytes (that entry is refused; the connection
  // is dropped with the value unread).
  RedisExchange exchange(const std::vector<std::string>& argv) {
    const bool get = argv.front() == "GET";
    const RemoteClock::time_point start = RemoteClock::now();
    RedisExchange r = connection->exchange(argv, start + timeout(), get ? kMaxRemoteValueBytes : kMaxReplyLine);
    using Outcome = RedisExchange::Outcome;
    switch (r.outcome) {
      case Outcome::Reply:
        if (r.reply.kind == RedisReply::Kind::Error) {
          trip("the server answered: " + r.reply.text);
          r.outcome = Outcome::Protocol;
          return r;
        }
        note_time(RemoteClock::now() - start);  // a reply that came is used even if it was the last slow one
        return r;
      case Outcome::TooLarge:
        if (!get) {
          trip("not a Redis answer: " + r.why + " where a status was expected");
          return r;
        }
        connection.reset();
        note_time(RemoteClock::now() - start);
        return r;
      case Outcome::Timeout:
        trip(fmt::format("no whole answer within the {} ms timeout ({})", timeout_ms, r.why));
        return r;
      case Outcome::Closed:
        trip(r.why);
        return r;
      case Outcome::Protocol:
        trip("not a Redis answer: " + r.why);
        return r;
    }
    return r;
  }

  // The reply to a command, or why none (the breaker is open, or this
  // exchange tripped it, or the value was too large).
  RedisExchange command(const std::vector<std::string>& argv) {
    if (RemoteClock::now() < down_until) return unavailable();
    if (connection && !connection->usable()) connection.reset();  // closed by the server while idle: connect again
    if (!connection && !connect()) return unavailable();
    return exchange(argv);
  }

  static RedisExchange unavailable() {
    RedisExchange r;
    r.outcome = RedisExchange::Outcome::Closed;
    return r;
  }

  bool connect() {
    const RemoteClock::time_point start = RemoteClock::now();
    std::string why;
    connection = RedisConnection::open(url.host, url.port, start + timeout(), why);
    if (!connection) {
      trip("cannot connect: " + why);
      return false;
    }
    if (note_time(RemoteClock::now() - start)) return false;
    auto simple = [&](const std::vector<std::string>& argv) { return exchange(argv).outcome == RedisExchange::Outcome::Reply; };
    if (!url.password.empty() &&
        !simple(url.user.empty() ? std::vector<std::string>{"AUTH", url.password} : std::vector<std::string>{"AUTH", url.user, url.password}))
      return false;
    if (url.db != 0 && !simple({"SELECT", std::to_string(url.db)})) return false;
    return connection != nullptr;  // (a slow AUTH may have tripped the breaker)
  }

  // The value under `key` is not used, nor asked for again by this process.
  void refuse(const std::string& key, const std::string& why) {
    if (!refused_keys.insert(key).second) return;
    ++refused;
    detail::warn(fmt::format("remote cache: the value under {} is refused: {}; compiling it instead", key, why));
  }
};

RemoteCache* RemoteCache::instance() {
  static std::once_flag once;
  static std::unique_ptr<RemoteCache> cache;
  std::call_once(once, [] {
    const std::shared_ptr<const Options> o = current_options();
    if (o->remote_cache.empty()) return;
    Expected<Url> url = parse_url(o->remote_cache);
    if (!url) return detail::warn(url.error().message + "; the remote cache is off");
    if (url->tls)
      return detail::warn(fmt::format("remote cache {}: TLS (rediss://) needs hiredis 1.0 or newer with SSL; this kiln was built "
                                      "with hiredis {}.{}; the remote cache is off",
                                      described(*url), HIREDIS_MAJOR, HIREDIS_MINOR));
    if (o->remote_secret_file.empty())
      return detail::warn(fmt::format("remote cache {}: no secret (KILN_REMOTE_CACHE_SECRET_FILE): entries could not be "
                                      "authenticated, so the remote cache is off",
                                      described(*url)));
    Expected<std::string> secret = read_secret_file(o->remote_secret_file);
    if (!secret) return detail::warn(secret.error().message + "; the remote cache is off");
    auto impl = std::make_unique<Impl>();
    impl->url = *url;
    impl->secret = std::move(*secret);
    impl->timeout_ms = o->remote_timeout_ms;
    impl->breaker_ms = o->remote_breaker_ms;
    cache.reset(new RemoteCache(std::move(impl), described(*url)));
    cache->cache_dir_ = o->use_cache ? o->cache_dir : "";
  });
  return cache.get();
}

std::optional<std::string> RemoteCache::get(std::string_view kind, const std::string& id) {
  const std::string key = remote_key(kind, id);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->refused_keys.count(key)) return std::nullopt;
  const RedisExchange r = impl_->command({"GET", key});
  if (r.outcome == RedisExchange::Outcome::TooLarge) {
    impl_->refuse(key, fmt::format("the server announced {} bytes, more than the {} MiB a kiln entry may be, so it was not read",
                                   r.claimed, kMaxRemoteValueBytes >> 20));
    ++misses;
    return std::nullopt;
  }
  if (r.outcome != RedisExchange::Outcome::Reply) return std::nullopt;
  if (r.reply.kind != RedisReply::Kind::Bulk && r.reply.kind != RedisReply::Kind::Nil) {
    impl_->trip("not a Redis answer: a GET answered with neither a value nor nil");
    return std::nullopt;
  }
  std::optional<std::string> payload;
  if (r.reply.kind == RedisReply::Kind::Bulk) {
    payload = unseal(impl_->secret, key, r.reply.text);
    if (!payload) impl_->refuse(key, "its tag does not verify (another secret, or damaged or forged)");
  }
  payload ? ++hits : ++misses;
  return payload;
}

void RemoteCache::put(std::string_view kind, const std::string& id, const std::string& payload) {
  const std::string key = remote_key(kind, id);
  std::string value = seal(impl_->secret, key, payload);
  if (value.size() > kMaxRemoteValueBytes) return;  // every reader would refuse it
  std::lock_guard<std::mutex> lock(impl_->mutex);
  if (impl_->command({"SET", key, std::move(value)}).outcome == RedisExchange::Outcome::Reply) ++writes;
}

std::optional<bool> RemoteCache::holds(std::string_view kind, const std::string& id) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  const RedisExchange r = impl_->command({"EXISTS", remote_key(kind, id)});
  if (r.outcome != RedisExchange::Outcome::Reply) return std::nullopt;
  return r.reply.kind == RedisReply::Kind::Integer && r.reply.integer > 0;
}

void RemoteCache::note_refused(std::string_view kind, const std::string& id, const std::string& why) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  --hits;
  ++misses;
  impl_->refuse(remote_key(kind, id), why);
}

#else

struct RemoteCache::Impl {};

RemoteCache* RemoteCache::instance() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!current_options()->remote_cache.empty())
      detail::warn("this kiln was built without hiredis and OpenSSL: the remote cache is off");
  });
  return nullptr;
}
std::optional<std::string> RemoteCache::get(std::string_view, const std::string&) { return std::nullopt; }
void RemoteCache::put(std::string_view, const std::string&, const std::string&) {}
std::optional<bool> RemoteCache::holds(std::string_view, const std::string&) { return std::nullopt; }
void RemoteCache::note_refused(std::string_view, const std::string&, const std::string&) {}

#endif

RemoteCache::RemoteCache(std::unique_ptr<Impl> impl, std::string description)
    : impl_(std::move(impl)), description_(std::move(description)) {}

void publish(std::string_view kind, const std::string& id, const std::string& payload) {
  if (RemoteCache* remote = RemoteCache::instance()) remote->put(kind, id, payload);
}

void write_document(const std::string& path, const std::string& text) {
  const std::filesystem::path folder = std::filesystem::path(path).parent_path();
  if (make_cache_folder(folder)) write_file_atomically(path, text);
}

RemoteCounters RemoteCache::counters() const { return {hits.load(), misses.load(), writes.load(), refused.load(), errors.load()}; }

// ---- counters kept in the cache folder ----

namespace {

std::string counters_path(const std::string& dir) { return (std::filesystem::path(dir) / "remote_counters").string(); }

RemoteCounters parse_counters(const std::string& text) {
  RemoteCounters c;
  std::sscanf(text.c_str(), "hits %lld misses %lld writes %lld refused %lld errors %lld",
              reinterpret_cast<long long*>(&c.hits), reinterpret_cast<long long*>(&c.misses),
              reinterpret_cast<long long*>(&c.writes), reinterpret_cast<long long*>(&c.refused),
              reinterpret_cast<long long*>(&c.errors));
  return c;
}

}  // namespace

RemoteCounters stored_counters(const std::string& cache_dir) {
  std::string text;
  read_regular_file(counters_path(cache_dir), text);
  return parse_counters(text);
}

RemoteCache::~RemoteCache() {
  // Add this process's counters to the cache folder's (under a lock: processes end at once).
  const RemoteCounters mine = counters();
  if (mine.hits + mine.misses + mine.writes + mine.refused + mine.errors == 0) return;
  const std::string& dir = cache_dir_;
  if (dir.empty() || !secure_cache_dir(dir)) return;
  const std::string lock_path = (std::filesystem::path(dir) / "remote_counters.lock").string();
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return;
  if (::flock(fd, LOCK_EX) == 0) {
    RemoteCounters all = stored_counters(dir);
    all.hits += mine.hits, all.misses += mine.misses, all.writes += mine.writes, all.refused += mine.refused,
        all.errors += mine.errors;
    write_file_atomically(counters_path(dir), fmt::format("hits {} misses {} writes {} refused {} errors {}\n", all.hits,
                                                          all.misses, all.writes, all.refused, all.errors));
  }
  ::close(fd);
}

}  // namespace kiln::runtime
