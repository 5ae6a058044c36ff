"""A Redis server that misbehaves, for the remote-cache tests.

It listens on 127.0.0.1 only, on a port of its own, in threads of the test
process; every loop is bounded (in bytes and in time), and it stops itself
after `lifetime` seconds if the test has not stopped it first. One way of
misbehaving per server:

  silent   reads the requests and never answers
  trickle  answers the first request with `$100000\\r\\n`, then one byte every 200 ms
  slow     answers like an empty Redis (GET: nil, EXISTS: 0, anything else: +OK),
           each answer `delay` seconds late (just under the client's timeout)
  huge     answers with a bulk string said to be 2 GB, then sends up to `cap`
           bytes of it as fast as the client takes them
  nested   answers with arrays nested `depth` deep
  wide     answers with an array said to hold 2**31 - 1 elements

`answered` counts the answers begun, `sent` the bytes sent to clients.
"""
import socket
import socketserver
import threading
import time

MAX_REQUEST = 64 << 20  # a client request larger than this is not read further


class _Handler(socketserver.BaseRequestHandler):
    def handle(self):
        server = self.server.owner
        sock = self.request
        sock.settimeout(0.2)
        pending = b""
        while not server.stopping.is_set():
            request, pending = _next_request(sock, pending, server.stopping)
            if request is None:
                return
            if not server.answer(sock, request):
                return


def _next_request(sock, pending, stopping):
    """One RESP request (a list of byte strings) from the client, or None when it has gone."""
    while not stopping.is_set():
        parsed = _parse(pending)
        if parsed is not None:
            return parsed
        if len(pending) > MAX_REQUEST:
            return None, b""
        try:
            chunk = sock.recv(1 << 16)
        except socket.timeout:
            continue
        except OSError:
            return None, b""
        if not chunk:
            return None, b""
        pending += chunk
    return None, b""


def _parse(data):
    """(arguments, rest) when `data` begins with a whole request, else None."""
    if not data.startswith(b"*"):
        return None
    end = data.find(b"\r\n")
    if end < 0:
        return None
    count, pos, args = int(data[1:end]), end + 2, []
    for _ in range(count):
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None
        length = int(data[pos + 1:end])
        start = end + 2
        if len(data) < start + length + 2:
            return None
        args.append(data[start:start + length])
        pos = start + length + 2
    return args, data[pos:]


class MisbehavingRedis:
    def __init__(self, behaviour, delay=0.2, cap=256 << 20, depth=100000, lifetime=120):
        self.behaviour, self.delay, self.cap, self.depth = behaviour, delay, cap, depth
        self.stopping = threading.Event()
        self.answered = 0
        self.sent = 0
        self._lock = threading.Lock()
        self._server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.owner = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        self._timer = threading.Timer(lifetime, self.stop)
        self._timer.daemon = True
        self._timer.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def stop(self):
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._timer.cancel()
        self._server.shutdown()
        self._server.server_close()

    def _send(self, sock, data):
        """Sends `data` unless the client has gone or the server is stopping; False then."""
        view = memoryview(data)
        while view and not self.stopping.is_set():
            try:
                n = sock.send(view)
            except socket.timeout:
                continue
            except OSError:
                return False
            with self._lock:
                self.sent += n
            view = view[n:]
        return not view

    def answer(self, sock, request):
        with self._lock:
            self.answered += 1
        command = request[0].upper() if request else b""
        if self.behaviour == "silent":
            return True
        if self.behaviour == "slow":
            time.sleep(self.delay)
            reply = {b"GET": b"$-1\r\n", b"EXISTS": b":0\r\n"}.get(command, b"+OK\r\n")
            return self._send(sock, reply)
        if self.behaviour == "trickle":
            if not self._send(sock, b"$100000\r\n"):
                return False
            for _ in range(100000):
                if self.stopping.wait(0.2) or not self._send(sock, b"x"):
                    return False
            return False
        if self.behaviour == "huge":
            if not self._send(sock, b"$2000000000\r\n"):
                return False
            chunk = b"x" * (1 << 20)
            for _ in range(self.cap // len(chunk)):
                if not self._send(sock, chunk):
                    return False
            self.stopping.wait(30)  # then silent, as a server that is still "sending"
            return False
        if self.behaviour == "nested":
            return self._send(sock, b"*1\r\n" * self.depth + b":1\r\n")
        if self.behaviour == "wide":
            return self._send(sock, b"*2147483647\r\n") and not self.stopping.wait(30)
        raise ValueError(self.behaviour)
