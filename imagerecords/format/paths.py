"""Dataset paths: a local path, or a URI with a scheme (gs://, s3://); shared by the builder and the reader."""

from __future__ import annotations

import os
import re

_SCHEME_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def has_scheme(path: str) -> bool:
    """Whether `path` is a URI (`scheme://...`) rather than a local path."""
    return bool(_SCHEME_RE.match(path))


def join(folder: str, *names: str) -> str:
    """`folder`/`names`: os.path.join locally, '/'-joined for a URI."""
    if not has_scheme(folder):
        return os.path.join(folder, *names)
    return "/".join([folder.rstrip("/"), *names])
