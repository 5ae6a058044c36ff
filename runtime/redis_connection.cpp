// (Built only with hiredis: KILN_HAVE_REMOTE_CACHE, CMakeLists.txt.)
#include "runtime/redis_connection.h"

#ifdef KILN_HAVE_REMOTE_CACHE

#include <fcntl.h>
#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>

namespace kiln::runtime {
namespace {

constexpr size_t kReadChunk = size_t{64} << 10;

// Milliseconds left until `deadline`, rounded up; 0 when it has passed.
int millis_left(RemoteClock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - RemoteClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Whether `fd` became ready for `events` before `deadline`.
bool wait_for(int fd, short events, RemoteClock::time_point deadline) {
  for (;;) {
    const int left = millis_left(deadline);
    if (left == 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, left);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// A RESP integer: an optional '-' and decimal digits, nothing else.
bool parse_integer(std::string_view text, long long& out) {
  if (text.empty()) return false;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && ptr == end && text.front() != '+';
}

RedisExchange failed(RedisExchange::Outcome outcome, std::string why) {
  RedisExchange out;
  out.outcome = outcome;
  out.why = std::move(why);
  return out;
}

}  // namespace

RedisConnection::RedisConnection(redisContext* context) : context_(context) {}

RedisConnection::~RedisConnection() { redisFree(context_); }

std::unique_ptr<RedisConnection> RedisConnection::open(const std::string& host, int port, RemoteClock::time_point deadline,
                                                       std::string& why) {
  const int left = std::max(1, millis_left(deadline));
  const timeval tv{left / 1000, (left % 1000) * 1000};
  redisContext* context = redisConnectWithTimeout(host.c_str(), port, tv);
  if (!context || context->err) {
    why = context ? context->errstr : "out of memory";
    if (context) redisFree(context);
    return nullptr;
  }
  const int flags = ::fcntl(context->fd, F_GETFL);
  if (flags < 0 || ::fcntl(context->fd, F_SETFL, flags | O_NONBLOCK) != 0) {
    why = fmt::format("cannot make the socket non-blocking: {}", std::strerror(errno));
    redisFree(context);
    return nullptr;
  }
  return std::unique_ptr<RedisConnection>(new RedisConnection(context));
}

bool RedisConnection::usable() const {
  pollfd p{context_->fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;  // readable while nothing was asked: closed, or unasked bytes
}

bool RedisConnection::send_all(const std::string& bytes, RemoteClock::time_point deadline, RedisExchange& out) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t n = ::send(context_->fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!wait_for(context_->fd, POLLOUT, deadline)) {
        out = failed(RedisExchange::Outcome::Timeout, fmt::format("it took {} of the request's {} bytes in time", done, bytes.size()));
        return false;
      }
    } else {
      out = failed(RedisExchange::Outcome::Closed, fmt::format("sending failed: {}", std::strerror(errno)));
      return false;
    }
  }
  return true;
}

bool RedisConnection::read_some(size_t most, RemoteClock::time_point deadline, RedisExchange& out) {
  for (;;) {
    if (!wait_for(context_->fd, POLLIN, deadline)) {
      out = failed(RedisExchange::Outcome::Timeout, fmt::format("{} bytes of its answer came in time", buffer_.size()));
      return false;
    }
    const size_t have = buffer_.size();
    buffer_.resize(have + most);
    const ssize_t n = ::recv(context_->fd, buffer_.data() + have, most, 0);
    buffer_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) return true;
    if (n == 0) {
      out = failed(RedisExchange::Outcome::Closed, "it closed the connection");
      return false;
    }
    if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      out = failed(RedisExchange::Outcome::Closed, fmt::format("reading failed: {}", std::strerror(errno)));
      return false;
    }
  }
}

bool RedisConnection::fill(size_t size, RemoteClock::time_point deadline, RedisExchange& out) {
  while (buffer_.size() < size)
    if (!read_some(std::min(kReadChunk, size - buffer_.size()), deadline, out)) return false;
  return true;
}

bool RedisConnection::line(size_t& length, RemoteClock::time_point deadline, RedisExchange& out) {
  for (size_t searched = 0;;) {
    if (const size_t end = buffer_.find("\r\n", searched); end != std::string::npos) {
      length = end;
      return true;
    }
    searched = buffer_.empty() ? 0 : buffer_.size() - 1;  // a CR may end what came so far
    if (buffer_.size() >= kMaxReplyLine + 2) {
      out = failed(RedisExchange::Outcome::Protocol, fmt::format("a reply line longer than {} KiB", kMaxReplyLine >> 10));
      return false;
    }
    if (!read_some(std::min(kReadChunk, kMaxReplyLine + 2 - buffer_.size()), deadline, out)) return false;
  }
}

RedisExchange RedisConnection::exchange(const std::vector<std::string>& argv, RemoteClock::time_point deadline, size_t max_bulk) {
  buffer_.clear();
  std::vector<const char*> args;
  std::vector<size_t> lengths;
  for (const std::string& a : argv) args.push_back(a.data()), lengths.push_back(a.size());
  char* formatted = nullptr;
  const int size = redisFormatCommandArgv(&formatted, static_cast<int>(args.size()), args.data(), lengths.data());
  if (size < 0) return failed(RedisExchange::Outcome::Protocol, "the request could not be formatted (out of memory)");
  const std::string request(formatted, static_cast<size_t>(size));
  redisFreeCommand(formatted);

  RedisExchange out;
  size_t length = 0;
  if (!send_all(request, deadline, out) || !line(length, deadline, out)) return out;
  if (length == 0) return failed(RedisExchange::Outcome::Protocol, "an empty reply line");
  const std::string_view head(buffer_.data() + 1, length - 1);
  size_t consumed = length + 2;
  switch (buffer_[0]) {
    case '+':
      out.reply.kind = RedisReply::Kind::Status;
      out.reply.text = head;
      break;
    case '-':
      out.reply.kind = RedisReply::Kind::Error;
      out.reply.text = head;
      break;
    case ':':
      out.reply.kind = RedisReply::Kind::Integer;
      if (!parse_integer(head, out.reply.integer))
        return failed(RedisExchange::Outcome::Protocol, fmt::format("an integer reply '{:.40}' that is not a number", head));
      break;
    case '$': {
      long long bulk = 0;
      if (!parse_integer(head, bulk) || bulk < -1)
        return failed(RedisExchange::Outcome::Protocol, fmt::format("a bulk string whose length '{:.40}' is not one", head));
      if (bulk == -1) {
        out.reply.kind = RedisReply::Kind::Nil;
        break;
      }
      if (static_cast<unsigned long long>(bulk) > max_bulk) {
        out = failed(RedisExchange::Outcome::TooLarge, fmt::format("it announced a value of {} bytes", bulk));
        out.claimed = bulk;
        return out;
      }
      const size_t body = static_cast<size_t>(bulk);
      buffer_.reserve(consumed + body + 2);
      if (!fill(consumed + body + 2, deadline, out)) return out;
      if (buffer_.compare(consumed + body, 2, "\r\n") != 0)
        return failed(RedisExchange::Outcome::Protocol, "a bulk string not ended by CRLF");
      out.reply.kind = RedisReply::Kind::Bulk;
      out.reply.text = std::move(buffer_);  // taken, not copied: the value may be megabytes
      out.reply.text.erase(0, consumed);
      out.reply.text.resize(body);
      buffer_.clear();
      consumed = 0;
      break;
    }
    case '*':
      return failed(RedisExchange::Outcome::Protocol, "an array reply (none of kiln's requests is answered with one)");
    default:
      return failed(RedisExchange::Outcome::Protocol, fmt::format("a reply beginning with byte 0x{:02x}", static_cast<unsigned char>(buffer_[0])));
  }
  if (buffer_.size() > consumed) return failed(RedisExchange::Outcome::Protocol, "more than one reply to one request");
  buffer_.clear();
  return out;
}

}  // namespace kiln::runtime

#endif  // KILN_HAVE_REMOTE_CACHE
