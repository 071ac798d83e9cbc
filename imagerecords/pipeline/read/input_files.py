"""Input files without Beam: walk a local class-folder tree safely and read files within a size limit."""

from __future__ import annotations

import dataclasses
import functools
import errno
import os
import re
import stat as stat_lib
from typing import BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple, Union

from imagerecords.format.paths import has_scheme
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline import storage
from imagerecords.pipeline.refs import ImageRef, Rejected

__all__ = [
    "FileOps", "Probe", "Refused", "describe_os_error", "list_root", "probe", "read_limited",
    "size_refusal", "stable_text", "walk_class_folder",
]

# Entries that are neither files nor folders; opening one for reading can block forever (a FIFO
# with no writer) or read without end (a device), so they are reported and never opened.
_SPECIAL_KINDS = (
    (stat_lib.S_ISFIFO, "a FIFO (named pipe)"),
    (stat_lib.S_ISSOCK, "a socket"),
    (stat_lib.S_ISCHR, "a character device"),
    (stat_lib.S_ISBLK, "a block device"),
)

_ADDRESS_RE = re.compile(r" at 0x[0-9a-fA-F]+")
_HEX_RE = re.compile(r"0x[0-9a-fA-F]{6,}")


def stable_text(text: str) -> str:
    """Removes run-dependent bits (object addresses) from an exception message.

    `<_io.BytesIO object at 0x7fd9...>` becomes `<_io.BytesIO object>`, so two builds of the same
    input write the same errors.jsonl.
    """
    return _HEX_RE.sub("0x?", _ADDRESS_RE.sub("", text))


def describe_os_error(e: BaseException) -> str:
    """Returns the OS reason of a read failure ("No such file or directory"), without paths or reprs.

    Beam's BeamIOError carries the underlying errors in `exception_details` ({path: exception});
    the first one by path is described.
    """
    details = getattr(e, "exception_details", None)
    if isinstance(details, dict) and details:
        inner = details[sorted(details, key=str)[0]]
        if isinstance(inner, BaseException):
            return describe_os_error(inner)
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    text = stable_text(str(e))
    return text or type(e).__name__


class Refused(OSError):
    """An input turned away by policy before or instead of being read: not a regular file, or
    larger than the size limit. The message is the reason written to errors.jsonl."""


def size_refusal(size: int, max_bytes: Optional[int]) -> Optional[str]:
    """Returns the reason a file of `size` bytes is refused under `max_bytes`, or None if it fits."""
    if max_bytes is None or size <= max_bytes:
        return None
    return (f"file too large: {size} bytes is over the limit of {max_bytes} bytes "
            f"(max_file_mb={max_bytes / 1e6:g}); it was not read")


def _special_kind(mode: int) -> Optional[str]:
    for test, name in _SPECIAL_KINDS:
        if test(mode):
            return name
    return None


def _kind_name(mode: int) -> str:
    return _special_kind(mode) or ("a folder" if stat_lib.S_ISDIR(mode) else "an unknown file type")


def _not_regular(kind: str) -> str:
    return f"not a regular file: {kind}; it was not opened"


@dataclasses.dataclass(frozen=True)
class FileOps:
    """The OS calls a walk makes; tests pass fakes to produce cases a root user cannot (EACCES)."""

    stat: Callable[[str], os.stat_result] = os.stat
    lstat: Callable[[str], os.stat_result] = os.lstat
    access: Callable[[str, int], bool] = os.access
    readlink: Callable[[str], str] = os.readlink
    listdir: Callable[[str], List[str]] = os.listdir


@dataclasses.dataclass(frozen=True)
class Probe:
    """What a path is, found with stat calls only (it is never opened).

    Attributes:
      kind: 'dir', 'file', or 'bad' (cannot be listed; `reason` says why).
      size: bytes of a file (-1 otherwise).
      ident: (st_dev, st_ino) after following symlinks, for loop detection.
      reason: why a 'bad' path cannot be listed (deterministic text).
      error: the exception type behind `reason`, or '' when none was raised.
    """

    kind: str
    size: int = -1
    ident: Tuple[int, int] = (0, 0)
    reason: str = ""
    error: str = ""


def probe(path: str, ops: FileOps = FileOps()) -> Probe:
    """Classifies `path`, following symlinks: a folder, a readable regular file, or a bad entry
    (dangling symlink, symlink loop, FIFO, socket, device, no permission) with its reason."""
    try:
        st = ops.stat(path)
    except FileNotFoundError as e:
        try:
            is_link = stat_lib.S_ISLNK(ops.lstat(path).st_mode)
        except OSError:
            is_link = False
        if not is_link:
            return Probe("bad", reason="file not found", error=type(e).__name__)
        try:
            target = ops.readlink(path)
        except OSError:
            target = "?"
        return Probe("bad", reason=f"dangling symlink: its target {target!r} does not exist", error=type(e).__name__)
    except PermissionError as e:
        return Probe("bad", reason="unreadable: permission denied (cannot stat)", error=type(e).__name__)
    except OSError as e:
        if e.errno == errno.ELOOP:
            return Probe("bad", reason="symlink loop: the link never resolves to a file or folder", error=type(e).__name__)
        return Probe("bad", reason=f"cannot stat: {describe_os_error(e)}", error=type(e).__name__)
    ident = (st.st_dev, st.st_ino)
    if stat_lib.S_ISDIR(st.st_mode):
        if not ops.access(path, os.R_OK | os.X_OK):
            return Probe("bad", ident=ident, reason="unreadable folder: no permission to list it")
        return Probe("dir", ident=ident)
    if stat_lib.S_ISREG(st.st_mode):
        if not ops.access(path, os.R_OK):
            return Probe("bad", ident=ident, reason="unreadable file: no read permission")
        return Probe("file", size=st.st_size, ident=ident)
    return Probe("bad", ident=ident, reason=_not_regular(_kind_name(st.st_mode)))


def _row(path: str, key: str, reason: str, error: str = "", stage: str = "list", skipped: bool = False) -> Rejected:
    return Rejected(path, reason, key=key, stage=stage, error=error, skipped=skipped)


def _listdir(path: str, key: str, ops: FileOps) -> Tuple[List[str], Optional[Rejected]]:
    try:
        return sorted(ops.listdir(path)), None
    except OSError as e:
        what = "permission denied" if isinstance(e, PermissionError) else describe_os_error(e)
        return [], _row(path, key, f"unreadable folder: {what}", type(e).__name__)


def list_root(root: str, ops: FileOps = FileOps()) -> Iterator[Union[str, Rejected]]:
    """Lists a class-folder root's top level: yields each class folder's name, and a Rejected row
    for everything else.

    Files directly under the root are not images of a class: their rows are `skipped` (listed for
    the record, not counted against the reject budget). Hidden names ('.DS_Store') are not listed.

    Raises:
      OSError: when the root itself cannot be listed (the launcher checks it before the build).
    """
    for name in sorted(ops.listdir(root)):
        if name.startswith("."):
            continue
        path = f"{root}/{name}"
        found = probe(path, ops)
        if found.kind == "dir":
            yield name
        elif found.kind == "file":
            yield _row(path, name, refs_lib.ROOT_FILE_REASON, skipped=True)
        else:
            yield _row(path, name, found.reason, found.error)


def walk_class_folder(
    root: str, name: str, max_file_bytes: Optional[int] = None, ops: FileOps = FileOps()
) -> Iterator[Union[ImageRef, Rejected]]:
    """Walks `root/name` depth first in name order, following symlinks, and yields an ImageRef for
    every readable regular file and a Rejected row for every entry that cannot be one.

    Keys and uris are the paths under the root as listed, never a symlink's target, so the output
    is what it would be with the files copied there. A folder reached again (a symlink back to an
    ancestor, or a second link to a folder already walked) is reported once and not descended.
    Nothing is opened for reading.

    Args:
      root: the input root, without a trailing '/'.
      name: a class folder's name (from list_root).
      max_file_bytes: files above this size are rejected (stage 'read') without being read.
      ops: the OS calls to use.
    """
    prefix = root + "/"
    try:
        root_stat = ops.stat(root)
        root_ident: Optional[Tuple[int, int]] = (root_stat.st_dev, root_stat.st_ino)
    except OSError:
        root_ident = None
    top = prefix + name
    found = probe(top, ops)
    if found.kind != "dir":
        if found.kind == "bad":
            yield _row(top, name, found.reason, found.error)
        else:  # it became a file since the root was listed
            ref, rejected = refs_lib.ref_from_folder_path(prefix, top, found.size)
            yield rejected if rejected is not None else ref
        return
    ancestors0: Dict[Tuple[int, int], str] = {root_ident: ""} if root_ident is not None else {}
    visited: Dict[Tuple[int, int], str] = {}
    # (path, key, ident, ancestors of this folder: {ident: key}); popped in name order.
    stack = [(top, name, found.ident, ancestors0)]
    while stack:
        path, key, ident, ancestors = stack.pop()
        if ident in ancestors:
            back = ancestors[ident]
            where = f"its ancestor folder {back!r}" if back else "the input root"
            yield _row(path, key, f"symlink loop: {key!r} leads back to {where}; not descended again")
            continue
        if ident in visited:
            yield _row(path, key, f"symlink to a folder already listed as {visited[ident]!r}; not listed again")
            continue
        visited[ident] = key
        inner = dict(ancestors)
        inner[ident] = key
        names, problem = _listdir(path, key, ops)
        if problem is not None:
            yield problem
        folders = []
        for child in names:
            if child.startswith("."):
                continue
            child_path, child_key = f"{path}/{child}", f"{key}/{child}"
            entry = probe(child_path, ops)
            if entry.kind == "dir":
                folders.append((child_path, child_key, entry.ident, inner))
            elif entry.kind == "bad":
                yield _row(child_path, child_key, entry.reason, entry.error)
            else:
                too_big = size_refusal(entry.size, max_file_bytes)
                if too_big is not None:
                    yield _row(child_path, child_key, too_big, stage="read")
                    continue
                ref, rejected = refs_lib.ref_from_folder_path(prefix, child_path, entry.size)
                yield rejected if rejected is not None else ref
        stack.extend(reversed(folders))


def _open_uri(uri: str) -> BinaryIO:
    return storage.open_read(uri)


def _read_whole(f: BinaryIO, size: int, max_bytes: Optional[int]) -> bytes:
    """Reads an unbuffered file to its end, at most max_bytes + 1 bytes.

    The first read asks for the stat-ed size plus one byte, not for the limit: a read of n bytes
    allocates n bytes first, and the limit is far larger than a typical image. A file that grew
    since the stat is read on to its end or to the limit.
    """
    cap = None if max_bytes is None else max_bytes + 1
    parts: List[bytes] = []
    total = 0
    while cap is None or total < cap:
        want = size + 1 if not parts else 1 << 20  # short reads are allowed: read on to EOF
        chunk = f.read(want if cap is None else min(want, cap - total))
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def limited_reader(options) -> Callable[[str], bytes]:
    """Returns the `read_bytes` of a build's file inputs: read_limited under `options.max_file_bytes`
    (codec.ImageOptions; local non-regular and oversize files are refused unopened; remote reads stop
    past the limit)."""
    return functools.partial(read_limited, max_bytes=options.max_file_bytes)


def read_limited(uri: str, max_bytes: Optional[int] = None,
                 open_uri: Optional[Callable[[str], BinaryIO]] = None) -> bytes:
    """Reads a whole input file, refusing what must not or need not be read.

    A local path is stat-ed first: anything but a regular file (a FIFO would block the reader
    forever) and anything over `max_bytes` is refused without being opened. A remote URI (gs://,
    s3://) is read through Beam FileSystems, at most `max_bytes` + 1 bytes, and refused if that
    many came.

    Args:
      uri: local path or FileSystems URI.
      max_bytes: the size limit in bytes; None for no limit.
      open_uri: opens a remote URI as a binary stream (default: FileSystems.open, uncompressed).

    Returns:
      The file's bytes.

    Raises:
      Refused: the file is not a regular file or is over the limit; the message is the reason.
      OSError: the file cannot be read (Beam's BeamIOError is an IOError).
    """
    if has_scheme(uri):
        with (open_uri or _open_uri)(uri) as f:
            data = f.read() if max_bytes is None else f.read(max_bytes + 1)
        if max_bytes is not None and len(data) > max_bytes:
            raise Refused(f"file too large: over the limit of {max_bytes} bytes (max_file_mb={max_bytes / 1e6:g}); "
                          f"reading stopped after {max_bytes + 1} bytes")
        return data
    st = os.stat(uri)
    if not stat_lib.S_ISREG(st.st_mode):
        raise Refused(_not_regular(_kind_name(st.st_mode)))
    too_big = size_refusal(st.st_size, max_bytes)
    if too_big is not None:
        raise Refused(too_big)
    # O_NONBLOCK: if the path was swapped for a FIFO since the stat, open returns at once instead
    # of waiting for a writer; fstat below then refuses it. It does nothing to regular files.
    fd = os.open(uri, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())
        if not stat_lib.S_ISREG(st.st_mode):
            raise Refused(_not_regular(_kind_name(st.st_mode)))
        data = _read_whole(f, st.st_size, max_bytes)
    if max_bytes is not None and len(data) > max_bytes:
        raise Refused(f"file too large: it grew over the limit of {max_bytes} bytes "
                      f"(max_file_mb={max_bytes / 1e6:g}) while read; reading stopped after {max_bytes + 1} bytes")
    return data
