"""Files on local disk or on any Beam filesystem (gs://, s3://, ...), behind one small API.

Local paths are served by `os` directly, so a local build, `verify`, `inspect` and `report` never
pay Beam's import; a URI goes through Beam's FileSystems, imported on first use.
Both sides raise OSError (Beam's BeamIOError is one) for a failed operation.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import uuid
from typing import BinaryIO, Dict, Iterable, List, Optional, Sequence, Tuple, Union

from imagerecords.format import records
from imagerecords.format.paths import has_scheme, join  # join: re-exported as the builder's one path join

__all__ = ["is_local", "join", "open_read", "read_bytes", "size", "open_if_exists", "create", "rename", "link", "checked_identity",
           "moved_identity", "exists", "delete",
           "delete_all", "delete_quietly", "list_names", "list_tree", "list_folder", "gcs_objects", "gcs_client",
           "write_bytes", "os_reason", "is_no_space"]

log = logging.getLogger(__name__)


def _filesystems():
    # Beam: 1.2 s to import; only a gs:// (or other remote) path needs its file systems
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _uncompressed():
    # Beam: as in _filesystems
    from apache_beam.io.filesystem import CompressionTypes

    return CompressionTypes.UNCOMPRESSED


def is_local(path: str) -> bool:
    return not has_scheme(path)


def open_read(uri: str) -> BinaryIO:
    """Opens a file for reading as bytes, never decompressing (a .gz name is not a hint here)."""
    if is_local(uri):
        return open(uri, "rb")
    return _filesystems().open(uri, compression_type=_uncompressed())


def read_bytes(uri: str) -> bytes:
    """The whole file, for the small ones read at once (manifests, records, locks, label maps)."""
    with open_read(uri) as f:
        return f.read()


def size(uri: str) -> int:
    """A file's size in bytes from its metadata, nothing read; FileNotFoundError when it is not there."""
    if is_local(uri):
        return os.stat(uri).st_size
    try:  # metadata, not match: a name with [ * ? in it is no pattern here
        return _filesystems().get_filesystem(uri).metadata(uri).size_in_bytes
    except OSError:  # BeamIOError, for a missing object as for any other failure
        if not exists(uri):
            raise FileNotFoundError(f"{uri} does not exist") from None
        raise


def open_if_exists(uri: str) -> Optional[BinaryIO]:
    """Like open_read, but None when there is no such file (optional files such as errors.jsonl)."""
    if is_local(uri):
        try:
            return open(uri, "rb")
        except FileNotFoundError:
            return None
    return open_read(uri) if exists(uri) else None


def create(uri: str) -> BinaryIO:
    """Opens a new file for writing (replacing one of that name); a local parent folder is made."""
    if is_local(uri):
        parent = os.path.dirname(uri)
        if parent:
            os.makedirs(parent, exist_ok=True)
        return open(uri, "wb")
    return _filesystems().create(uri, mime_type="application/octet-stream", compression_type=_uncompressed())


# A file system that keeps times in whole 10 ms or coarser (1 s: ext4 with 128-byte inodes, HFS+, NFS
# from such a server; FAT 2 s; exFAT 10 ms) leaves them as they were after a write in the same tick.
_COARSE_TIMES_NS = 10**7


def _times(st: os.stat_result) -> Tuple[int, int]:
    """(mtime_ns, ctime_ns) of a stat result: the one place identity reads them (the tests emulate a
    coarse file system here; no tmpfs or ext4 can be made coarse without root)."""
    return st.st_mtime_ns, st.st_ctime_ns


def identity(uri: str) -> Optional[str]:
    """A local file's identity, "device:inode:size:mtime_ns:ctime_ns", or None (not local, gone, or
    on a file system with coarse times): any write, truncation or replacement through the file system
    changes it (the change time cannot be set back), so an equal identity later means the same bytes
    without reading them. Where both times are whole ticks of 10 ms or more (_COARSE_TIMES_NS) a
    write in the writer's own tick would change none of them, so such a file has no identity and
    whoever checks it reads its bytes (the odds that a fine clock gives two whole ticks are 1e-8)."""
    if not is_local(uri):
        return None
    try:
        st = os.stat(uri)
    except OSError:
        return None
    mtime, ctime = _times(st)
    if mtime % _COARSE_TIMES_NS == 0 and ctime % _COARSE_TIMES_NS == 0:
        return None
    return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{mtime}:{ctime}"


def checked_identity(uri: str, crc32c: Optional[str]) -> Optional[str]:
    """storage.identity of a local file just written, taken only if its bytes are still the ones
    written (their crc32c, as records.crc32c_text) and it did not change while they were read;
    else None, so the commit reads it back and refuses it. Another process writing into the file
    before it was in place (while open, or between close and rename) changes no identity that
    could be compared later: only its bytes tell. Read from the page cache, once, by its writer."""
    if crc32c is None:
        return None
    before = identity(uri)
    if before is None:
        return None
    try:
        with open(uri, "rb") as f:
            read = records.crc32c_of_stream(f)
    except OSError:
        return None
    if read != crc32c or identity(uri) != before:
        return None
    return before


def moved_identity(before: Optional[str], uri: str) -> Optional[str]:
    """The identity of a local file just renamed to `uri`, or None when it is not the file whose
    identity was `before` (a rename sets the change time, and only that)."""
    after = identity(uri)
    if before is None or after is None or after.rsplit(":", 1)[0] != before.rsplit(":", 1)[0]:
        return None
    return after


def rename(src: str, dst: str) -> None:
    """Moves `src` to `dst`, replacing it: atomic locally, copy then delete on object stores."""
    if is_local(src) and is_local(dst):
        os.replace(src, dst)
        return
    _filesystems().rename([src], [dst])


def link(src: str, dst: str) -> bool:
    """Makes `dst` a second name of the file `src` without moving its bytes through this process:
    a hard link locally, a server-side copy on object stores. Where the file system has no hard
    links (or `dst` is on another one) the bytes are copied into `dst` instead.

    Returns:
      False when the bytes had to be copied locally (the caller says so), True otherwise.
    """
    if is_local(src) and is_local(dst):
        try:
            os.link(src, dst)
            return True
        except FileExistsError:
            raise
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
        tmp = f"{dst}.link.tmp"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
        return False
    _filesystems().copy([src], [dst])
    return True


def exists(uri: str) -> bool:
    if is_local(uri):
        return os.path.exists(uri)
    return _filesystems().exists(uri)


def delete(uri: str) -> None:
    """Removes a file (locally, a folder with everything in it)."""
    if is_local(uri):
        if os.path.isdir(uri) and not os.path.islink(uri):
            shutil.rmtree(uri)
        else:
            os.remove(uri)
        return
    _filesystems().delete([uri])


def delete_all(uris: List[str]) -> None:
    """Removes many files: one batched request per 100 on gs://, one by one locally."""
    remote = [u for u in uris if not is_local(u)]
    for uri in uris:
        if is_local(uri):
            delete(uri)
    if remote:
        _filesystems().delete(remote)


def list_names(folder: str) -> List[str]:
    """Names of the files directly in `folder` (hidden ones included; sub-folders' files excluded)."""
    if is_local(folder):
        try:
            return sorted(e.name for e in os.scandir(folder) if not e.is_dir())
        except FileNotFoundError:
            return []
    if folder.startswith("gs://"):
        return list_folder(folder)[0]
    prefix = folder.rstrip("/") + "/"
    found = _filesystems().match([prefix + "*"])[0].metadata_list
    return sorted({m.path[len(prefix):] for m in found if "/" not in m.path[len(prefix):]})


def list_tree(folder: str) -> List[str]:
    """Every file under `folder`, as full paths."""
    if is_local(folder):
        out = []
        for dirpath, _, files in os.walk(folder):
            out.extend(os.path.join(dirpath, f) for f in files)
        return sorted(out)
    return sorted(m.path for m in _filesystems().match([folder.rstrip("/") + "/**"])[0].metadata_list)


def list_folder(folder: str) -> Tuple[List[str], List[str]]:
    """(names of the files directly in `folder`, names of its sub-folders), both sorted.

    On gs:// this is one listing with a delimiter (prefix `folder/`, delimiter '/'): GCS returns the
    sub-folders as prefixes, so its cost does not grow with the objects inside them (a dataset's shards).
    """
    if is_local(folder):
        try:
            entries = list(os.scandir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return [], []
        return sorted(e.name for e in entries if not e.is_dir()), sorted(e.name for e in entries if e.is_dir())
    if not folder.startswith("gs://"):
        prefix = folder.rstrip("/") + "/"
        rest = [p[len(prefix):] for p in list_tree(folder)]
        return sorted(r for r in rest if "/" not in r), sorted({r.split("/", 1)[0] for r in rest if "/" in r})
    bucket, prefix = _split_gs(folder)
    pages = gcs_client().list_blobs(bucket, prefix=prefix, delimiter="/")
    files = [blob.name[len(prefix):] for blob in pages]  # iterating every page fills pages.prefixes
    return sorted(files), sorted(p[len(prefix):].rstrip("/") for p in pages.prefixes)


def gcs_objects(folder: str) -> Dict[str, Tuple[int, Optional[str]]]:
    """{gs:// path: (size, crc32c as GCS shows it: base64, big-endian)} of every object under the
    gs:// `folder`: the listing carries each object's metadata, so no object is read."""
    bucket, prefix = _split_gs(folder)
    return {f"gs://{bucket}/{blob.name}": (int(blob.size), blob.crc32c)
            for blob in gcs_client().list_blobs(bucket, prefix=prefix)}


def gcs_client():
    """A google-cloud-storage client made as Beam makes its own (same credentials and endpoint).
    A new one per call: callers make a few calls per commit, and a client kept across calls would
    outlive a change of endpoint or a fork."""
    # Beam's GCS client: google-cloud-storage, 268 ms; only gs:// paths need it
    from apache_beam.io.gcp import gcsio

    return gcsio.GcsIO().client


def _split_gs(folder: str) -> Tuple[str, str]:
    """('bucket', 'name/prefix/') of a gs:// folder; the prefix ends with '/' (or is empty: the bucket)."""
    bucket, _, name = folder[len("gs://"):].partition("/")
    name = name.rstrip("/")
    return bucket, name + "/" if name else ""


def write_bytes(uri: str, data: Union[bytes, Iterable[bytes]]) -> None:
    """Writes a file through a temporary name and a rename, so readers never see half of it; the
    temporary file does not outlive a failed write. `data` may be the bytes, or pieces of them
    written one by one (errors.jsonl and duplicates.jsonl row by row: never a whole copy in memory)."""
    tmp = f"{uri}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with create(tmp) as f:
            if isinstance(data, (bytes, bytearray, memoryview)):
                f.write(data)
            else:
                for piece in data:
                    f.write(piece)
        rename(tmp, uri)
    except BaseException:
        delete_quietly([tmp])
        raise


def delete_quietly(paths: Sequence[str]) -> None:
    for path in paths:
        try:
            if exists(path):
                delete(path)
        except OSError as e:
            log.warning("could not remove %s: %s", path, e)


def os_reason(e: BaseException) -> str:
    """An OSError's reason without the run-dependent parts ('No space left on device')."""
    if isinstance(e, OSError) and e.errno:
        return os.strerror(e.errno)
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def is_no_space(e: BaseException) -> bool:
    text = str(e)
    return (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in text
