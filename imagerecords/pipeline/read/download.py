"""Downloads of http(s) inputs, by the shard writer that needs them: polite (per-host and per-worker
limits, backoff with jitter, Retry-After), bounded (timeouts, a deadline per URL, a size limit
enforced while streaming, at most MAX_REDIRECTS redirects and only to http(s)), and honest (every
failure is a Failed naming what happened; its row's stage is 'download').

One Downloader per worker process (a pool of keep-alive connections per host); it is made where
the shard writer's reader is made (Source.reader), never in the launcher. The per-host limit holds
across the local engine's worker processes (HostSlots, made by the launcher before it forks them);
on a Beam runner each Downloader gets its share of it (politeness.share: `per_host` and `duty`).
"""

from __future__ import annotations

import dataclasses
import errno
import http
import multiprocessing
import random
import re
import socket
import threading
import time
import urllib.parse
import zlib
from typing import Callable, Dict, Mapping, Optional, Tuple

from imagerecords import __version__
from imagerecords.pipeline import processes, storage
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline import urls
from imagerecords.pipeline.read import deadlines, optouts

MAX_REDIRECTS = 5
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_BASE_S = 0.5  # the first retry's wait; doubled per retry, with jitter
BACKOFF_CAP_S = 30.0
RETRY_AFTER_CAP_S = 60.0  # a Retry-After longer than this (or than the deadline's rest) is cut to it
CHUNK = 64 * 1024
# The most any http_* setting may ask for: a semaphore's count, an urllib3 pool's size (it is
# filled with that many slots up front), a socket timeout. Past these a build would hang or crash.
MAX_CONNECTIONS = 1024
MAX_RETRIES = 100
MAX_SECONDS = 24 * 3600.0
# Served types that are never images: refused before any byte is decoded.
_NOT_IMAGES = ("text/", "application/json", "application/xml", "application/xhtml")
# The served types and redirect schemes a reason names; any other is said in our words (a reason
# never repeats the server's bytes).
_NAMED_TYPES = frozenset({"text/html", "text/plain", "text/xml", "text/css", "text/javascript", "text/csv",
                          "application/json", "application/xml", "application/xhtml+xml"})
_NAMED_SCHEMES = frozenset({"file", "ftp", "data", "javascript", "mailto", "gopher", "ws", "wss", "gs", "s3"})
# The request headers that go to every host; the rest (--http_headers) only to the row's own origin.
_EVERYWHERE = ("user-agent", "accept")


is_url = urls.is_url


def host_of(url: str) -> str:
    """The host a download is limited by (--http_per_host): urls.host_key, so the user names of one
    host and port share its limit. Raises Failed for a URL that does not parse."""
    try:
        return urls.host_key(url)
    except urls.BadUrl as e:
        raise Failed(str(e), "BadUrl") from None


class Failed(OSError):
    """A URL that gave no image bytes; str() is the errors.jsonl reason, `error` its short kind."""

    def __init__(self, reason: str, error: str):
        super().__init__(reason)
        self.reason = reason
        self.error = error

    def __str__(self) -> str:
        return self.reason


class OptedOut(Failed):
    """A URL the site opted out of (optouts.py): not downloaded, not retried; its row's stage is 'opted_out'."""

    def __init__(self, reason: str):
        super().__init__(reason, "OptedOut")


@dataclasses.dataclass(frozen=True)
class HttpSettings:
    """How a worker downloads (BuildConfig's http_* settings, user_agent and the headers file's lines).

    Attributes:
      workers: downloads at once per worker process.
      per_host: requests at once to one host, per Downloader (across the local engine's
        workers where the launcher shares HostSlots).
      duty: the share of its time a Downloader may have a request to one host in flight (below 1.0
        when --http_per_host is divided among more Downloaders than it counts: politeness.share).
      timeout: seconds to connect, and without a byte while reading.
      deadline: seconds one URL may take in all, its retries and redirects included, waiting for a
        slot not (deadlines.py says what it covers).
      retries: further tries after a broken connection, a timeout or a status in RETRY_STATUSES.
      user_agent: the User-Agent header ('' for default_user_agent()).
      optouts: which opt-outs refuse a URL before its body is read (optouts.OptOutSettings).
      headers_file: the --http_headers file: its path travels (a token must not sit in the pickled
        Beam graph a runner stores), and each worker process reads it when it makes its Downloader.
    """

    workers: int = 16
    per_host: int = 4
    timeout: float = 30.0
    deadline: float = 120.0
    retries: int = 4
    user_agent: str = ""
    headers_file: Optional[str] = None
    duty: float = 1.0
    optouts: optouts.OptOutSettings = optouts.OptOutSettings()

    def __repr__(self) -> str:  # the headers file's name is not written or logged either
        return (f"HttpSettings(workers={self.workers}, per_host={self.per_host}, duty={self.duty:g}, "
                f"timeout={self.timeout}, "
                f"deadline={self.deadline}, retries={self.retries}, headers_file={'given' if self.headers_file else None})")


# Limits of a --http_headers file: a few headers (a token, a team name), never a dump of a browser's.
MAX_HEADERS_BYTES = 64 * 1024
MAX_HEADERS_LINES = 100
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")  # a header name (RFC 9110 token)


def value_problem(value: str) -> Optional[str]:
    """Why `value` cannot be sent in a request header (without echoing it), or None when it can:
    a control character (CR and LF would start a header of their own), a BOM, or a character
    outside Latin-1 (what HTTP/1.1 sends)."""
    for c in value:
        if c == "\ufeff":
            return "holds a byte order mark (U+FEFF)"
        if (c < " " and c != "\t") or "\x7f" <= c <= "\x9f":
            return f"holds a control character (U+{ord(c):04X}); header values are one line of text"
        if ord(c) > 0xFF:
            return f"holds a character outside Latin-1 (U+{ord(c):04X}), which a header cannot carry"
    return None


def default_user_agent() -> str:
    """The User-Agent when --http_user_agent is not given: the tool, its version, and where a site
    owner reads what it obeys (robots.txt token AGENT); docs/building.md, "Opt-outs"."""
    return f"{optouts.AGENT}/{__version__} (+{ABOUT}; robots.txt token: {optouts.AGENT})"


# Where a site owner learns what the default User-Agent is and how to opt out (named in it).
ABOUT = "imagerecords image dataset builder; opt-outs: docs/building.md#opt-outs"


def check_user_agent(value: str) -> None:
    """Raises ValueError naming --http_user_agent (never its value) when it cannot be sent."""
    problem = value_problem(value)
    if problem is not None:
        raise ValueError(f"{setting('http_user_agent')} {problem}")


def read_headers(path: str) -> Tuple[Tuple[str, str], ...]:
    """The request headers of a --http_headers file (a local path or a FileSystems URI): one
    `Name: value` per line, # comments and blank lines ignored, a CRLF line end allowed. Raises
    OSError when it cannot be read, ValueError naming the file and line (never a value) when a
    header could not be sent as given: see value_problem, MAX_HEADERS_*, a name given twice."""
    named = setting("http_headers", path)
    with storage.open_read(path) as f:
        data = f.read(MAX_HEADERS_BYTES + 1)
    if len(data) > MAX_HEADERS_BYTES:
        raise ValueError(f"{named}: over {MAX_HEADERS_BYTES // 1024} KiB; a headers file holds a few headers")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{named}: not UTF-8 text (byte {e.start})") from None
    lines = text.split("\n")
    if len(lines) - (lines[-1] == "") > MAX_HEADERS_LINES:
        raise ValueError(f"{named}: over {MAX_HEADERS_LINES} lines; a headers file holds a few headers")
    out, seen = [], {}
    for number, line in enumerate(lines, 1):
        line = line[:-1] if line.endswith("\r") else line
        problem = value_problem(line)
        if problem is not None:
            raise ValueError(f"{named}: line {number} {problem}")
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, value = text.partition(":")
        name = name.strip()
        if not sep or not _TOKEN.fullmatch(name):
            raise ValueError(f"{named}: line {number} is not 'Name: value'")
        if name.lower() in seen:
            raise ValueError(f"{named}: line {number} names {name} again (line {seen[name.lower()]}); give each "
                             "header once")
        seen[name.lower()] = number
        out.append((name, value.strip()))
    return tuple(out)


class HeadersUnreadable(RuntimeError):
    """The headers file cannot be read where a worker runs: the build fails (not an OSError, which
    would turn every URL into a rejected row)."""


def _worker_headers(path: str) -> Tuple[Tuple[str, str], ...]:
    try:
        return read_headers(path)
    except OSError as e:
        raise HeadersUnreadable(f"{setting('http_headers', path)}: a worker cannot read it ({storage.os_reason(e)}); "
                                "on a cluster, give a path every worker reads (such as gs://...)") from None
    except ValueError as e:  # changed since the launcher checked it
        raise HeadersUnreadable(str(e)) from None


class HostSlots:
    """The per-host limit shared by every process forked after it is made: SLOTS process-shared
    semaphores of `per_host` each, a host taking the one its host_of key (host:port) hashes to.
    Two hosts on one slot share one limit (stricter, never looser); with 256 slots that is rare
    among the hosts a build downloads from at once (--http_workers per worker)."""

    SLOTS = 256

    def __init__(self, per_host: int):
        # The local engine's own start method (fork on Linux): a forked worker inherits the
        # semaphores, and a fork context unlinks them at once (no resource tracker process).
        ctx = processes.worker_context()
        self.per_host = per_host
        self._slots = [ctx.BoundedSemaphore(per_host) for _ in range(self.SLOTS)]

    def of(self, host: str):
        return self._slots[zlib.crc32(host.encode("utf-8")) % self.SLOTS]

    def __reduce__(self):
        # Semaphores pass only to a process being started; pickled anywhere else (a task's
        # arguments, a Beam closure) the share is left behind and each process limits itself.
        if multiprocessing.context.get_spawning_popen() is None:
            return _unshared, ()
        return _shared_slots, (self.per_host, self._slots)


class _Paced:
    """One request at once to a host, in flight at most `duty` of the time: a request of d seconds
    is followed by d * (1 / duty - 1) seconds without one. The first waits a random part of a
    FIRST_S request's pause, so that a job's Downloaders do not all start together."""

    FIRST_S = 0.2  # a typical download's seconds: the pause guessed before one is measured

    def __init__(self, duty: float):
        self._slot = threading.Lock()
        self._duty = duty
        self._next = time.monotonic() + random.uniform(0.0, self.FIRST_S * (1.0 / duty - 1.0))
        self._started = 0.0

    def __enter__(self) -> None:
        self._slot.acquire()
        time.sleep(max(0.0, self._next - time.monotonic()))
        self._started = time.monotonic()

    def __exit__(self, *exc) -> None:
        now = time.monotonic()
        self._next = now + (now - self._started) * (1.0 / self._duty - 1.0)
        self._slot.release()


def _unshared() -> None:
    return None


def _shared_slots(per_host: int, slots: list) -> HostSlots:
    shared = HostSlots.__new__(HostSlots)
    shared.per_host, shared._slots = per_host, slots
    return shared


class Downloader:
    """Fetches URLs whole for one worker process; thread-safe (the shard writer's image threads share it)."""

    def __init__(self, settings: HttpSettings, max_bytes: Optional[int], shared: Optional[HostSlots] = None,
                 cancelled: Optional[Callable[[], bool]] = None):
        # urllib3: 47 ms to import; only a build with URL inputs downloads
        import urllib3

        self._settings = settings
        self._max_bytes = max_bytes
        headers = {"User-Agent": settings.user_agent or default_user_agent(), "Accept": "image/*,*/*;q=0.5"}
        headers.update(_worker_headers(settings.headers_file) if settings.headers_file else ())
        self._headers = headers
        self._plain_headers = {k: v for k, v in headers.items() if k.lower() in _EVERYWHERE}
        self._pool = urllib3.PoolManager(num_pools=64, maxsize=settings.per_host, block=False,
                                         retries=False, headers=headers)
        self._pool.pool_classes_by_scheme = deadlines.pool_classes()  # sockets the watchdog can cut
        self._watchdog = deadlines.Watchdog(cancelled)
        self._workers = threading.BoundedSemaphore(settings.workers)
        self._hosts: Dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()
        self._shared = shared if shared is not None and shared.per_host == settings.per_host else None
        # Each origin's robots.txt, read once per worker process for the build: {origin: _RobotsEntry}.
        self._robots: Dict[str, "_RobotsEntry"] = {}

    def _host(self, url: str):
        host = host_of(url)
        if self._shared is not None:
            return self._shared.of(host)
        with self._lock:
            if host not in self._hosts:
                per_host, duty = self._settings.per_host, self._settings.duty
                self._hosts[host] = threading.BoundedSemaphore(per_host) if duty >= 1.0 else _Paced(duty)
            return self._hosts[host]

    def __call__(self, url: str) -> bytes:
        return self.fetch(url)

    def stop(self) -> None:
        """The build is stopping: requests in flight are cut, and fetch raises deadlines.Cancelled from now on."""
        self._watchdog.stop()

    def fetch(self, url: str) -> bytes:
        """The body `url` serves, following redirects and retrying as the settings say; raises Failed
        (OptedOut for a URL a site opted out of)."""
        clock = deadlines.Clock(self._settings.deadline)
        with clock.waiting(self._workers):
            return self._retrying(lambda: self._follow(url, clock), clock)

    def _retrying(self, attempt, clock: deadlines.Clock):
        """attempt() again after each _Retry, with backoff (or Retry-After) while the tries and the
        clock last; the last _Retry becomes a Failed."""
        s = self._settings
        tries = 0
        while True:
            tries += 1
            try:
                return attempt()
            except _Retry as e:
                if tries > s.retries:
                    raise Failed(f"{e.reason} (after {tries} tries)", e.error) from None
                wait = e.after if e.after is not None else min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** (tries - 1))
                wait = min(wait, RETRY_AFTER_CAP_S) * (1 if e.after is not None else random.uniform(0.5, 1.5))
                if time.monotonic() + wait >= clock.end:
                    raise Failed(f"{e.reason}; no time left in the {s.deadline:g} s deadline to try again "
                                 f"(after {tries} tries)", e.error) from None
                self._watchdog.sleep(wait)

    def _follow(self, url: str, clock: deadlines.Clock) -> bytes:
        try:
            urls.parse(url)  # the first touch of a row's URL: one that cannot be requested is its row's reason
        except urls.BadUrl as e:
            raise Failed(str(e), "BadUrl") from None
        row, trusted = url, True  # --http_headers go to the row's origin only; once a chain leaves it, never again
        for _ in range(MAX_REDIRECTS + 1):
            self._check_robots(url)  # every hop, before it is requested: a redirect may lead into a disallowed path
            status, location, body = self._get(url, clock, self._headers if trusted else self._plain_headers)
            if location is None:
                return body
            url = _redirect_target(status, url, location)
            trusted = trusted and _same_origin(row, url)
        raise Failed(f"too many redirects (more than {MAX_REDIRECTS})", "TooManyRedirects")

    def _check_headers(self, headers) -> None:
        """Raises OptedOut when a response's X-Robots-Tag or tdm-reservation headers refuse its URL."""
        said = optouts.header_refusal(headers.getlist("X-Robots-Tag"), headers.getlist("tdm-reservation"),
                                      self._settings.optouts)
        if said is not None:
            raise OptedOut(said)

    def _check_robots(self, url: str) -> None:
        """Raises OptedOut when the robots.txt of url's origin disallows it for our token (read on the
        origin's first URL in this process, by one thread while the others of that origin wait)."""
        if not self._settings.optouts.obey_robots:
            return
        try:
            key = _origin_text(url)
        except urls.BadUrl as e:
            raise Failed(str(e), "BadUrl") from None
        with self._lock:
            entry = self._robots.setdefault(key, _RobotsEntry())
        with entry.lock:
            if entry.robots is None and entry.failed is None:
                try:
                    entry.robots = self._load_robots(key)
                except Failed as e:  # no connection: every URL of the origin fails as this one does
                    entry.failed = e
        if entry.failed is not None:
            raise Failed(entry.failed.reason, entry.failed.error)
        said = entry.robots.refusal(url)
        if said is not None:
            raise OptedOut(said)

    def _load_robots(self, origin: str) -> optouts.Robots:
        """The origin's robots.txt (RFC 9309), with the retries and a deadline of its own: 2xx is parsed
        (its first ROBOTS_MAX_BYTES); a 4xx (429 aside) or a redirect that cannot be followed allows
        everything; 5xx, 429, and a server that connected but timed out or broke off disallow
        everything for this build. Raises Failed when no connection could be made (a refused port, a
        name that does not resolve, a connect timeout): the origin's URLs fail as downloads, as they
        would have, and count against --max_download_failures (a dead host is not an opt-out)."""
        clock = deadlines.Clock(self._settings.deadline)
        answered: list = []  # set once a connection was made: failures after it are the site's
        try:
            return self._retrying(lambda: self._robots_once(origin, clock, answered), clock)
        except Failed as e:
            if not answered:
                raise
            return optouts.unavailable(origin, e.reason)

    def _robots_once(self, origin: str, clock: deadlines.Clock, answered: list) -> optouts.Robots:
        # urllib3: URL inputs only (as in Downloader.__init__)
        import urllib3
        from urllib3.exceptions import ConnectTimeoutError, HTTPError, NewConnectionError, ProtocolError, TimeoutError

        def cut_off(got: Optional[int]) -> Failed:  # the server connected but did not finish in time
            answered.append(True)
            return Failed(f"cut off: it took longer than the {self._settings.deadline:g} s deadline", "Deadline")

        url = origin + "/robots.txt"
        headers = {**self._plain_headers, "Accept": "text/plain,*/*;q=0.5"}
        for _ in range(MAX_REDIRECTS + 1):
            left = clock.left()
            if left <= 0:
                raise cut_off(None)
            timeout = urllib3.Timeout(connect=min(self._settings.timeout, left), read=min(self._settings.timeout, left))
            with clock.waiting(self._host(url)), self._watchdog.watching(clock.end, cut_off):
                try:
                    response = self._pool.request("GET", url, preload_content=False, redirect=False,
                                                  timeout=timeout, headers=headers)
                except NewConnectionError as e:  # before ConnectTimeoutError: urllib3 makes it a subclass of that
                    raise _connect_failure(e)
                except ConnectTimeoutError as e:
                    raise _Retry(f"timed out connecting ({type(e).__name__})", "Timeout")
                except TimeoutError as e:
                    answered.append(True)
                    raise _Retry(f"timed out waiting for the answer ({type(e).__name__})", "Timeout")
                except (ProtocolError, HTTPError) as e:
                    answered.append(True)
                    raise _Retry(f"connection failed ({_first_reason(e)})", "ConnectionError")
                answered.append(True)
                try:
                    status = response.status
                    location = response.headers.get("Location")
                    if status in RETRY_STATUSES:
                        raise _Retry(f"HTTP {status} ({_phrase(status)})", "HTTPError",
                                     _retry_after(response.headers.get("Retry-After")))
                    if 200 <= status < 300:
                        body = response.read(optouts.ROBOTS_MAX_BYTES)
                        return optouts.Robots(origin, body.decode("utf-8", "replace"))
                except (TimeoutError, ProtocolError, HTTPError) as e:
                    raise _Retry(f"connection failed while reading ({_first_reason(e)})", "ConnectionError")
                finally:
                    response.close()  # a robots.txt is read once: its connection is not worth keeping
            if not (300 <= status < 400 and location):
                return optouts.Robots(origin)  # 4xx and the rest: no robots.txt, everything allowed
            try:
                url = _redirect_target(status, url, location)
            except Failed:
                return optouts.Robots(origin)
        return optouts.Robots(origin)  # too many redirects: as unavailable, allowed (RFC 9309 2.3.1.2)

    def _get(self, url: str, clock: deadlines.Clock,
             headers: Optional[Mapping[str, str]] = None) -> Tuple[int, Optional[str], bytes]:
        """One request with `headers` (the settings' all by default): (status, redirect location or None, body); the watchdog cuts it at the deadline."""
        # urllib3: URL inputs only (as in Downloader.__init__)
        import urllib3
        from urllib3.exceptions import (DecodeError, HTTPError, NewConnectionError, ProtocolError, ReadTimeoutError,
                                        TimeoutError)

        left = clock.left()
        if left <= 0:
            raise Failed(f"cut off: the download took longer than its {self._settings.deadline:g} s deadline",
                         "Deadline")
        timeout = urllib3.Timeout(connect=min(self._settings.timeout, left), read=min(self._settings.timeout, left))
        with clock.waiting(self._host(url)), self._watchdog.watching(clock.end, self._cut_off) as call:
            end = clock.end
            try:
                response = self._pool.request("GET", url, preload_content=False, redirect=False, timeout=timeout,
                                              headers=dict(headers if headers is not None else self._headers))
            except ValueError:  # urllib3's LocationParseError, http.client's InvalidURL, a host IDNA refuses
                raise Failed("the URL cannot be requested: its host or path is not valid in a request", "BadUrl")
            except NewConnectionError as e:  # before TimeoutError: urllib3 makes it a subclass of that
                raise _connect_failure(e)
            except TimeoutError as e:
                raise _Retry(f"timed out connecting or waiting for the response ({type(e).__name__})", "Timeout")
            except ProtocolError as e:
                raise _protocol_failure(e, 0, None)
            except HTTPError as e:
                raise _Retry(f"connection failed ({_first_reason(e)})", "ConnectionError")
            call.got = 0
            try:
                status = response.status
                if 200 <= status < 400:  # an answer or a redirect: its opt-out headers, before any body byte
                    self._check_headers(response.headers)
                if 300 <= status < 400 and status != 304 and response.headers.get("Location"):
                    return status, response.headers["Location"], b""
                if status in RETRY_STATUSES:
                    raise _Retry(f"HTTP {status} ({_phrase(status)})", "HTTPError",
                                 _retry_after(response.headers.get("Retry-After")))
                if not 200 <= status < 300:
                    raise Failed(f"HTTP {status} ({_phrase(status)})", "HTTPError")
                kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
                if kind.startswith(_NOT_IMAGES):
                    family = next(p for p in _NOT_IMAGES if kind.startswith(p))
                    said = kind if kind in _NAMED_TYPES else f"a type under {family}"
                    raise Failed(f"not an image: the server sent {said}", "NotAnImage")
                decoded = ("identity", *type(response).CONTENT_DECODERS)  # gzip, deflate (br, zstd if installed)
                coding = (response.headers.get("Content-Encoding") or "").lower()
                if any(c.strip() not in decoded for c in coding.split(",") if c.strip()):  # else passed on raw
                    raise Failed("the body is in a Content-Encoding this client does not decode (it decodes "
                                 f"{', '.join(decoded[1:])})", "BadEncoding")
                declared = response.headers.get("Content-Length")
                limit = self._max_bytes
                if limit is not None and declared is not None and declared.isdigit() and int(declared) > limit:
                    raise Failed(f"too large: the server declares {int(declared):,} bytes, over the "
                                 f"{limit:,}-byte limit (--max_file_mb); nothing was read", "TooLarge")
                parts, got = [], 0
                while True:
                    if time.monotonic() > end:
                        raise Failed(f"cut off after {got:,} bytes: the download took longer than its "
                                     f"{self._settings.deadline:g} s deadline", "Deadline")
                    try:
                        chunk = response.read1(CHUNK)
                    except ReadTimeoutError:
                        raise _Retry(f"timed out: no byte for {self._settings.timeout:g} s", "Timeout") from None
                    except ProtocolError as e:
                        raise _protocol_failure(e, response.tell(), declared) from None
                    except DecodeError:  # the same bytes would come again: not retried
                        raise Failed("the body does not decode as its Content-Encoding says", "BadEncoding") from None
                    except HTTPError as e:
                        raise _Retry(f"connection failed while reading ({_first_reason(e)})", "ConnectionError")
                    if not chunk:
                        break
                    got += len(chunk)
                    call.got = got
                    if limit is not None and got > limit:
                        raise Failed(f"too large: over the {limit:,}-byte limit (--max_file_mb); the download "
                                     "was stopped there", "TooLarge")
                    parts.append(chunk)
                wire = response.tell()  # Content-Length counts the bytes sent, before any Content-Encoding
                if declared is not None and declared.isdigit() and wire < int(declared):
                    raise _Retry(f"truncated: the connection ended after {wire:,} of {int(declared):,} bytes",
                                 "Truncated")
                response.release_conn()
                return status, None, b"".join(parts)
            except BaseException:
                response.close()  # a body not read to its end: the connection cannot serve another request
                raise

    def _cut_off(self, got: Optional[int]) -> Failed:
        """The row of a request the watchdog cut at the deadline, `got` body bytes in (None: before the headers)."""
        where = "before the response's headers were in" if got is None else f"after {got:,} bytes"
        return Failed(f"cut off {where}: the download took longer than its {self._settings.deadline:g} s deadline",
                      "Deadline")


class _RobotsEntry:
    """One origin's robots.txt in a Downloader: loaded once, under its own lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.robots: Optional[optouts.Robots] = None
        self.failed: Optional[Failed] = None


def _origin_text(url: str) -> str:
    """'scheme://host:port' of a URL: what one robots.txt covers."""
    o = urls.origin(url)
    return f"{o.scheme}://{urls.host_key(url)}"


class _Retry(Exception):
    def __init__(self, reason: str, error: str, after: Optional[float] = None):
        super().__init__(reason)
        self.reason = reason
        self.error = error
        self.after = after


def _retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds a Retry-After header asks for (a number or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    import email.utils  # email: 8.6 ms to import; a folder build never reads a header (urllib3 has it loaded)

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "unknown status"


def _first_reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or e
    text = str(reason).strip()
    # urllib3 puts the connection object's repr first: keep what follows it.
    return (text.split(">: ", 1)[-1] if ">: " in text else text).splitlines()[0][:200] or type(e).__name__


def _protocol_failure(e: BaseException, got: int, declared: Optional[str]) -> Exception:
    """What a broken connection says, in our words (never the server's bytes), and whether to try again:
    `got` bytes came over the wire of `declared`."""
    import http.client  # http.client: 17.6 ms (with ssl); a folder build never downloads (urllib3 has it loaded)

    cause = _cause(e, (http.client.HTTPException, OSError))
    if isinstance(cause, http.client.IncompleteRead) or (cause is None and "IncompleteRead" in str(e)):
        total = f" of {int(declared):,}" if declared is not None and declared.isdigit() else ""
        return _Retry(f"truncated: the connection ended after {got:,}{total} bytes", "ConnectionError")
    if isinstance(cause, http.client.RemoteDisconnected):  # before its base classes, reset and BadStatusLine
        return _Retry("connection closed by the server before an answer", "ConnectionError")
    if isinstance(cause, ConnectionResetError):
        return _Retry("connection reset by the server", "ConnectionError")
    if isinstance(cause, http.client.LineTooLong):  # it would say the same next time
        return Failed("the server's answer has a line longer than HTTP clients accept", "BadResponse")
    if isinstance(cause, http.client.HTTPException):  # BadStatusLine and kin: it does not speak HTTP
        return Failed("the server's answer is not valid HTTP", "BadResponse")
    if isinstance(cause, OSError) and cause.errno:
        return _Retry(f"connection broken ({errno.errorcode.get(cause.errno, cause.errno)})", "ConnectionError")
    return _Retry(f"connection broken ({type(cause or e).__name__})", "ConnectionError")


def _connect_failure(e: BaseException) -> Exception:
    """Why no connection was made, in our words. A refused port or a name the DNS says does not exist
    is not retried: nothing listens there, and a few seconds rarely change that (curl and wget do
    not retry them either); a resolver that did not answer is."""
    cause = _cause(e, (socket.gaierror, OSError))
    if isinstance(cause, socket.gaierror):
        if cause.errno in (socket.EAI_AGAIN, getattr(socket, "EAI_SYSTEM", None)):
            return _Retry("the host name does not resolve for now (the resolver did not answer)", "NameNotResolved")
        return Failed("the host name does not resolve", "NameNotResolved")
    if isinstance(cause, ConnectionRefusedError):
        return Failed("connection refused: nothing listens at that host and port", "ConnectionRefused")
    if isinstance(cause, OSError) and cause.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return _Retry("the host cannot be reached (no route to it)", "ConnectionError")
    name = errno.errorcode.get(cause.errno, "") if isinstance(cause, OSError) and cause.errno else ""
    return _Retry(f"connection failed ({name or type(cause or e).__name__})", "ConnectionError")


def _cause(e: BaseException, kinds: Tuple[type, ...]) -> Optional[BaseException]:
    """The first exception of `kinds` in e's chain (its args, __cause__, __context__), or None."""
    seen, todo = set(), [e]
    while todo:
        x = todo.pop(0)
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, kinds):
            return x
        todo.extend(a for a in getattr(x, "args", ()) if isinstance(a, BaseException))
        todo.extend((x.__cause__, x.__context__, getattr(x, "reason", None)))
    return None


def _same_origin(a: str, b: str) -> bool:
    """Whether two parsed URLs share scheme, host and port: another host, port or a step down from https
    to http is another origin (as urllib3's, requests' and curl's own redirects judge it)."""
    return urls.origin(a) == urls.origin(b)


def _redirect_target(status: int, url: str, location: str) -> str:
    """The URL a redirect from `url` leads to; raises Failed (not retried) if it cannot be followed.
    No reason repeats the Location: it is the server's text, and may hold a user:password@."""
    try:
        target = urls.join(url, location)
    except urls.BadUrl as e:
        raise Failed(f"HTTP {status} redirect refused (the Location: {e})", "BadUrl") from None
    scheme = urllib.parse.urlsplit(target).scheme.lower()
    if not is_url(target):
        said = f"a {scheme}: URL" if scheme in _NAMED_SCHEMES else "a URL of another scheme"
        raise Failed(f"HTTP {status} redirect to {said} refused: only http and https are followed", "RefusedScheme")
    try:
        urls.parse(target)
    except urls.BadUrl as e:
        raise Failed(f"HTTP {status} redirect refused (the Location: {e})", "BadUrl") from None
    return target


def reader(settings: HttpSettings, max_bytes: Optional[int], files,
           shared: Optional[HostSlots] = None) -> "UrlReader":
    """A reader of http(s) URLs (downloaded) and of everything else (`files`, the file reader);
    `shared`: the per-host limit the launcher shares with its worker processes."""
    return UrlReader(settings, max_bytes, files, shared)


class UrlReader:
    """read_bytes for a manifest whose rows may be URLs: a URL is downloaded (one Downloader, made on
    first use in this process), any other uri read by `files`. Picklable before its first URL."""

    def __init__(self, settings: HttpSettings, max_bytes: Optional[int], files, shared: Optional[HostSlots] = None):
        self._settings = settings
        self._max_bytes = max_bytes
        self._files = files
        self._shared = shared
        self._downloader: Optional[Downloader] = None
        self._lock = threading.Lock()
        self._stopped = False
        self._cancelled: Optional[Callable[[], bool]] = None

    def __getstate__(self) -> Mapping:
        return {"_settings": self._settings, "_max_bytes": self._max_bytes, "_files": self._files,
                "_shared": self._shared}

    def __setstate__(self, state: Mapping) -> None:
        self.__dict__.update(state)
        self._downloader = None
        self._lock = threading.Lock()
        self._stopped = False
        self._cancelled = None

    def stop_when(self, cancelled: Callable[[], bool]) -> None:
        """Downloads stop (as stop() says) once `cancelled()` is true: checked before each request, and
        polled while any is in flight (a worker process's view of its launcher's cancel)."""
        self._cancelled = cancelled

    def stop(self) -> None:
        """The build is stopping: downloads in flight are cut, and no URL is fetched from now on."""
        with self._lock:
            self._stopped = True
            if self._downloader is not None:
                self._downloader.stop()

    def __call__(self, uri: str) -> bytes:
        if not is_url(uri):
            return self._files(uri)
        if self._downloader is None:
            with self._lock:
                if self._stopped or (self._cancelled is not None and self._cancelled()):
                    raise deadlines.Cancelled("downloads stopped")
                if self._downloader is None:
                    self._downloader = Downloader(self._settings, self._max_bytes, self._shared, self._cancelled)
        return self._downloader.fetch(uri)
