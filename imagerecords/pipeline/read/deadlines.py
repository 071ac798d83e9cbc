"""The clock and the watchdog of a Downloader's requests: what makes --http_deadline bound a URL
whole, and a stopped build stop downloading at once.

urllib3's read timeout restarts at every byte, so a server that drips its status line and headers
(or sends `100 Continue` forever) is never timed out by it. Instead each request registers the
socket it talks on (the connection classes below do it, for the thread making the request) and a
watchdog thread shuts that socket down (shutdown(SHUT_RDWR)) when the URL's deadline passes: the
blocked read returns at once and the Downloader reports the cut. stop() does the same to every
request in flight and refuses new ones, for a build that is being stopped (a signal, Ctrl-C).

A URL's clock (Clock) runs only while the URL holds its slots: waiting for a worker or per-host
slot is not charged to it. What the deadline covers: connecting (DNS aside), sending, the status
line, headers and body of every try and redirect, and the waits between retries.
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from typing import Callable, Iterator, List, Optional, Set


class Cancelled(KeyboardInterrupt):
    """A download refused or cut short because its process's build is stopping: never a row."""


class Clock:
    """One URL's deadline, `seconds` of its own time: the time spent waiting for a slot is added back."""

    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    @contextlib.contextmanager
    def waiting(self, slot) -> Iterator[None]:
        """Holds `slot` (a semaphore) for the block; the wait for it is not charged to the URL."""
        started = time.monotonic()
        with slot:
            self.end += time.monotonic() - started
            yield


class Call:
    """One request in flight: its deadline, its sockets, and whether (and why) it was cut."""

    def __init__(self, watchdog: "Watchdog", end: float):
        self.watchdog = watchdog
        self.end = end
        self.cut: Optional[str] = None  # None, "deadline" or "stopped"
        self.got: Optional[int] = None  # body bytes read; None until the headers are in
        self._socks: List[socket.socket] = []

    def attach(self, sock) -> None:
        """The request talks on `sock` from now on: shut at the deadline, or now if already cut."""
        with self.watchdog._lock:
            if self.cut is None:
                self._socks.append(sock)
                return
        _shut(sock)

    def before_send(self) -> None:
        """Raises Cut where the deadline has passed or the build stopped: no request is sent then."""
        with self.watchdog._lock:
            if self.cut is None and self.watchdog._is_stopped():
                self.cut = "stopped"
            if self.cut is None and time.monotonic() >= self.end:
                self.cut = "deadline"
            if self.cut is not None:
                raise Cut(self.cut)

    def _shut(self, why: str) -> None:  # under the watchdog's lock
        if self.cut is None:
            self.cut = why
        for sock in self._socks:
            _shut(sock)
        self._socks.clear()


class Cut(Exception):
    """Raised by a watched connection asked to send after its request was cut (Call.before_send)."""


def _shut(sock) -> None:
    # socket.socket's own shutdown, also for an SSLSocket: its TLS state is left to the thread reading it.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected: nothing blocks on it


_current = threading.local()  # the Call the thread is making, for the connection classes


# How often `cancelled` is looked at while a request is in flight or a retry waits.
POLL_S = 0.1
# How long the watchdog thread outlives the last request in flight, for the next one; how often
# it looks when no cancel is polled.
LINGER_S = 1.0


class Watchdog:
    """The requests in flight of one Downloader; its thread (started while any is in flight) cuts
    each one whose deadline has passed, and all of them once stop() is called or `cancelled()` is
    true (a worker process's view of its launcher's cancel: looked at before each request, and
    polled while any is in flight, never waited on)."""

    def __init__(self, cancelled: Optional[Callable[[], bool]] = None):
        self._lock = threading.Condition()
        self._calls: Set[Call] = set()
        self._stopped = False
        self._cancelled = cancelled
        self._thread: Optional[threading.Thread] = None
        self._wake = float("inf")  # when the watchdog thread next looks (time.monotonic()), unless notified

    def _is_stopped(self) -> bool:  # under the lock
        if not self._stopped and self._cancelled is not None and self._cancelled():
            self._stop()
        return self._stopped

    def stop(self) -> None:
        """Cuts every request in flight and refuses new ones (Cancelled), for good."""
        with self._lock:
            self._stop()

    def _stop(self) -> None:  # under the lock
        self._stopped = True
        for call in self._calls:
            call._shut("stopped")
        self._lock.notify_all()

    def sleep(self, seconds: float) -> None:
        """Waits `seconds` (a retry's backoff), or raises Cancelled as soon as the watchdog is stopped."""
        end = time.monotonic() + seconds
        with self._lock:
            while not self._is_stopped():
                left = end - time.monotonic()
                if left <= 0:
                    return
                self._lock.wait(min(left, POLL_S) if self._cancelled is not None else left)
            raise Cancelled("downloads stopped")

    @contextlib.contextmanager
    def watching(self, end: float, cut_off: Callable[[Optional[int]], BaseException]) -> Iterator[Call]:
        """The block's request, cut when `end` (time.monotonic()) passes. A cut request's block ends
        in `cut_off(call.got)` whatever it returned or raised (what the server sent by then may be
        partial: headers, a body); in Cancelled if the watchdog was stopped, or is on entry."""
        call = Call(self, end)
        with self._lock:
            if self._is_stopped():
                raise Cancelled("downloads stopped")
            self._calls.add(call)
            if self._thread is None or not self._thread.is_alive():  # not alive: in a child forked since
                self._thread = threading.Thread(target=self._watch, name="imagerecords-deadlines", daemon=True)
                self._thread.start()
            elif end < self._wake:  # else it looks in time anyway: no wake-up per request
                self._lock.notify_all()
        _current.call = call
        try:
            try:
                yield call
            except Exception:
                if call.cut is None:
                    raise
            if call.cut == "stopped":
                raise Cancelled("downloads stopped") from None
            if call.cut is not None:
                raise cut_off(call.got) from None
        finally:
            _current.call = None
            with self._lock:
                self._calls.discard(call)
                call._socks.clear()  # the watchdog thread sees it gone at its next look

    def _watch(self) -> None:
        # It looks every `period` (the cancel's poll, else LINGER_S) or at the earliest deadline, and
        # ends after LINGER_S without a request: one thread, woken per request only for a deadline
        # sooner than its next look (a thread and two wake-ups per request cost a URL build ~8% of its CPU).
        period = POLL_S if self._cancelled is not None else LINGER_S
        with self._lock:
            idle_since = None
            while True:
                now = time.monotonic()
                if self._calls:
                    idle_since = None
                    if not self._is_stopped():
                        for call in self._calls:
                            if call.cut is None and call.end <= now:
                                call._shut("deadline")
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= LINGER_S:
                    break
                self._wake = min([now + period, *(c.end for c in self._calls if c.cut is None)])
                self._lock.wait(self._wake - now)
            self._wake = float("inf")
            self._thread = None  # the next request starts another; an idle Downloader holds no thread


def current() -> Optional[Call]:
    return getattr(_current, "call", None)


def _new_conn(conn, call: Call) -> socket.socket:
    """urllib3's HTTPConnection._new_conn (and util.connection.create_connection), with each socket
    attached to `call` before it connects: a connect that hangs (a host that drops the SYN) is
    woken by a stop too, not only by its timeout. Raises urllib3's errors, as urllib3 does."""
    # urllib3: 47 ms to import; only a build with URL inputs downloads
    from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
    from urllib3.util.connection import _set_socket_options, allowed_gai_family

    host = conn._dns_host.strip("[]")
    try:
        err: Optional[OSError] = None
        for af, socktype, proto, _, address in socket.getaddrinfo(host, conn.port, allowed_gai_family(),
                                                                  socket.SOCK_STREAM):
            sock = socket.socket(af, socktype, proto)
            try:
                _set_socket_options(sock, conn.socket_options)
                sock.settimeout(conn.timeout)
                if conn.source_address:
                    sock.bind(conn.source_address)
                call.attach(sock)
                sock.connect(address)
                break
            except OSError as e:
                err = e
                sock.close()
        else:
            raise err or OSError("getaddrinfo returns an empty list")
    except socket.gaierror as e:
        raise NameResolutionError(conn.host, conn, e) from e
    except socket.timeout as e:
        raise ConnectTimeoutError(conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})") from e
    except OSError as e:
        raise NewConnectionError(conn, f"Failed to establish a new connection: {e}") from e
    sys.audit("http.client.connect", conn, conn.host, conn.port)
    return sock


_POOLS: dict = {}


def pool_classes() -> dict:
    """PoolManager's pool_classes_by_scheme whose connections register their sockets with the
    calling thread's Call (made on first use: urllib3 is imported only by a build that downloads)."""
    if not _POOLS:
        # urllib3: as in _new_conn
        from urllib3 import connection, connectionpool

        def watched(base):
            class Watched(base):
                def _new_conn(self):
                    call = current()
                    return super()._new_conn() if call is None else _new_conn(self, call)

                def request(self, *args, **kwargs):
                    call = current()
                    if call is not None:
                        call.before_send()
                        if self.sock is not None:  # a kept-alive connection: its socket is this request's now
                            call.attach(self.sock)
                    return super().request(*args, **kwargs)

            Watched.__name__ = Watched.__qualname__ = f"Watched{base.__name__}"
            return Watched

        http = type("WatchedHTTPConnectionPool", (connectionpool.HTTPConnectionPool,),
                    {"ConnectionCls": watched(connection.HTTPConnection)})
        https = type("WatchedHTTPSConnectionPool", (connectionpool.HTTPSConnectionPool,),
                     {"ConnectionCls": watched(connection.HTTPSConnection)})
        _POOLS.update(http=http, https=https)
    return dict(_POOLS)
