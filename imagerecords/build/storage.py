"""Files on local disk or on any Beam filesystem (gs://, s3://, ...), behind one small API.

Local paths are served by `os` directly, so a local build, `verify`, `inspect` and `report` never
pay Beam's import; a URI goes through Beam's FileSystems, imported on first use.
Both sides raise OSError (Beam's BeamIOError is one) for a failed operation.
"""

from __future__ import annotations

import os
import shutil
from typing import BinaryIO, List, Optional

from imagerecords.format.paths import has_scheme, join  # join: re-exported as the builder's one path join

__all__ = ["is_local", "join", "open_read", "read_bytes", "open_if_exists", "create", "rename", "exists", "delete",
           "delete_all", "list_names", "list_tree"]


def _filesystems():
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _uncompressed():
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


def rename(src: str, dst: str) -> None:
    """Moves `src` to `dst`, replacing it: atomic locally, copy then delete on object stores."""
    if is_local(src) and is_local(dst):
        os.replace(src, dst)
        return
    _filesystems().rename([src], [dst])


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
