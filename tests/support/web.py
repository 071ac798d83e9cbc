"""A real HTTP server for the web-input tests: a ThreadingHTTPServer on a port the kernel picks (and
that it holds until stopped), serving generated images and every way a server can misbehave. It
counts what a test asserts on: requests and connections at once, bytes sent of the large body,
requests per path, and the headers it received."""

from __future__ import annotations

import collections
import gzip
import http.server
import io
import select
import socket
import struct
import threading
import time
import urllib.parse
from typing import Dict, List, Mapping, Optional

import numpy as np
from PIL import Image

LARGE_BYTES = 256 * 1024 * 1024  # what /large would send if nobody stopped it
SERVER_WORDS = "srv-phrase-7f3a"  # in every reason phrase and odd header the server sends: no reason may hold it


def jpeg(i: int, size=(40, 30)) -> bytes:
    """A baseline JPEG fixed by `i` (it passes through a default build unchanged)."""
    yy, xx = np.mgrid[0:size[1], 0:size[0]]
    pixels = np.stack([(xx * 6 + i * 13) % 256, (yy * 8 + i * 29) % 256, np.full_like(xx, (i * 41) % 256)],
                      axis=-1).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


class Server:
    """Start with `with Server(images) as s:`; `s.url(path)` names a path on it, by `name` (another
    name of 127.0.0.1, such as localhost, makes it a second host to a client).

    Paths: /img/NAME (the image NAME, percent-decoded), /redirect/NAME (302 to it), /to/QUOTED (302
    to the percent-decoded bytes of QUOTED, sent raw: any Location, a UTF-8 one included),
    /gzip/NAME (the image gzip-encoded, longer than the image; Content-Length the encoded length),
    /notgzip/NAME (the image as it is, said to be gzip), /encoded/NAME (the image, said to be in an
    encoding nobody knows), /status/CODE (that status, with a reason phrase of the server's own
    words), /nothttp (an answer that is not HTTP), /once503/NAME and /once429/NAME (503 or 429 with
    Retry-After: 1 the first time, then the image), /missing (404), /page (an HTML page), /loop (302
    to itself), /tofile (302 to a file: URL), /large (a body far over any limit), /drip (one byte
    every 0.3 s), /reset (the connection reset before any answer), /truncated (Content-Length 20000,
    100 bytes sent, then closed), /resetmid (10000 of 20000 bytes, then a reset), /huge
    (Content-Length 4 GiB, 100 bytes sent), /dripheaders (the status line and
    headers one byte every 0.2 s, for a minute), /continue (`100 Continue` every 0.2 s, for a
    minute). `delay` slows every /img answer; with `gate`, each /img answer waits until `gate`
    requests have been in flight at once (or GATE_S pass), so a client's concurrency shows in
    `max_in_flight` whatever the timing.

    Opt-outs (each the image NAME, its body held back after the headers until the client closes the
    connection or HOLD_S pass, so `body_sent[path]` counts the body bytes a client made it send):
    /noai/NAME (X-Robots-Tag: noai), /ours/NAME (X-Robots-Tag: imagerecords: noimageai), /theirs/NAME
    (X-Robots-Tag: otherbot: noai, for another crawler), /lines/NAME (two X-Robots-Tag lines, the second
    `nofollow, noimageindex`), /tdm/NAME (tdm-reservation: 1), /held/NAME (no opt-out header; what
    robots.txt rules name: /held/private/NAME, /held/otheragent/NAME). /robots.txt serves `robots`
    (text) when given, else `robots_status` (0: no answer, until the client hangs up); its requests
    are counted apart, in `robots_headers`.
    """

    HOLD_S = 0.2
    GATE_S = 2.0
    _OPT_OUT_HEADERS = {"noai": [("X-Robots-Tag", "noai")], "ours": [("X-Robots-Tag", "imagerecords: noimageai")],
                        "theirs": [("X-Robots-Tag", "otherbot: noai")],
                        "lines": [("X-Robots-Tag", "otherbot: noindex"), ("X-Robots-Tag", "nofollow, noimageindex")],
                        "tdm": [("tdm-reservation", "1")], "held": []}

    def __init__(self, images: Mapping[str, bytes], delay: float = 0.0, name: str = "127.0.0.1",
                 robots: Optional[str] = None, robots_status: int = 404, gate: int = 0):
        self.images = dict(images)
        self.delay = delay
        self.gate = gate
        self.name = name
        self.robots = robots
        self.robots_status = robots_status
        self.body_sent: Dict[str, int] = collections.Counter()
        self.robots_headers: List[Dict[str, str]] = []  # one per /robots.txt request (not in `requests`)
        self.lock = threading.Lock()
        self._more_in_flight = threading.Condition(self.lock)
        self.requests: Dict[str, int] = collections.Counter()
        self.headers: List[Dict[str, str]] = []
        self.headers_of: Dict[str, List[Dict[str, str]]] = collections.defaultdict(list)  # by request path
        self.in_flight = self.max_in_flight = 0
        self.busy_s = 0.0  # seconds with a request in flight (ended: counted when in_flight drops to 0)
        self._busy_since = 0.0
        # Connections open at once among those that carried a download: a robots.txt read is closed by
        # the client at once, and its end reaches this count a moment later (it would read as one too many).
        self.open = self.max_open = 0
        self.large_sent = 0
        self.hung_up: Dict[str, float] = {}  # seconds from a /dripheaders or /continue request to the client's hang-up
        self._served_once: set = set()
        self._connections: set = set()
        self._server: Optional[http.server.ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str, name: Optional[str] = None) -> str:
        return f"http://{name or self.name}:{self.port}{path}"

    def __enter__(self) -> "Server":
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: the client's pools reuse connections
            disable_nagle_algorithm = True  # headers and body in two writes: no delayed-ACK stall

            def setup(self):
                super().setup()
                self.downloading = False  # in `open` from its first request that is not a robots.txt read
                with owner.lock:
                    owner._connections.add(self.connection)

            def finish(self):
                try:
                    super().finish()
                finally:
                    with owner.lock:
                        owner._connections.discard(self.connection)
                        owner.open -= self.downloading

            def log_message(self, *args):
                pass

            def do_GET(self):
                with owner.lock:
                    if not owner.in_flight:
                        owner._busy_since = time.monotonic()
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                    owner._more_in_flight.notify_all()
                    if self.path == "/robots.txt":  # counted apart: the other counts are the downloads'
                        owner.robots_headers.append(dict(self.headers.items()))
                    else:
                        if not self.downloading:
                            self.downloading = True
                            owner.open += 1
                            owner.max_open = max(owner.max_open, owner.open)
                        owner.requests[self.path] += 1
                        owner.headers.append(dict(self.headers.items()))
                        owner.headers_of[self.path].append(dict(self.headers.items()))
                self.counted = True
                try:
                    owner._answer(self)
                finally:
                    owner._leave(self)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-http", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
        with self.lock:  # keep-alive connections a client left open: their threads end with them
            for connection in list(self._connections):
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def _leave(self, h) -> None:
        """Ends a request's count in `in_flight`, once. _send calls it before the first byte of the
        answer: a client may release its slot as soon as it has the answer, and a request of
        another process could then arrive before this thread got back to count down."""
        if getattr(h, "counted", False):
            h.counted = False
            with self.lock:
                self.in_flight -= 1
                if not self.in_flight:
                    self.busy_s += time.monotonic() - self._busy_since

    def _send(self, h, status: int, body: bytes = b"", kind: str = "image/jpeg", extra: Mapping[str, str] = {}):
        self._leave(h)
        h.send_response(status)
        h.send_header("Content-Type", kind)
        h.send_header("Content-Length", str(len(body)))
        for k, v in extra.items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body)

    def _first_time(self, path: str) -> bool:
        with self.lock:
            if path in self._served_once:
                return False
            self._served_once.add(path)
            return True

    def _held(self, h, path: str, body: bytes, headers) -> None:
        """Headers, then the body only if the client still waits for it after HOLD_S (it closes the
        connection when it refuses the URL): body_sent[path] counts what went out."""
        self._leave(h)
        h.send_response(200)
        h.send_header("Content-Type", "image/jpeg")
        h.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            h.send_header(k, v)
        h.end_headers()
        h.wfile.flush()
        ready, _, _ = select.select([h.connection], [], [], self.HOLD_S)
        if ready:
            try:
                if h.connection.recv(1, socket.MSG_PEEK) == b"":
                    h.close_connection = True
                    return  # closed: the client read no body
            except OSError:
                h.close_connection = True
                return
        h.wfile.write(body)
        with self.lock:
            self.body_sent[path] += len(body)

    def _answer(self, h) -> None:
        path = h.path
        name = urllib.parse.unquote(path.rsplit("/", 1)[-1])
        kind = path.split("/")[1] if path.count("/") >= 2 else ""
        if path == "/robots.txt":
            if self.robots_status == 0:  # no answer at all: wait until the client gives up (or 30 s)
                self._leave(h)
                select.select([h.connection], [], [], 30)
                h.close_connection = True
            elif self.robots is not None:
                self._send(h, 200, self.robots.encode("utf-8"), "text/plain")
            else:
                self._send(h, self.robots_status, b"no robots here", "text/plain")
        elif kind in self._OPT_OUT_HEADERS and name in self.images:
            self._held(h, path, self.images[name], self._OPT_OUT_HEADERS[kind])
        elif path.startswith("/img/") and name in self.images:
            if self.gate:
                with self._more_in_flight:
                    self._more_in_flight.wait_for(lambda: self.max_in_flight >= self.gate, self.GATE_S)
            if self.delay:
                time.sleep(self.delay)
            self._send(h, 200, self.images[name])
        elif path.startswith("/redirect/"):
            self._send(h, 302, b"", "text/plain", {"Location": f"/img/{name}"})
        elif path.startswith(("/once503/", "/once429/")) and name in self.images:
            status = 503 if path.startswith("/once503/") else 429
            if self._first_time(path):
                self._send(h, status, b"busy", "text/plain", {"Retry-After": "1"})
            else:
                self._send(h, 200, self.images[name])
        elif path.startswith("/to/"):
            # latin-1 turns the bytes back into themselves on the wire (http.server encodes headers so)
            target = urllib.parse.unquote_to_bytes(path[len("/to/"):]).decode("latin-1")
            self._send(h, 302, b"", "text/plain", {"Location": target})
        elif path.startswith("/gzip/") and name in self.images:
            # level 0 (stored blocks): the body on the wire is longer than the image it decodes to
            self._send(h, 200, gzip.compress(self.images[name], compresslevel=0), "image/jpeg",
                       {"Content-Encoding": "gzip"})
        elif path.startswith("/notgzip/") and name in self.images:
            self._send(h, 200, self.images[name], "image/jpeg", {"Content-Encoding": "gzip"})
        elif path.startswith("/encoded/") and name in self.images:
            self._send(h, 200, self.images[name], "image/jpeg", {"Content-Encoding": f"x-{SERVER_WORDS}"})
        elif path.startswith("/status/"):
            self._leave(h)
            h.send_response(int(name), f"{SERVER_WORDS} phrase")
            h.send_header("Content-Type", f"text/{SERVER_WORDS}")
            h.send_header("Content-Length", "0")
            h.end_headers()
        elif path == "/nothttp":
            h.wfile.write(f"HELLO {SERVER_WORDS}\r\n\r\n".encode())
            h.close_connection = True
        elif path == "/page":
            self._send(h, 200, b"<html><body>not a picture</body></html>", "text/html; charset=utf-8")
        elif path == "/loop":
            self._send(h, 302, b"", "text/plain", {"Location": "/loop"})
        elif path == "/tofile":
            self._send(h, 302, b"", "text/plain", {"Location": "file:///etc/passwd"})
        elif path == "/large":
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")  # no Content-Length: the client must count
            h.send_header("Connection", "close")
            h.end_headers()
            block = b"\xff" * 65536
            try:
                while self.large_sent < LARGE_BYTES:
                    h.wfile.write(block)
                    with self.lock:
                        self.large_sent += len(block)
            except OSError:
                pass  # the client stopped reading
            h.close_connection = True
        elif path == "/drip":
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", "1000")
            h.end_headers()
            try:
                for _ in range(1000):
                    h.wfile.write(b"\xff")
                    h.wfile.flush()
                    time.sleep(0.3)
            except OSError:
                pass
            h.close_connection = True
        elif path in ("/dripheaders", "/continue"):
            self._leave(h)
            if path == "/continue":
                pieces = [b"HTTP/1.1 100 Continue\r\n\r\n"] * 300
            else:
                head = b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nX-Padding: " + b"x" * 400 + b"\r\n\r\n"
                pieces = [head[i:i + 1] for i in range(len(head))][:300]
            started = time.monotonic()
            try:
                for piece in pieces:
                    h.wfile.write(piece)
                    h.wfile.flush()
                    time.sleep(0.2)  # the misbehaviour itself: a byte (or an interim answer) at this pace
            except OSError:
                pass  # the client hung up: seen at the second write after it (at most 0.4 s late)
            with self.lock:
                self.hung_up[path] = time.monotonic() - started
            h.close_connection = True
        elif path == "/reset":
            # SO_LINGER 0: close() sends RST, the client sees "connection reset" and no answer
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
        elif path == "/huge":  # declares 4 GiB, sends 100 bytes
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", str(4 << 30))
            h.end_headers()
            h.wfile.write(b"\xff\xd8" + b"\x00" * 98)
            h.close_connection = True
        elif path == "/resetmid":  # half the body, then RST (SO_LINGER 0)
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", "20000")
            h.end_headers()
            h.wfile.write(b"\xff\xd8" + b"\x00" * 9998)
            h.wfile.flush()
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
        elif path == "/truncated":
            h.send_response(200)
            h.send_header("Content-Type", "image/jpeg")
            h.send_header("Content-Length", "20000")
            h.end_headers()
            h.wfile.write(b"\xff\xd8" + b"\x00" * 98)
            h.close_connection = True
        else:
            self._send(h, 404, b"no such thing", "text/plain")


class Silent:
    """A listening socket that accepts connections and never answers a byte: every request to it
    hangs. Counts the connections it accepted and when (time.monotonic()). `with Silent() as s:`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.accepted: List[float] = []
        self._held: List[socket.socket] = []
        self._peers: List[tuple] = []  # each accepted connection's client address, in `accepted`'s order
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._thread: Optional[threading.Thread] = None

    def url(self, path: str) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}{path}"

    def __enter__(self) -> "Silent":
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._accept, name="test-silent", daemon=True)
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return  # closed by __exit__
            with self.lock:
                self.accepted.append(time.monotonic())
                self._held.append(conn)
                self._peers.append(peer)

    def settled(self, timeout: float = 10.0) -> List[float]:
        """`accepted` once every connection made so far is counted: a connection of ours, made now,
        is accepted after all of them (the backlog is first in, first out); it is not in the list."""
        with self.lock:
            before = len(self.accepted)
        probe = socket.create_connection(self._sock.getsockname()[:2], timeout=timeout)
        try:
            limit = time.monotonic() + timeout
            while True:
                with self.lock:
                    if probe.getsockname() in self._peers[before:]:
                        i = self._peers.index(probe.getsockname(), before)
                        return self.accepted[:i] + self.accepted[i + 1:]
                assert time.monotonic() < limit, f"the silent server never accepted the probe within {timeout} s"
                time.sleep(0.01)
        finally:
            probe.close()

    def __exit__(self, *exc) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)  # wakes the accept() above
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=10)
        with self.lock:
            for conn in self._held:
                conn.close()


class Dropping:
    """A host that never completes a connection: a listening socket with a backlog of one, filled
    by a connection of its own and never accepted, so the kernel drops every further SYN and a
    client's connect() hangs (as for a host behind a firewall that drops). `with Dropping() as d:`."""

    def __init__(self):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._filler: Optional[socket.socket] = None

    def url(self, path: str) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"http://{host}:{port}{path}"

    def __enter__(self) -> "Dropping":
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(0)
        self._filler = socket.create_connection(self._sock.getsockname()[:2], timeout=5)
        return self

    def __exit__(self, *exc) -> None:
        self._filler.close()
        self._sock.close()
