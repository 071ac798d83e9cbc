"""Pre-flight checks of a build's input and output: fast, before Beam starts, one clear error each."""

from __future__ import annotations

import errno
import os
import posixpath
import secrets
from typing import Optional

from imagerecords.format.paths import has_scheme
from imagerecords.pipeline import sources
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.errors import OutputError
from imagerecords.pipeline.sources import InputInfo, check_input
from imagerecords.pipeline.sources.base import first_line as _first_line
from imagerecords.pipeline.sources.manifests import ignored_columns, read_manifest_head
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.publish import commit as publish

__all__ = ["InputInfo", "PROBE_PREFIX", "check_input", "check_output", "ignored_columns", "read_manifest_head",
           "remove_created_output"]

PROBE_PREFIX = ".imagerecords-probe-"


def _normalize_uri(uri: str) -> str:
    scheme, sep, rest = uri.partition("://")
    return f"{scheme.lower()}{sep}{posixpath.normpath(rest) if rest else rest}".rstrip("/")


def _check_not_in_input(config: BuildConfig, output: str, remote: bool) -> None:
    """Refuses an output folder that is the folder input or inside it (the next build would list
    the dataset's files as images of a class)."""
    listed = sources.of(config.input).folder(config.input)
    if listed is None or has_scheme(listed) != remote:
        return
    if remote:
        out, inp, sep = _normalize_uri(output), _normalize_uri(listed), "/"
    else:
        out, inp, sep = os.path.realpath(output), os.path.realpath(listed), os.sep
    if out == inp:
        where = "is the input folder"
    elif out.startswith(inp.rstrip(sep) + sep):
        where = f"is inside the input folder {config.input}"
    else:
        return
    raise OutputError(f"{setting('output', output)}: {where}; the next build would read the dataset as a class. "
                      "Choose a folder outside the input")


# {output}: the setting's name, filled when the message is made (a flag or a keyword).
_ADVICE = {
    errno.ENOSPC: "free some space or choose another {output}",
    errno.EDQUOT: "free some space or choose another {output}",
    errno.EROFS: "choose an {output} on a writable filesystem",
    errno.EACCES: "fix the folder's permissions or choose another {output}",
    errno.EPERM: "fix the folder's permissions or choose another {output}",
}


def _write_error(output: str, e: OSError, doing: str) -> OutputError:
    reason = os.strerror(e.errno) if e.errno else str(e)
    advice = _ADVICE.get(e.errno, "choose another {output}").format(output=setting("output"))
    return OutputError(f"{setting('output', output)}: cannot {doing} ({reason}); {advice}")


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
        raise OutputError(f"{setting('output', output)}: {what}, not a folder; choose a folder path")
    _check_not_in_input(config, output, remote=False)
    created = _topmost_missing(output)
    try:
        try:
            os.makedirs(output, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise OutputError(f"{setting('output', output)}: a part of the path is a file, not a folder; "
                              "choose a folder path") from None
        except OSError as e:
            raise _write_error(output, e, "create the folder") from None
        _probe(output)
    except OutputError:
        remove_created_output(created)
        raise
    return created


def _check_remote_output(config: BuildConfig) -> None:
    # Beam: 1.2 s to import; only a gs:// (or other remote) path needs its file systems
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    output = config.output
    _check_not_in_input(config, output, remote=True)
    try:
        found = FileSystems.match([output.rstrip("/")], limits=[1])[0].metadata_list
    except BeamIOError as e:
        raise OutputError(f"{setting('output', output)}: cannot check it ({_first_line(e)})") from None
    if any(m.path.rstrip("/") == output.rstrip("/") for m in found):
        raise OutputError(f"{setting('output', output)}: is a file, not a folder; choose a folder path")


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
    if config.publish.version_name:
        publish.check_version_free(config.output, config.publish.version_name)  # the commit checks it again
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
