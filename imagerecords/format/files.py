"""Whole and ranged reads of local files and gs:// objects, without TensorFlow or torch; one client per process."""

from __future__ import annotations

import errno
import os
import stat
import threading
from typing import BinaryIO, Dict, Optional, Tuple

from imagerecords.format.errors import FilesMissing, NotRegularFile, ReadError
from imagerecords.format.paths import has_scheme

_GCS_HINT = "gs:// paths need google-cloud-storage: pip install google-cloud-storage"


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"), (stat.S_ISSOCK, "a socket"))


def _check_regular(path: str, mode: int) -> None:
    if stat.S_ISLNK(mode):
        try:
            kind = f"a symbolic link to {os.readlink(path)}"
        except OSError:
            kind = "a symbolic link"
        raise NotRegularFile(f"{path} is {kind}, not a regular file: a dataset's files are regular files inside its "
                             "folder, so it is refused rather than followed; put the dataset's own file there")
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "not a file")
        raise NotRegularFile(f"{path} is {kind}, not a regular file: a dataset's files are regular files, so it "
                             "is refused rather than read; put the dataset's own file there")


def open_local_fd(path: str) -> int:
    """A descriptor of the local regular file `path`, opened to read; anything else is refused
    before a byte is read (opened non-blocking, so a FIFO without a writer does not hang the open)."""
    try:
        # O_NOFOLLOW: a link in the file's own place is refused (its folders may be links).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)  # no effect on a regular file's reads
    except FileNotFoundError:
        raise FilesMissing(f"{path} does not exist") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            _check_regular(path, os.lstat(path).st_mode)
        raise
    try:
        _check_regular(path, os.fstat(fd).st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_local(path: str, buffering: int = -1) -> BinaryIO:
    """open(path, "rb", buffering) for the local regular file `path` only (open_local_fd)."""
    return os.fdopen(open_local_fd(path), "rb", buffering)


def local_size(path: str) -> int:
    """The size of the local regular file `path`; anything else (a FIFO, whose size is 0; a link)
    is refused."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise FilesMissing(f"{path} does not exist") from None
    _check_regular(path, st.st_mode)
    return st.st_size


class Files:
    """Opens what it reads lazily and per process, so a DataLoader worker (forked or spawned)
    never uses a descriptor or client made in its parent.

    Local files are read with os.pread (no shared seek position, so threads may share one
    descriptor); gs:// objects with ranged GETs through one google-cloud-storage client.
    """

    def __init__(self):
        self._pid: Optional[int] = None
        self._fds: Dict[str, int] = {}
        self._blobs: Dict[str, object] = {}
        self._client = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {}  # descriptors and clients do not cross processes

    def __setstate__(self, state):
        self.__init__()

    def _check_process(self) -> None:
        if self._pid != os.getpid():
            self._fds, self._blobs, self._client, self._pid = {}, {}, None, os.getpid()

    def read(self, path: str) -> bytes:
        """Returns the whole file or object at `path`.

        Raises:
          FilesMissing (a FileNotFoundError): naming `path` when it does not exist.
        """
        if not has_scheme(path):
            with open_local(path) as f:
                return f.read()
        blob = self._blob(path)
        # google-cloud-storage: 268 ms to import, the gcp extra; only gs:// paths need it
        from google.api_core import exceptions

        try:
            return blob.download_as_bytes(checksum=None)
        except exceptions.NotFound:
            raise FilesMissing(f"{path} does not exist") from None

    def exists(self, path: str) -> bool:
        if not has_scheme(path):
            return os.path.exists(path)
        return self._blob(path).exists()

    def size(self, path: str) -> int:
        """Bytes in the file or object at `path`: a stat, or one metadata request on gs://; nothing is read.

        Raises:
          FilesMissing (a FileNotFoundError): naming `path` when it does not exist.
        """
        if not has_scheme(path):
            return local_size(path)
        # google-cloud-storage: gs:// only (as in Files.read)
        from google.api_core import exceptions

        blob = self._blob(path)
        try:
            blob.reload()
        except exceptions.NotFound:
            raise FilesMissing(f"{path} does not exist") from None
        return int(blob.size)

    def read_range(self, path: str, offset: int, length: int) -> bytes:
        """Returns `length` bytes of `path` from byte `offset` (fewer at the end of the file)."""
        if not has_scheme(path):
            return os.pread(self._fd(path), length, offset)
        # google-cloud-storage: gs:// only (as in Files.read)
        from google.api_core import exceptions

        try:  # `end` is inclusive in the storage API
            return self._blob(path).download_as_bytes(start=offset, end=offset + length - 1, checksum=None)
        except exceptions.NotFound:
            raise FilesMissing(f"{path} does not exist (the dataset was rebuilt and this version "
                                    "removed? load the dataset again)") from None
        except exceptions.RequestRangeNotSatisfiable:
            return b""

    def _fd(self, path: str) -> int:
        with self._lock:
            self._check_process()
            fd = self._fds.get(path)
            if fd is None:
                fd = self._fds[path] = open_local_fd(path)
            return fd

    def _blob(self, path: str):
        with self._lock:
            self._check_process()
            blob = self._blobs.get(path)
            if blob is None:
                bucket, name = split_gs(path)
                if self._client is None:
                    try:
                        # google-cloud-storage: gs:// only (as in Files.read)
                        from google.cloud import storage
                    except ImportError:
                        raise ImportError(_GCS_HINT) from None
                    self._client = storage.Client()
                blob = self._blobs[path] = self._client.bucket(bucket).blob(name)
            return blob

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                for fd in self._fds.values():
                    os.close(fd)
            self._fds, self._blobs, self._client = {}, {}, None


def split_gs(path: str) -> Tuple[str, str]:
    """('bucket', 'object/name') of a gs:// path.

    Raises:
      ReadError (a ValueError): for another scheme or a path without an object name.
    """
    if not path.startswith("gs://"):
        raise ReadError(f"{path}: random access reads local paths and gs:// only")
    bucket, _, name = path[len("gs://"):].partition("/")
    if not bucket or not name:
        raise ReadError(f"{path}: not a gs://bucket/object path")
    return bucket, name
