"""Dataset paths: a local path, or a URI with a scheme (gs://, s3://); shared by the builder and the reader."""

from __future__ import annotations

import os
import re
from typing import Optional

_SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
# C0, DEL, C1 and the Unicode line/paragraph separators: each would split a name across lines.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def has_scheme(path: str) -> bool:
    """Whether `path` is a URI (`scheme://...`) rather than a local path."""
    return bool(_SCHEME_RE.match(path))


def join(folder: str, *names: str) -> str:
    """`folder`/`names`: os.path.join locally, '/'-joined for a URI."""
    if not has_scheme(folder):
        return os.path.join(folder, *names)
    return "/".join([folder.rstrip("/"), *names])


def inside_problem(name: object) -> Optional[str]:
    """Why `name`, read from data, is not a '/'-separated relative name that stays inside the folder
    it is joined to (locally and as a gs:// object name alike), or None when it is."""
    if not isinstance(name, str):
        return f"is a {type(name).__name__}, not text"
    if not name:
        return "is empty"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid text (a lone surrogate)"
    if has_scheme(name):
        return "is a URI"
    if name.startswith("/"):
        return "is an absolute path"
    if "\\" in name:
        return "holds a backslash"
    control = _CONTROL_RE.search(name)
    if control:
        return f"holds the control character {control.group()!r}"
    parts = name.split("/")
    if ".." in parts:
        return "climbs out with '..'"
    if "" in parts or "." in parts:
        return "has an empty or '.' part"
    return None


def segment_problem(name: object) -> Optional[str]:
    """Like inside_problem, for a name that must be one entry of its folder (no '/')."""
    problem = inside_problem(name)
    if problem is None and "/" in name:
        return "holds a '/'"
    return problem
