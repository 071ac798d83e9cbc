"""Downloads of http(s) inputs, by the shard writer that needs them: polite (per-host and per-worker
limits, backoff with jitter, Retry-After), bounded (timeouts, a deadline per URL, a size limit
enforced while streaming, at most MAX_REDIRECTS redirects and only to http(s)), and honest (every
failure is a Failed naming what happened; its row's stage is 'download').

One Downloader per worker process (a pool of keep-alive connections per host); it is made where
the shard writer's reader is made (Source.reader), never in the launcher. The per-host limit holds
across the local engine's worker processes (HostSlots, made by the launcher before it forks them);
on a Beam runner it holds per worker process.
"""

from __future__ import annotations

import dataclasses
import multiprocessing
import random
import threading
import time
import urllib.parse
import zlib
from typing import Callable, Dict, Mapping, Optional, Tuple
from imagerecords.pipeline import processes
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.read import deadlines

MAX_REDIRECTS = 5
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
BACKOFF_BASE_S = 0.5  # the first retry's wait; doubled per retry, with jitter
BACKOFF_CAP_S = 30.0
RETRY_AFTER_CAP_S = 60.0  # a Retry-After longer than this (or than the deadline's rest) is cut to it
CHUNK = 64 * 1024
# Served types that are never images: refused before any byte is decoded.
_NOT_IMAGES = ("text/", "application/json", "application/xml", "application/xhtml")


def is_url(uri: str) -> bool:
    lower = uri[:8].lower()
    return lower.startswith("http://") or lower.startswith("https://")


def host_of(url: str) -> str:
    """The host a download is limited by (--http_per_host): the URL's netloc, lower-cased."""
    return urllib.parse.urlsplit(url).netloc.lower()


class Failed(OSError):
    """A URL that gave no image bytes; str() is the errors.jsonl reason, `error` its short kind."""

    def __init__(self, reason: str, error: str):
        super().__init__(reason)
        self.reason = reason
        self.error = error

    def __str__(self) -> str:
        return self.reason


@dataclasses.dataclass(frozen=True)
class HttpSettings:
    """How a worker downloads (BuildConfig's http_* settings, user_agent and the headers file's lines).

    Attributes:
      workers: downloads at once per worker process.
      per_host: requests at once to one host, per worker process (across the local engine's
        workers where the launcher shares HostSlots).
      timeout: seconds to connect, and without a byte while reading.
      deadline: seconds one URL may take in all, its retries and redirects included, waiting for a
        slot not (deadlines.py says what it covers).
      retries: further tries after a connection error, a timeout, a 5xx or a 429.
      user_agent: the User-Agent header.
      headers: extra request headers (from --http_headers); never logged or written anywhere.
    """

    workers: int = 16
    per_host: int = 4
    timeout: float = 30.0
    deadline: float = 120.0
    retries: int = 4
    user_agent: str = ""
    headers: Tuple[Tuple[str, str], ...] = ()

    def __repr__(self) -> str:  # the headers may hold a token: never in a repr, a log or a message
        return (f"HttpSettings(workers={self.workers}, per_host={self.per_host}, timeout={self.timeout}, "
                f"deadline={self.deadline}, retries={self.retries}, headers={len(self.headers)} hidden)")


def read_headers(path: str) -> Tuple[Tuple[str, str], ...]:
    """The request headers of a --http_headers file: one `Name: value` per line, # comments and blank
    lines ignored. Raises ValueError naming the file and line (never the value)."""
    out = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            name, sep, value = text.partition(":")
            name = name.strip()
            if not sep or not name or any(c in name for c in " \t()<>@,;\\\"/[]?={}"):
                raise ValueError(f"{setting('http_headers', path)}: line {number} is not 'Name: value'")
            out.append((name, value.strip()))
    return tuple(out)


class HostSlots:
    """The per-host limit shared by every process forked after it is made: SLOTS process-shared
    semaphores of `per_host` each, a host taking the one its name hashes to. Two hosts on one slot
    share one limit (stricter, never looser); with 256 slots that is rare among the hosts a build
    downloads from at once (--http_workers per worker)."""

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
        import urllib3

        from imagerecords import __version__

        self._settings = settings
        self._max_bytes = max_bytes
        headers = {"User-Agent": settings.user_agent or f"imagerecords/{__version__}", "Accept": "image/*,*/*;q=0.5"}
        headers.update(dict(settings.headers))
        self._headers = headers
        self._pool = urllib3.PoolManager(num_pools=64, maxsize=settings.per_host, block=False,
                                         retries=False, headers=headers)
        self._pool.pool_classes_by_scheme = deadlines.pool_classes()  # sockets the watchdog can cut
        self._watchdog = deadlines.Watchdog(cancelled)
        self._workers = threading.BoundedSemaphore(settings.workers)
        self._hosts: Dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()
        self._shared = shared if shared is not None and shared.per_host == settings.per_host else None

    def _host(self, url: str):
        host = host_of(url)
        if self._shared is not None:
            return self._shared.of(host)
        with self._lock:
            if host not in self._hosts:
                self._hosts[host] = threading.BoundedSemaphore(self._settings.per_host)
            return self._hosts[host]

    def __call__(self, url: str) -> bytes:
        return self.fetch(url)

    def stop(self) -> None:
        """The build is stopping: requests in flight are cut, and fetch raises deadlines.Cancelled from now on."""
        self._watchdog.stop()

    def fetch(self, url: str) -> bytes:
        """The body `url` serves, following redirects and retrying as the settings say; raises Failed."""
        s = self._settings
        clock = deadlines.Clock(s.deadline)
        with clock.waiting(self._workers):
            tries = 0
            while True:
                tries += 1
                try:
                    return self._follow(url, clock)
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
        for _ in range(MAX_REDIRECTS + 1):
            status, location, body = self._get(url, clock)
            if location is None:
                return body
            target = urllib.parse.urljoin(url, location)
            if not is_url(target):
                scheme = urllib.parse.urlsplit(target).scheme or "schemeless"
                raise Failed(f"HTTP {status} redirect to a {scheme}: URL refused: only http and https are followed",
                             "RefusedScheme")
            url = target
        raise Failed(f"too many redirects (more than {MAX_REDIRECTS})", "TooManyRedirects")

    def _get(self, url: str, clock: deadlines.Clock) -> Tuple[int, Optional[str], bytes]:
        """One request: (status, redirect location or None, body); the watchdog cuts it at the deadline."""
        import urllib3
        from urllib3.exceptions import HTTPError, ProtocolError, ReadTimeoutError, TimeoutError

        left = clock.left()
        if left <= 0:
            raise Failed(f"cut off: the download took longer than its {self._settings.deadline:g} s deadline",
                         "Deadline")
        timeout = urllib3.Timeout(connect=min(self._settings.timeout, left), read=min(self._settings.timeout, left))
        with clock.waiting(self._host(url)), self._watchdog.watching(clock.end, self._cut_off) as call:
            end = clock.end
            try:
                response = self._pool.request("GET", url, preload_content=False, redirect=False, timeout=timeout)
            except TimeoutError as e:
                raise _Retry(f"timed out connecting or waiting for the response ({type(e).__name__})", "Timeout")
            except ProtocolError as e:
                raise _Retry(_protocol_reason(e, 0, None), "ConnectionError")
            except HTTPError as e:
                raise _Retry(f"connection failed ({_first_reason(e)})", "ConnectionError")
            call.got = 0
            try:
                status = response.status
                if 300 <= status < 400 and status != 304 and response.headers.get("Location"):
                    return status, response.headers["Location"], b""
                if status in RETRY_STATUSES:
                    raise _Retry(f"HTTP {status} ({_phrase(status)})", "HTTPError",
                                 _retry_after(response.headers.get("Retry-After")))
                if not 200 <= status < 300:
                    raise Failed(f"HTTP {status} ({_phrase(status)})", "HTTPError")
                kind = (response.headers.get("Content-Type") or "").split(";")[0].strip().lower()
                if kind.startswith(_NOT_IMAGES):
                    raise Failed(f"not an image: the server sent {kind}", "NotAnImage")
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
                        raise _Retry(_protocol_reason(e, got, declared), "ConnectionError") from None
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
                if declared is not None and declared.isdigit() and got < int(declared):
                    raise _Retry(f"truncated: the connection ended after {got:,} of {int(declared):,} bytes",
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
    import email.utils  # here: its import (and socket's) cost every build's start 7 ms

    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _phrase(status: int) -> str:
    import http

    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "unknown status"


def _first_reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or e
    text = str(reason).strip()
    # urllib3 puts the connection object's repr first: keep what follows it.
    return (text.split(">: ", 1)[-1] if ">: " in text else text).splitlines()[0][:200] or type(e).__name__


def _protocol_reason(e: BaseException, got: int, declared: Optional[str]) -> str:
    text = str(e)
    if "IncompleteRead" in text or "incomplete" in text.lower():
        total = f" of {int(declared):,}" if declared is not None and declared.isdigit() else ""
        return f"truncated: the connection ended after {got:,}{total} bytes"
    if "reset" in text.lower():
        return "connection reset by the server"
    if "closed connection without response" in text.lower():
        return "connection closed by the server before an answer"
    return f"connection broken ({_first_reason(e)})"


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
