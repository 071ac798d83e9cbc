"""imagerecords.Error, the base of every expected failure, in the format layer so the readers
(which import only the format) raise it too without importing the builder."""

from __future__ import annotations

__all__ = ["Error", "FilesMissing", "NotRegularFile", "ReadError"]


class Error(Exception):
    """The base of every expected failure of imagerecords (exported as imagerecords.Error): a
    failure the user can act on, whose message is the whole story (no traceback needed). Reader
    errors keep ValueError or FileNotFoundError as a second base, so existing handlers still match."""


class ReadError(Error, ValueError):
    """A reader's call cannot be served: a bad argument, or files that are not what manifest.json says."""


class FilesMissing(Error, FileNotFoundError):
    """A dataset, manifest or shard a reader needs is not there."""


class NotRegularFile(Error, OSError):
    """A dataset's file is a pipe, a device or a folder: refused, never read (a FIFO blocks its reader
    for ever, /dev/zero is read until memory runs out)."""
