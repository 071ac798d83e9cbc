"""ReadImages and ReadManifest: inputs become ImageRefs (tiny records) or rejected rows."""

from __future__ import annotations

from typing import Iterable, Optional, Union

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import FileMetadata
from apache_beam.metrics import Metrics

from imagerecords.format.paths import has_scheme
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import ImageRef, ManifestColumns, Rejected, is_manifest
from imagerecords.pipeline.read import input_files
from imagerecords.transforms.common import METRICS_NAMESPACE, REJECTED

__all__ = ["ListSource", "ReadImages", "ReadManifest", "is_manifest"]


def _check_max_file_bytes(owner: str, max_file_bytes: Optional[int]) -> None:
    if max_file_bytes is not None and (isinstance(max_file_bytes, bool) or not isinstance(max_file_bytes, int)
                                       or max_file_bytes < 1):
        raise ValueError(f"{owner}: max_file_bytes must be a positive number of bytes or None, got {max_file_bytes!r}")


def _tagged(item: Union[ImageRef, Rejected]) -> Union[ImageRef, beam.pvalue.TaggedOutput]:
    return beam.pvalue.TaggedOutput(REJECTED, item) if isinstance(item, Rejected) else item


class _ListRootFn(beam.DoFn):
    """Lists a local root's top level: class folder names, and rows for everything else."""

    def process(self, root: str) -> Iterable[Union[str, Rejected]]:
        yield from input_files.list_root(root)


class _WalkClassFn(beam.DoFn):
    """Walks one local class folder (rows from the root listing pass through to REJECTED)."""

    def __init__(self, root: str, max_file_bytes: Optional[int]):
        self._root = root
        self._max_file_bytes = max_file_bytes
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")
        self._skipped = Metrics.counter(METRICS_NAMESPACE, "skipped")

    def process(self, item: Union[str, Rejected]) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        found = [item] if isinstance(item, Rejected) else input_files.walk_class_folder(self._root, item, self._max_file_bytes)
        for out in found:
            self._listed.inc()
            if isinstance(out, Rejected) and out.skipped:
                self._skipped.inc()
            yield _tagged(out)


class _FolderRefFn(beam.DoFn):
    """Turns a matched remote file into a ref, or a row (root-level file, over the size limit)."""

    def __init__(self, root: str, max_file_bytes: Optional[int]):
        self._root = root.rstrip("/") + "/"
        self._max_file_bytes = max_file_bytes
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")
        self._skipped = Metrics.counter(METRICS_NAMESPACE, "skipped")

    def process(self, meta: FileMetadata) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        if refs_lib.is_hidden(meta.path, self._root):
            return
        self._listed.inc()
        ref, rejected = refs_lib.ref_from_folder_path(self._root, meta.path, meta.size_in_bytes)
        if rejected is not None:
            self._skipped.inc(int(rejected.skipped))
            yield _tagged(rejected)
            return
        too_big = input_files.size_refusal(meta.size_in_bytes, self._max_file_bytes)
        if too_big is not None:
            yield _tagged(Rejected(ref.uri, too_big, ref.key, stage="read"))
            return
        yield ref


def _remote_patterns(root: str) -> Iterable[str]:
    """The match patterns that together cover a remote root: one per top-level folder on gs://
    (found with one delimited listing, so the folders' files are matched in parallel, each by one
    worker), plus the root's own files; elsewhere the whole tree in one pattern."""
    if not root.startswith("gs://"):
        yield root + "/**"
        return
    # Beam's GCS client: google-cloud-storage, 268 ms; only gs:// patterns need it
    from apache_beam.io.gcp import gcsio

    bucket, _, prefix = root[len("gs://"):].partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix.rstrip("/") else ""
    listing = gcsio.GcsIO().client.list_blobs(bucket, prefix=prefix, delimiter="/")
    files = [blob.name for blob in listing]  # consuming the pages fills listing.prefixes
    for folder in sorted(listing.prefixes):
        yield f"gs://{bucket}/{folder}**"
    if files:
        yield root + "/*"  # root-level files: they become skipped rows


class ReadImages(beam.PTransform):
    """Lists every file under a class-folder root (`root/<label>/**/<file>`) as an ImageRef.

    Input: the pipeline's begin (`p | ReadImages(root)`).
    Outputs: 'refs' (ImageRef with key, uri, label and size; split not yet set) and REJECTED
    (Rejected, with its reason).
    Hidden files and folders (name starting with '.') are not listed. Files directly under the
    root become `skipped` rows. A local root is walked by our own code (input_files.py): symlinked
    files and folders are followed, with loop detection; dangling symlinks, FIFOs, sockets,
    devices and unreadable entries become rows without ever being opened. A remote root is listed
    with fileio.MatchAll, on gs:// one pattern per top-level folder, so class folders are listed in
    parallel rather than by one worker.

    Args:
      root: the input folder (local path or FileSystems URI).
      max_file_bytes: files above this size become rows (stage 'read') at listing; None: no check.
    """

    def __init__(self, root: str, max_file_bytes: Optional[int] = None):
        super().__init__()
        if not root or not root.rstrip("/"):
            raise ValueError(f"ReadImages needs a root folder, got {root!r}")
        _check_max_file_bytes("ReadImages", max_file_bytes)
        self._root = root.rstrip("/")
        self._max_file_bytes = max_file_bytes

    def expand(self, pbegin):
        if has_scheme(self._root):
            return (
                pbegin
                | "Root" >> beam.Create([self._root])
                | "TopLevel" >> beam.FlatMap(_remote_patterns)
                # one match pattern per top-level folder
                | "Spread" >> beam.Reshuffle()
                | "Match" >> fileio.MatchAll()
                # FileMetadata(path, size_in_bytes)
                | "ToRef" >> beam.ParDo(_FolderRefFn(self._root, self._max_file_bytes)).with_output_types(ImageRef)
                .with_outputs(REJECTED, main="refs")
            )
        return (
            pbegin
            | "Root" >> beam.Create([self._root])
            | "ListRoot" >> beam.ParDo(_ListRootFn())
            # class folder name (str) or Rejected (a root-level file or bad entry)
            | "Spread" >> beam.Reshuffle()
            | "Walk" >> beam.ParDo(_WalkClassFn(self._root, self._max_file_bytes)).with_output_types(ImageRef)
            .with_outputs(REJECTED, main="refs")
        )


class _ManifestRowFn(beam.DoFn):
    """Parses one manifest line and looks up the file's size (a missing file is rejected here)."""

    def __init__(self, manifest: str, header: Optional[str], columns: ManifestColumns, max_file_bytes: Optional[int],
                 stat: bool = True):
        self._manifest = manifest
        self._stat = stat
        self._header = header
        self._columns = columns
        self._max_file_bytes = max_file_bytes

    def setup(self):
        self._parse = refs_lib.csv_row_parser(self._header) if self._header is not None else refs_lib.parse_jsonl_line
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, line: bytes) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        out = assign_lib.manifest_row(line, self._parse, self._manifest, self._columns, self._max_file_bytes, self._stat)
        if out is not None:
            self._listed.inc()
            yield _tagged(out)


class ReadManifest(beam.PTransform):
    """Reads a CSV (with a header line) or JSONL manifest inside the pipeline.

    Each row needs a path (or uri) and a label; split and key are optional. Relative paths resolve
    against the manifest's folder. CSV fields must not contain line breaks. A local path is only
    stat-ed: a missing file, dangling symlink, FIFO or folder becomes a row (stage 'list').
    Input: the pipeline's begin (`p | ReadManifest(path, header=...)`).
    Outputs: 'refs' (ImageRef; declared features' values in its extras) and REJECTED (Rejected).

    Args:
      manifest: the .csv or .jsonl file.
      columns: the column names.
      max_file_bytes: files above this size become rows (stage 'read') at listing; None: no check.
      header: a CSV manifest's header line, read (and its columns checked) by the launcher
        (pipeline/checks.py), so that building the graph reads no file.
      stat: look up the size of rows whose size column is empty (one request per row on gs://);
        without it, a missing file is rejected when its shard reads it.
    """

    def __init__(self, manifest: str, columns: ManifestColumns = ManifestColumns(),
                 max_file_bytes: Optional[int] = None, header: Optional[str] = None, stat: bool = True):
        super().__init__()
        if not is_manifest(manifest):
            raise ValueError(f"ReadManifest: {manifest!r} is not a .csv or .jsonl manifest")
        if manifest.lower().endswith(".csv") and not header:
            raise ValueError(f"ReadManifest: {manifest!r} is a CSV manifest; pass its header line")
        _check_max_file_bytes("ReadManifest", max_file_bytes)
        self._manifest = manifest
        self._columns = columns
        self._max_file_bytes = max_file_bytes
        self._header = header
        self._stat = stat

    def expand(self, pbegin):
        is_csv = self._header is not None
        header = self._header
        return (
            pbegin
            # Bytes: a line that is not UTF-8 becomes a rejected row in manifest_row (the default
            # text coder would fail the whole pipeline on it).
            | "Lines" >> beam.io.ReadFromText(self._manifest, skip_header_lines=1 if is_csv else 0,
                                              coder=beam.coders.BytesCoder())
            | "ToRef" >> beam.ParDo(_ManifestRowFn(self._manifest, header, self._columns, self._max_file_bytes, self._stat))
            .with_output_types(ImageRef).with_outputs(REJECTED, main="refs")
        )


class _ListPartFn(beam.DoFn):
    """Lists one of a source's parts (Source.list_part) on a Beam worker."""

    def __init__(self, source, config, info):
        self._source = source
        self._config = config
        self._info = info
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, part) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        for item in self._source.list_part(self._config, self._info, part):
            self._listed.inc()
            yield _tagged(item)


class ListSource(beam.PTransform):
    """Lists any sources.Source inside the pipeline: its parts (Source.parts, as many as the
    launcher's cores would share) spread over the workers, each listed by Source.list_part. The
    build graph's listing for a source that brings no Beam transform of its own.
    Input: the pipeline's begin. Outputs: 'refs' (ImageRef) and REJECTED (Rejected).
    """

    def __init__(self, source, config, info):
        super().__init__()
        self._source = source
        self._config = config
        self._info = info

    def expand(self, pbegin):
        parts = list(self._source.parts(self._config, self._info, 0))
        return (pbegin
                | "Parts" >> beam.Create(parts, reshuffle=len(parts) > 1)
                | "List" >> beam.ParDo(_ListPartFn(self._source, self._config, self._info))
                .with_output_types(ImageRef).with_outputs(REJECTED, main="refs"))
