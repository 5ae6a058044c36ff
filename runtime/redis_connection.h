// One connection to a Redis server whose every exchange is bounded in time
// and in size, whatever the server does.
//
// Expects: a host and port; hiredis connects (within the connect deadline)
// and formats requests, and this file owns the socket from then on. Name
// resolution (getaddrinfo) is not bounded: give an address, or a name the
// resolver answers at once.
// Guarantees:
// - exchange() sends one request and reads its whole reply before the
//   deadline it is given, or gives up at the deadline: the socket is
//   non-blocking and every wait is a poll() for the time left, so a server
//   that stays silent, trickles a byte at a time or never ends its reply
//   costs at most that deadline (hiredis 0.14's timeout is per read: each
//   byte started it again).
// - A reply's header is checked before its body is read: a bulk string
//   longer than `max_bulk` is refused unread (TooLarge, with the length the
//   server claimed), and an array (no command kiln sends is answered with
//   one, so nesting never arises), a line longer than kMaxReplyLine or
//   anything else RESP2 does not allow is a protocol error. No claim of the
//   server's makes kiln allocate more than `max_bulk` plus one read.
// - After any outcome but a reply, the connection is in an unknown state:
//   the caller drops it.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

struct redisContext;

namespace kiln::runtime {

using RemoteClock = std::chrono::steady_clock;

// The reply kinds of RESP2 that kiln's commands (AUTH, SELECT, GET, SET,
// EXISTS) get.
struct RedisReply {
  enum class Kind { Status, Error, Integer, Nil, Bulk };
  Kind kind = Kind::Nil;
  std::string text;  // the status, the error message or the bulk string
  long long integer = 0;
};

struct RedisExchange {
  enum class Outcome { Reply, Timeout, Closed, Protocol, TooLarge };
  Outcome outcome = Outcome::Reply;
  RedisReply reply;       // Outcome::Reply
  std::string why;        // the others: what happened, for the log
  long long claimed = 0;  // Outcome::TooLarge: the length the server announced
};

// A status or error line, or an integer: longer is not a Redis server's answer.
constexpr size_t kMaxReplyLine = size_t{64} << 10;

class RedisConnection {
 public:
  // A connection, or null with `why` set.
  static std::unique_ptr<RedisConnection> open(const std::string& host, int port, RemoteClock::time_point deadline,
                                               std::string& why);
  ~RedisConnection();
  RedisConnection(const RedisConnection&) = delete;
  RedisConnection& operator=(const RedisConnection&) = delete;

  // The request `argv` and its reply, all before `deadline`.
  RedisExchange exchange(const std::vector<std::string>& argv, RemoteClock::time_point deadline, size_t max_bulk);
  // False when the server has closed the connection (an idle timeout of its
  // own) or sent something nobody asked for: the caller connects again.
  bool usable() const;

 private:
  explicit RedisConnection(redisContext* context);
  bool send_all(const std::string& bytes, RemoteClock::time_point deadline, RedisExchange& out);
  // One read of at most `most` bytes into `buffer_`, waiting for them until `deadline`.
  bool read_some(size_t most, RemoteClock::time_point deadline, RedisExchange& out);
  // Reads until `buffer_` holds at least `size` bytes.
  bool fill(size_t size, RemoteClock::time_point deadline, RedisExchange& out);
  // Reads until `buffer_` holds a whole line; its length without "\r\n" in `length`.
  bool line(size_t& length, RemoteClock::time_point deadline, RedisExchange& out);

  redisContext* context_;  // owns the socket
  std::string buffer_;     // bytes received and not yet taken
};

}  // namespace kiln::runtime
