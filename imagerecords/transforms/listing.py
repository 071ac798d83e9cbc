"""ListImages and ReadManifest: inputs become ImageRefs (tiny records) or rejected rows."""

from __future__ import annotations

from typing import Iterable, Optional, Union

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystem import BeamIOError, FileMetadata
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from imagerecords import refs as refs_lib
from imagerecords.refs import ImageRef, ManifestColumns, Rejected
from imagerecords.transforms.common import METRICS_NAMESPACE, REJECTED

__all__ = ["ListImages", "ReadManifest", "is_manifest"]


def is_manifest(path: str) -> bool:
    return path.lower().endswith((".csv", ".jsonl", ".ndjson"))


class _FolderRefFn(beam.DoFn):
    def __init__(self, root: str):
        self._root = root.rstrip("/") + "/"
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, meta: FileMetadata) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        if refs_lib.is_hidden(meta.path, self._root):
            return
        self._listed.inc()
        ref, rejected = refs_lib.ref_from_folder_path(self._root, meta.path, meta.size_in_bytes)
        if rejected is not None:
            yield beam.pvalue.TaggedOutput(REJECTED, rejected)
        else:
            yield ref


class ListImages(beam.PTransform):
    """Lists every file under a class-folder root (`root/<label>/**/<file>`) as an ImageRef.

    Outputs: main (ImageRef, split not yet set) and REJECTED (Rejected).
    Hidden files and folders (name starting with '.') are not listed.
    """

    def __init__(self, root: str):
        super().__init__()
        if not root:
            raise ValueError("ListImages needs a root folder, got an empty path")
        self._root = root.rstrip("/")

    def expand(self, pbegin):
        return (
            pbegin
            | "Match" >> fileio.MatchFiles(self._root + "/**")
            # FileMetadata(path, size_in_bytes)
            | "ToRef" >> beam.ParDo(_FolderRefFn(self._root)).with_outputs(REJECTED, main="refs")
        )


class _ManifestRowFn(beam.DoFn):
    """Parses one manifest line and looks up the file's size (a missing file is rejected here)."""

    def __init__(self, manifest: str, header: Optional[str], columns: ManifestColumns):
        self._manifest = manifest
        self._header = header
        self._columns = columns
        self._base = refs_lib.dirname(manifest)

    def setup(self):
        self._parse = refs_lib.csv_row_parser(self._header) if self._header is not None else refs_lib.parse_jsonl_line
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, line: str) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        if not line.strip():
            return
        self._listed.inc()
        try:
            row = self._parse(line)
        except ValueError as e:
            yield beam.pvalue.TaggedOutput(REJECTED, Rejected(line, f"{self._manifest}: bad manifest line: {e}"))
            return
        ref, rejected = refs_lib.parse_manifest_row(row, self._base, self._columns)
        if rejected is not None:
            yield beam.pvalue.TaggedOutput(REJECTED, rejected)
            return
        try:
            found = [m for m in FileSystems.match([ref.uri])[0].metadata_list if m.path == ref.uri]
        except BeamIOError as e:
            found, error = [], e
        else:
            error = None
        if not found:
            reason = f"file not found ({error})" if error else "file not found"
            yield beam.pvalue.TaggedOutput(REJECTED, Rejected(ref.uri, reason, ref.key, ref.split))
            return
        yield ImageRef(ref.key, ref.uri, ref.label, ref.split, found[0].size_in_bytes)


def _read_header(path: str) -> str:
    """Reads the first line of a CSV manifest (only that line is read in the launcher)."""
    with FileSystems.open(path) as f:
        line = f.readline().decode("utf-8-sig").rstrip("\r\n")
    if not line:
        raise ValueError(f"{path}: the CSV manifest has no header line")
    return line


class ReadManifest(beam.PTransform):
    """Reads a CSV (with a header line) or JSONL manifest inside the pipeline.

    Each row needs a path (or uri) and a label; split and key are optional. Relative paths resolve
    against the manifest's folder. CSV fields must not contain line breaks.
    Outputs: main (ImageRef) and REJECTED (Rejected).
    """

    def __init__(self, manifest: str, columns: ManifestColumns = ManifestColumns()):
        super().__init__()
        if not is_manifest(manifest):
            raise ValueError(f"ReadManifest: {manifest!r} is not a .csv or .jsonl manifest")
        self._manifest = manifest
        self._columns = columns

    def expand(self, pbegin):
        is_csv = self._manifest.lower().endswith(".csv")
        header = _read_header(self._manifest) if is_csv else None
        if header is not None:
            fields = refs_lib.csv_row_parser(header)(header).keys()
            missing = [c for c in (self._columns.label,) if c not in fields]
            if self._columns.path not in fields and not (self._columns.path == "path" and "uri" in fields):
                missing.insert(0, self._columns.path)
            if missing:
                raise ValueError(f"{self._manifest}: the header has no column {', '.join(map(repr, missing))}")
        return (
            pbegin
            | "Lines" >> beam.io.ReadFromText(self._manifest, skip_header_lines=1 if is_csv else 0)
            | "ToRef" >> beam.ParDo(_ManifestRowFn(self._manifest, header, self._columns)).with_outputs(REJECTED, main="refs")
        )
