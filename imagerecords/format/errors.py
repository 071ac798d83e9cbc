"""imagerecords.Error, the base of every expected failure, in the format layer so the readers
(which import only the format) raise it too without importing the builder."""

from __future__ import annotations

__all__ = ["Error", "FilesMissing", "ManifestError", "NoSuchFeature", "NotPublished", "NotRegularFile", "OutOfRange",
           "ReadError", "RecordUndecodable",
           "TooLate", "WrongIndexType"]


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


class OutOfRange(Error, IndexError):
    """A record index past a split's end: still an IndexError, so sequence protocols stop on it."""


class WrongIndexType(Error, TypeError):
    """A record index that is not an integer (a float, a bool, a string): a caller's bug, never rounded."""


class NoSuchFeature(Error, KeyError):
    """A record lacks a feature its manifest's spec lists (the shard is not the build the manifest describes)."""

    def __str__(self) -> str:  # KeyError would print the message in quotes
        return str(self.args[0]) if self.args else ""


class RecordUndecodable(Error, ValueError):
    """A record's bytes cannot be decoded as the feature its spec names."""


class TooLate(Error, RuntimeError):
    """A setting that must come before something else already happened (TensorFlow started on the GPUs)."""


class ManifestError(Error, ValueError):
    """manifest.json is not a manifest this version can read; the message names the file and why."""


class NotPublished(Error, FileNotFoundError):
    """A folder holds no manifest.json; the message says whether an unfinished build is there.

    Attributes:
      unfinished: True when the folder holds a staging area (a build that did not publish).
    """

    def __init__(self, message: str, unfinished: bool):
        super().__init__(message)
        self.unfinished = unfinished
