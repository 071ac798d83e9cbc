"""Pre-flight checks of a build's input and output: fast, before Beam starts, one clear error each."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import errno
import json
import os
import posixpath
import secrets
from typing import IO, Iterator, List, Optional, Sequence, Tuple

from imagerecords.pipeline import arrays, codec, storage
from imagerecords.pipeline import refs as refs_lib
from imagerecords.format.paths import has_scheme
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.errors import InputError, OutputError, UsageError

__all__ = ["InputInfo", "PROBE_PREFIX", "check_input", "check_output", "read_manifest_head",
           "remove_created_output"]

PROBE_PREFIX = ".imagerecords-probe-"

# Bounds that keep the checks to a few seconds on any input: the listing is the pipeline's job.
_MAX_HEAD_LINES = 1000  # lines read to find a manifest's first row (blank lines are skipped)
_MAX_FOLDERS_WALKED = 2000  # folders visited looking for one file under the class folders
_REMOTE_MATCH_LIMIT = 1000  # files matched under a remote folder input

_MAX_ROOT_FILES_SNIFFED = 64  # files directly under a folder root looked at for images
_MANIFEST_HINT = "list the images in a CSV/JSONL manifest with path,label columns"
# Names the decoder's formats go by (codec.sniff_format), for listings that are not read.
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".jpe", ".png", ".gif", ".bmp", ".tif", ".tiff", ".webp")


@dataclasses.dataclass(frozen=True)
class InputInfo:
    """What the checks learned about the input (so that nobody reads it again to learn it).

    Attributes:
      kind: 'folder', 'csv', 'jsonl' or 'arrays'.
      columns: a manifest's column names (CSV header, or the keys of the first JSONL_COLUMN_ROWS
        JSONL rows); () for a folder.
      header: a CSV manifest's header line as written (BOM and line break removed), else None;
        ReadManifest parses every data line with it.
    """

    kind: str
    columns: Tuple[str, ...] = ()
    header: Optional[str] = None


def _manifest_kind(path: str) -> Optional[str]:
    lower = path.lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    return None


def _first_line(message: object) -> str:
    text = str(message).strip()
    return text.splitlines()[0] if text else type(message).__name__


@contextlib.contextmanager
def _open_input(path: str) -> Iterator[IO[bytes]]:
    """Opens a manifest for reading, turning every failure into an InputError naming it."""
    if has_scheme(path):
        from apache_beam.io.filesystem import BeamIOError
        from apache_beam.io.filesystems import FileSystems

        try:
            found = FileSystems.match([path], limits=[1])[0].metadata_list
        except BeamIOError as e:
            raise InputError(f"--input {path}: cannot read it ({_first_line(e)})") from None
        if not found or found[0].path.rstrip("/") != path.rstrip("/"):
            raise InputError(f"--input {path}: no such file")
        try:
            f = storage.open_read(path)
        except (BeamIOError, OSError) as e:
            raise InputError(f"--input {path}: cannot read it ({_first_line(e)})") from None
    else:
        if os.path.isdir(path):
            raise InputError(f"--input {path}: is a folder named like a manifest; give the .csv/.jsonl file, "
                             "or rename the folder")
        try:
            f = storage.open_read(path)
        except FileNotFoundError:
            raise InputError(f"--input {path}: no such file") from None
        except OSError as e:
            raise InputError(f"--input {path}: cannot read it ({e.strerror or e})") from None
    with f:
        yield f


def _non_blank_lines(path: str, f: IO[bytes], wanted: int, strict: Optional[int] = None,
                     limit: Optional[int] = None) -> List[str]:
    """Up to `wanted` non-blank lines from the start of `f`, decoded, line breaks removed. A line that
    is not UTF-8 among the first `strict` (default: all wanted) is an InputError; a later one is
    passed over (the build rejects it as a row). At most `limit` lines are read."""
    lines: List[str] = []
    strict = wanted if strict is None else strict
    for i in range(max(limit or 0, _MAX_HEAD_LINES)):
        raw = f.readline()
        if not raw:
            break
        try:
            text = raw.decode("utf-8-sig" if i == 0 else "utf-8").rstrip("\r\n")
        except UnicodeDecodeError as e:
            if len(lines) >= strict:
                continue
            raise InputError(f"--input {path}: line {i + 1} is not UTF-8 text ({e.reason}); "
                             "save the manifest as UTF-8") from None
        if text.strip():
            lines.append(text)
            if len(lines) == wanted:
                break
    return lines


def read_manifest_head(path: str) -> InputInfo:
    """Reads only the start of a manifest: the CSV header and one data line, or the first JSONL row.

    Raises:
      InputError: the file is missing, unreadable, not UTF-8, empty, has a header but no rows, or
        (JSONL) its first row is not a JSON object.
    """
    kind = _manifest_kind(path)
    if kind is None:
        raise ValueError(f"{path} is not a .csv or .jsonl manifest")
    with _open_input(path) as f:
        lines = (_non_blank_lines(path, f, 2) if kind == "csv"
                 else _non_blank_lines(path, f, JSONL_COLUMN_ROWS, strict=1, limit=JSONL_COLUMN_ROWS * 2))
    if not lines:
        raise InputError(f"--input {path}: the manifest is empty; it needs "
                         + ("a header line (path,label) and one line per image" if kind == "csv"
                            else "one JSON object per line, such as {\"path\": ..., \"label\": ...}"))
    if kind == "csv":
        header = lines[0]
        try:
            columns = tuple(c.strip() for c in next(csv.reader([header])))
        except csv.Error as e:
            raise InputError(f"--input {path}: the CSV header is not a CSV line ({e})") from None
        if len(lines) < 2:
            raise InputError(f"--input {path}: the CSV manifest has a header ({header}) but no rows")
        return InputInfo("csv", columns, header)
    while True:
        try:
            row = json.loads(lines[0])
            break
        except RecursionError:  # a row too deep to parse: the build rejects it; the next rows name the columns
            lines = lines[1:]
            if not lines:
                raise InputError(f"--input {path}: no row of the manifest's start can be read: each holds "
                                 "a JSON value nested deeper than the parser's limit") from None
        except ValueError as e:
            raise InputError(f"--input {path}: the first row is not JSON ({e})") from None
    if not isinstance(row, dict):
        raise InputError(f"--input {path}: the first row is not a JSON object; each line must be one, "
                         "such as {\"path\": ..., \"label\": ...}")
    columns = dict.fromkeys(_printable(k) for k in row)
    for line in lines[1:]:  # rows may differ in their keys: the columns seen in the first rows
        try:
            later = json.loads(line)
        except (ValueError, RecursionError):
            continue  # the build rejects that row, naming the line
        if isinstance(later, dict):
            columns.update(dict.fromkeys(_printable(k) for k in later))
    return InputInfo("jsonl", tuple(columns))


def _printable(name: str) -> str:
    """A JSONL key as the summary prints it: a lone surrogate (a \\ud800 escape) as its escape."""
    return str(name).encode("utf-8", "backslashreplace").decode("utf-8")


JSONL_COLUMN_ROWS = 1000  # the rows whose keys name a JSONL manifest's columns (see ignored_columns)


def ignored_columns(config: BuildConfig, info: InputInfo) -> Tuple[str, ...]:
    """The manifest's columns that no setting or feature reads (JSONL: of its first rows)."""
    used = set(config.manifest_columns().used())
    return tuple(c for c in info.columns if c not in used)


def _check_csv_columns(config: BuildConfig, info: InputInfo) -> None:
    columns = set(info.columns)
    listed = ", ".join(info.columns)
    path_ok = config.path_column in columns or (config.path_column == "path" and "uri" in columns)
    if not path_ok:
        also = " (or 'uri')" if config.path_column == "path" else ""
        raise InputError(f"--input {config.input}: the CSV header has no '{config.path_column}'{also} column "
                         f"(columns: {listed}); name the image path column with --path_column")
    if config.label_column not in columns:
        raise InputError(f"--input {config.input}: the CSV header has no '{config.label_column}' column "
                         f"(columns: {listed}); name the label column with --label_column")


def _flat_folder_error(path: str, images: Sequence[str] = (), parent: Optional[str] = None) -> InputError:
    if images and parent:
        return InputError(f"--input {path}: has no class folders (expected INPUT/<label>/<image>), only images "
                          f"({_shown(images)}); if it is one class's folder, pass its parent {parent} as --input; "
                          f"otherwise {_MANIFEST_HINT}")
    return InputError(f"--input {path}: has no class folders (expected INPUT/<label>/<image>); "
                      f"for a flat folder, {_MANIFEST_HINT}")


def _one_class_error(path: str, images: Sequence[str], folder: str, parent: str) -> InputError:
    return InputError(f"--input {path}: looks like one class's folder, not a folder of class folders: it holds "
                      f"images ({_shown(images)}) beside one sub-folder, '{folder}', which would be the only class "
                      f"and the images skipped; pass its parent {parent} as --input")


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
        raise InputError(f"--input {path}: no such file or folder")
    if not os.path.exists(path):
        raise InputError(f"--input {path}: is a broken symlink (it points to {os.readlink(path)})")
    if not os.path.isdir(path):
        raise InputError(f"--input {path}: is a file but not a manifest; give a class-folder root "
                         "(INPUT/<label>/<image>) or a .csv/.jsonl manifest")
    try:
        with os.scandir(path) as it:
            entries = [e for e in it if not e.name.startswith(".")]
    except OSError as e:
        raise InputError(f"--input {path}: cannot read the folder ({e.strerror or e})") from None
    if not entries:
        raise InputError(f"--input {path}: the folder is empty (expected INPUT/<label>/<image>)")
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
        raise InputError(f"--input {path}: the class folders ({names}{more}) hold no files "
                         "(expected INPUT/<label>/<image>)")


def _check_remote_folder(path: str) -> None:
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    root = path.rstrip("/") + "/"
    try:
        matched = FileSystems.match([root + "**"], limits=[_REMOTE_MATCH_LIMIT])[0].metadata_list
    except BeamIOError as e:
        raise InputError(f"--input {path}: cannot list it ({_first_line(e)})") from None
    paths = [m.path for m in matched if m.path.startswith(root) and not refs_lib.is_hidden(m.path, root)]
    if not paths:
        raise InputError(f"--input {path}: no such folder, or no files under it (expected INPUT/<label>/<image>)")
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


def check_input(config: BuildConfig, *, ignore_split_column: bool = False) -> InputInfo:
    """Checks that the input exists and has the shape the build reads, reading as little as possible.

    A manifest (.csv, .jsonl) must be readable and not empty, and a CSV header must name the path
    and label columns. A folder must hold at least one class folder (symlinks followed) with a file
    somewhere below. Local paths and FileSystems URIs (gs://, s3://) both work.

    Args:
      config: the build configuration.
      ignore_split_column: allow `config.splits` although the manifest has a split column (the
        launcher's --ignore_split_column).

    Returns:
      What was learned: the kind of input and a manifest's columns (and CSV header line).

    Raises:
      InputError: naming the input and what is wrong with it.
      UsageError: --splits given for a manifest that has a split column, without
        ignore_split_column.
    """
    path = config.input
    if arrays.is_arrays_input(path):
        arrays.check_input(path, config.schema, config.image.image_encoding)
        return InputInfo("arrays")
    kind = _manifest_kind(path)
    if kind is None:
        if has_scheme(path):
            _check_remote_folder(path)
        else:
            _check_local_folder(path)
        return InputInfo("folder")
    info = read_manifest_head(path)
    if kind == "csv":
        _check_csv_columns(config, info)
    if config.splits and config.split_column in info.columns and not ignore_split_column:
        raise UsageError(f"--splits would replace the '{config.split_column}' column of {path}: drop --splits to "
                         "keep the manifest's splits, or add --ignore_split_column to reassign every row by hash")
    return info


def _normalize_uri(uri: str) -> str:
    scheme, sep, rest = uri.partition("://")
    return f"{scheme.lower()}{sep}{posixpath.normpath(rest) if rest else rest}".rstrip("/")


def _check_not_in_input(config: BuildConfig, output: str, remote: bool) -> None:
    """Refuses an output folder that is the folder input or inside it (the next build would list
    the dataset's files as images of a class)."""
    if _manifest_kind(config.input) is not None or has_scheme(config.input) != remote:
        return
    if remote:
        out, inp, sep = _normalize_uri(output), _normalize_uri(config.input), "/"
    else:
        out, inp, sep = os.path.realpath(output), os.path.realpath(config.input), os.sep
    if out == inp:
        where = "is the input folder"
    elif out.startswith(inp.rstrip(sep) + sep):
        where = f"is inside the input folder {config.input}"
    else:
        return
    raise OutputError(f"--output {output}: {where}; the next build would read the dataset as a class. "
                      "Choose a folder outside the input")


_ADVICE = {
    errno.ENOSPC: "free some space or choose another --output",
    errno.EDQUOT: "free some space or choose another --output",
    errno.EROFS: "choose an --output on a writable filesystem",
    errno.EACCES: "fix the folder's permissions or choose another --output",
    errno.EPERM: "fix the folder's permissions or choose another --output",
}


def _write_error(output: str, e: OSError, doing: str) -> OutputError:
    reason = os.strerror(e.errno) if e.errno else str(e)
    advice = _ADVICE.get(e.errno, "choose another --output")
    return OutputError(f"--output {output}: cannot {doing} ({reason}); {advice}")


def _probe(output: str) -> None:
    """Proves the folder takes a new file by creating, writing, syncing and deleting one."""
    probe = os.path.join(output, PROBE_PREFIX + secrets.token_hex(8))
    try:
        # O_EXCL: never touch a file that is not ours.
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise _write_error(output, e, "create a file there") from None
    try:
        try:
            os.write(fd, b"\0")  # a full disk still creates empty files; the first byte fails
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        raise _write_error(output, e, "write there") from None
    finally:
        try:
            os.remove(probe)
        except FileNotFoundError:
            pass
        except OSError as e:
            raise _write_error(output, e, "delete a file there") from None


def _topmost_missing(path: str) -> Optional[str]:
    """The highest folder of `path` that does not exist yet (what makedirs will create), or None."""
    path = os.path.abspath(path)
    if os.path.lexists(path):
        return None
    while not os.path.lexists(os.path.dirname(path)):
        path = os.path.dirname(path)
    return path


def _check_local_output(config: BuildConfig) -> Optional[str]:
    output = config.output
    if os.path.lexists(output) and not os.path.isdir(output):
        what = "is a broken symlink" if os.path.islink(output) and not os.path.exists(output) else "is a file"
        raise OutputError(f"--output {output}: {what}, not a folder; choose a folder path")
    _check_not_in_input(config, output, remote=False)
    created = _topmost_missing(output)
    try:
        try:
            os.makedirs(output, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise OutputError(f"--output {output}: a part of the path is a file, not a folder; "
                              "choose a folder path") from None
        except OSError as e:
            raise _write_error(output, e, "create the folder") from None
        _probe(output)
    except OutputError:
        remove_created_output(created)
        raise
    return created


def _check_remote_output(config: BuildConfig) -> None:
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    output = config.output
    _check_not_in_input(config, output, remote=True)
    try:
        found = FileSystems.match([output.rstrip("/")], limits=[1])[0].metadata_list
    except BeamIOError as e:
        raise OutputError(f"--output {output}: cannot check it ({_first_line(e)})") from None
    if any(m.path.rstrip("/") == output.rstrip("/") for m in found):
        raise OutputError(f"--output {output}: is a file, not a folder; choose a folder path")


def check_output(config: BuildConfig) -> Optional[str]:
    """Checks that the output can take the build, before anything runs.

    The output must not be a file, nor the folder input or inside it (compared as resolved real
    paths locally, as normalized prefixes for URIs). A local output folder is created (parents
    too) and proved writable with a probe file (`.imagerecords-probe-<random>`, removed at once).
    A remote output gets no probe: the launcher's lock is the first write there. A --version_name
    the folder already holds is refused (versions are never rewritten). Whether the folder
    already holds a dataset (--overwrite) and the lock are the launcher's checks, not these.

    Returns:
      The highest local folder this check created (pass it to remove_created_output when the build
      ends before writing there), or None when it created none.

    Raises:
      OutputError: naming the output folder and the reason (the OS's, for a failed write).
    """
    if has_scheme(config.output):
        _check_remote_output(config)
        created = None
    else:
        created = _check_local_output(config)
    if config.version_name:
        from imagerecords.pipeline import publish

        publish.check_version_free(config.output, config.version_name)  # the commit checks it again
    return created


def remove_created_output(created: Optional[str]) -> None:
    """Removes the folders check_output created when no file was written under them (a build that
    failed before its first write leaves no empty output folder behind); anything else stays."""
    if not created or not os.path.isdir(created) or os.path.islink(created):
        return
    folders = []
    for dirpath, dirnames, filenames in os.walk(created, topdown=False):
        if filenames:
            return
        folders.append(dirpath)
    for folder in folders:  # deepest first
        try:
            os.rmdir(folder)
        except OSError:  # something arrived in it meanwhile: it stays
            return
