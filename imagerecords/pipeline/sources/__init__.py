"""A build's inputs, one Source per kind, chosen in one place (`of`): class folders, manifests,
NumPy arrays, and any source a caller registers (sources.base explains the interface)."""

from __future__ import annotations

from imagerecords.pipeline.sources.arrays import ArraysSource
from imagerecords.pipeline.sources.base import InputInfo, Listed, Source, register, registered, unregister
from imagerecords.pipeline.sources.folders import FolderSource
from imagerecords.pipeline.sources.manifests import ManifestSource

__all__ = ["InputInfo", "Listed", "Source", "check_input", "for_build", "of", "register", "unregister"]

# Asked after every registered source, in this order; the folder source claims whatever is left.
_BUILT_IN = (ArraysSource(), ManifestSource(), FolderSource())


def of(path: str) -> Source:
    """The source that reads `path`: the newest registered source that claims it, else a built-in one."""
    return next(s for s in (*registered(), *_BUILT_IN) if s.claims(path))


def for_build(config) -> Source:
    """The source of `config.input`, set up for this build (Source.bind): the one the engines read with."""
    return of(config.input).bind(config)


def check_input(config, *, ignore_split_column: bool = False) -> InputInfo:
    """Checks that the input exists and has the shape its source reads, reading as little as possible
    (Source.check). A manifest's CSV header must name the path and label columns; a folder must hold
    a class folder with a file below; local paths and FileSystems URIs (gs://, s3://) both work.

    Args:
      config: the build configuration.
      ignore_split_column: allow `config.split.splits` although the manifest has a split column (the
        launcher's --ignore_split_column).

    Returns:
      What was learned: the kind of input and a manifest's columns (and CSV header line).

    Raises:
      InputError: naming the input and what is wrong with it.
      UsageError: --splits given for a manifest that has a split column, without ignore_split_column.
    """
    return of(config.input).check(config, ignore_split_column=ignore_split_column)
