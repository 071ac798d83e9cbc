"""Class-folder inputs (ROOT/<label>/**/<image>, local or on a FileSystems URI): the checks that
the folder has that shape, and its listing (input_files.py walks a local root; Beam matches a remote one)."""

from __future__ import annotations

import os
from typing import Iterable, List, Optional, Sequence, Union

from imagerecords.format.paths import has_scheme
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.errors import InputError
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import Rejected
from imagerecords.pipeline.read import input_files
from imagerecords.pipeline.sources.base import InputInfo, Listed, Source
from imagerecords.pipeline.sources.base import first_line as _first_line

# Bounds that keep the checks to a few seconds on any input: the listing is the pipeline's job.
_MAX_FOLDERS_WALKED = 2000  # folders visited looking for one file under the class folders
_REMOTE_MATCH_LIMIT = 1000  # files matched under a remote folder input
_MAX_ROOT_FILES_SNIFFED = 64  # files directly under a folder root looked at for images
_MANIFEST_HINT = "list the images in a CSV/JSONL manifest with path,label columns"
# Names the decoder's formats go by (codec.sniff_format), for listings that are not read.
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")


class FolderSource(Source):
    """Any input no other source claims: a class-folder root."""

    kind = "folder"

    def claims(self, path: str) -> bool:
        return True

    def check(self, config, *, ignore_split_column: bool = False) -> InputInfo:
        if has_scheme(config.input):
            _check_remote_folder(config.input)
        else:
            _check_local_folder(config.input)
        return InputInfo("folder")

    def folder(self, path: str) -> Optional[str]:
        return path

    def parts(self, config, info: InputInfo, workers: int) -> Sequence[Union[str, Rejected]]:
        """The root's class folders (one walk each), and rows for what else lies at the root."""
        return list(input_files.list_root(_root(config.input)))

    def list_part(self, config, info: InputInfo, part: Union[str, Rejected]) -> Iterable[Listed]:
        if isinstance(part, Rejected):
            return [part]
        return input_files.walk_class_folder(_root(config.input), part, config.image.max_file_bytes)

    def beam_listing(self, config, info: InputInfo, transforms):
        return transforms.ReadImages(config.input, config.image.max_file_bytes)


def _root(path: str) -> str:
    return path.rstrip("/") or "/"


def _flat_folder_error(path: str, images: Sequence[str] = (), parent: Optional[str] = None) -> InputError:
    if images and parent:
        return InputError(f"{setting('input', path)}: has no class folders (expected INPUT/<label>/<image>), only images "
                          f"({_shown(images)}); if it is one class's folder, pass its parent {parent} as {setting('input')}; "
                          f"otherwise {_MANIFEST_HINT}")
    return InputError(f"{setting('input', path)}: has no class folders (expected INPUT/<label>/<image>); "
                      f"for a flat folder, {_MANIFEST_HINT}")


def _one_class_error(path: str, images: Sequence[str], folder: str, parent: str) -> InputError:
    return InputError(f"{setting('input', path)}: looks like one class's folder, not a folder of class folders: it holds "
                      f"images ({_shown(images)}) beside one sub-folder, '{folder}', which would be the only class "
                      f"and the images skipped; pass its parent {parent} as {setting('input')}")


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")


def _has_image_extension(name: str) -> bool:
    return name.lower().endswith(_IMAGE_EXTENSIONS)


def _starts_like_an_image(path: str) -> bool:
    """Whether a local file's first bytes are an image signature (what the decoder goes by)."""
    try:
        # O_NONBLOCK: a FIFO put there since the listing must not block the launcher.
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return False
    with os.fdopen(fd, "rb", buffering=0) as f:
        try:
            head = f.read(16)
        except OSError:
            return False
    return codec.sniff_format(head or b"") is not None


def _root_images(files: Sequence[str]) -> List[str]:
    """Names of the (first _MAX_ROOT_FILES_SNIFFED) files directly under a local root that are
    images, by extension or, for the others, by their first bytes."""
    return [os.path.basename(f) for f in sorted(files)[:_MAX_ROOT_FILES_SNIFFED]
            if _has_image_extension(f) or _starts_like_an_image(f)]


def _parent(path: str) -> Optional[str]:
    """The folder above a local or URI folder, or None at a filesystem or bucket root."""
    if has_scheme(path):
        scheme, _, rest = path.partition("://")
        rest = rest.strip("/")
        return f"{scheme}://{rest.rsplit('/', 1)[0]}" if "/" in rest else None
    absolute = os.path.abspath(path)
    parent = os.path.dirname(absolute)
    return parent if parent != absolute else None


def _has_file_below(folders: List[str]) -> bool:
    """True when a non-hidden file lies somewhere under `folders` (symlinks followed, loops cut).

    Stops at the first file found; gives up (True: let the listing decide) after
    _MAX_FOLDERS_WALKED folders, so a huge tree of empty folders cannot stall the launcher.
    """
    seen = set()
    stack = list(reversed(folders))
    walked = 0
    while stack:
        folder = stack.pop()
        try:
            st = os.stat(folder)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue  # a symlink loop, or two links to one folder
        seen.add((st.st_dev, st.st_ino))
        walked += 1
        if walked > _MAX_FOLDERS_WALKED:
            return True
        try:
            with os.scandir(folder) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
        except OSError:
            # An unreadable class folder is listed (and reported) by the pipeline.
            return True
        subfolders = []
        for entry in entries:
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if not is_dir:
                return True
            subfolders.append(entry.path)
        stack.extend(reversed(subfolders))
    return False


def _check_local_folder(path: str) -> None:
    if not os.path.lexists(path):
        raise InputError(f"{setting('input', path)}: no such file or folder")
    if not os.path.exists(path):
        raise InputError(f"{setting('input', path)}: is a broken symlink (it points to {os.readlink(path)})")
    if not os.path.isdir(path):
        raise InputError(f"{setting('input', path)}: is a file but not a manifest; give a class-folder root "
                         "(INPUT/<label>/<image>) or a .csv/.jsonl manifest")
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if not e.name.startswith(".")]
    except OSError as e:
        raise InputError(f"{setting('input', path)}: cannot read the folder ({e.strerror or e})") from None
    if not entries:
        raise InputError(f"{setting('input', path)}: the folder is empty (expected INPUT/<label>/<image>)")
    class_folders, root_files = [], []
    for entry in entries:
        try:
            if entry.is_dir():  # follows symlinks: a linked class folder counts
                class_folders.append(entry.path)
            elif entry.is_file():
                root_files.append(entry.path)
        except OSError:
            continue
    # Images beside at most one folder: the user gave one class's folder, not the root above it.
    images = _root_images(root_files) if len(class_folders) <= 1 else []
    parent = _parent(path)
    if not class_folders:
        raise _flat_folder_error(path, images, parent)
    if images and parent:
        raise _one_class_error(path, images, os.path.basename(class_folders[0]), parent)
    class_folders.sort()
    if not _has_file_below(class_folders):
        names = ", ".join(os.path.basename(p) for p in class_folders[:3])
        more = ", ..." if len(class_folders) > 3 else ""
        raise InputError(f"{setting('input', path)}: the class folders ({names}{more}) hold no files "
                         "(expected INPUT/<label>/<image>)")


def _check_remote_folder(path: str) -> None:
    # Beam: 1.2 s to import; only a gs:// (or other remote) path needs its file systems
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    root = path.rstrip("/") + "/"
    try:
        matched = FileSystems.match([root + "**"], limits=[_REMOTE_MATCH_LIMIT])[0].metadata_list
    except BeamIOError as e:
        raise InputError(f"{setting('input', path)}: cannot list it ({_first_line(e)})") from None
    paths = [m.path for m in matched if m.path.startswith(root) and not refs_lib.is_hidden(m.path, root)]
    if not paths:
        raise InputError(f"{setting('input', path)}: no such folder, or no files under it (expected INPUT/<label>/<image>)")
    relative = [p[len(root):] for p in paths]
    folders = sorted({r.split("/", 1)[0] for r in relative if "/" in r})
    complete = len(matched) < _REMOTE_MATCH_LIMIT
    # Without reading objects, an image at the root is told by its name.
    images = sorted(r for r in relative if "/" not in r and _has_image_extension(r)) if complete else []
    parent = _parent(path)
    if len(folders) == 1 and images and parent:
        raise _one_class_error(path, images, folders[0], parent)
    if folders:
        return
    if complete:
        raise _flat_folder_error(path, images, parent)
    # Only files directly under the root among the first matches, but the listing was cut short:
    # class folders may follow, so the pipeline's listing decides.
