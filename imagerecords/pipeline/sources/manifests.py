"""Manifest inputs (.csv, .jsonl): the check of the manifest's head, and its listing in byte ranges
(one per worker task; Beam reads it with ReadManifest), each row parsed by assign_lib.manifest_row."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import json
import os
from typing import IO, Iterable, Iterator, List, Optional, Sequence, Tuple

from imagerecords.format.paths import has_scheme
from imagerecords.pipeline import storage
from imagerecords.pipeline.errors import InputError, UsageError
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.read import download, input_files, politeness
from imagerecords.pipeline.sources.base import InputInfo, Listed, Source
from imagerecords.pipeline.sources.base import first_line as _first_line

_MAX_HEAD_LINES = 1000  # lines read to find a manifest's first row (blank lines are skipped)
# A manifest is listed in parts of about this many bytes (some 15,000 rows), one per task.
MANIFEST_PART_BYTES = 1 << 20

Part = Tuple[int, Optional[int]]  # a byte range [start, end) of whole lines


class ManifestSource(Source):
    """A .csv or .jsonl file listing each image's path and label (and any declared feature)."""

    kind = "manifest"

    def __init__(self, http: download.HttpSettings = download.HttpSettings()):
        self._http = http  # how rows that are http(s) URLs are downloaded (by the shard writers)
        self._hosts: Optional[download.HostSlots] = None  # the per-host limit the launcher shares

    def claims(self, path: str) -> bool:
        return _manifest_kind(path) is not None

    def bind(self, config) -> "ManifestSource":
        return ManifestSource.downloading(config.download)

    @classmethod
    def downloading(cls, download_options) -> "ManifestSource":
        """The source whose shard writers download URL rows as `download_options` (a DownloadOptions) say."""
        return cls(download_options.http_settings())

    def reader(self, options):
        return download.reader(self._http, options.max_file_bytes, input_files.limited_reader(options), self._hosts)

    def shared_by(self, downloaders: int) -> "ManifestSource":
        slots, duty = politeness.share(self._http.per_host, downloaders)
        return ManifestSource(dataclasses.replace(self._http, per_host=slots, duty=duty))

    def prepare(self, config) -> None:
        # The local engine's worker processes inherit this: --http_per_host then holds across them.
        self._hosts = download.HostSlots(self._http.per_host)

    def check(self, config, *, ignore_split_column: bool = False) -> InputInfo:
        path = config.input
        try:
            check_http(config.download)
        except ValueError as e:
            raise UsageError(str(e)) from None
        info = read_manifest_head(path)
        if info.kind == "csv":
            _check_csv_columns(config, info)
        if config.columns.size_column not in info.columns:
            # No size column: every size is a stat, which URL rows and --skip_stat do not make.
            info = dataclasses.replace(info, sizes_known=not config.columns.skip_stat and not self.downloads(config, info))
        if config.split.splits and config.columns.split_column in info.columns and not ignore_split_column:
            raise UsageError(f"{setting('splits')} would replace the '{config.columns.split_column}' column of {path}: drop {setting('splits')} "
                             f"to keep the manifest's splits, or add {setting('ignore_split_column')} to reassign every row by hash")
        return info

    def downloads(self, config, info: InputInfo) -> bool:
        """Its rows are URLs: the first row's path is one (a manifest is read as its first row says)."""
        first_path = refs_lib.row_path(dict(info.first_row), config.manifest_columns())
        return isinstance(first_path, str) and download.is_url(first_path)

    def parts(self, config, info: InputInfo, workers: int) -> Sequence[Part]:
        if not workers:
            return [(0, None)]
        parts = max(4 * workers, os.path.getsize(config.input) // MANIFEST_PART_BYTES)
        return _line_ranges(config.input, info.header is not None, parts)

    def list_part(self, config, info: InputInfo, part: Part) -> Iterable[Listed]:
        header = info.header
        columns = config.manifest_columns()
        parse = refs_lib.csv_row_parser(header) if header is not None else refs_lib.parse_jsonl_line
        rows = (assign_lib.manifest_row(line, parse, config.input, columns, config.image.max_file_bytes,
                                    stat=not config.columns.skip_stat)
                for line in _manifest_lines(config.input, header is not None, *part))
        return (row for row in rows if row is not None)

    def beam_listing(self, config, info: InputInfo, transforms):
        return transforms.ReadManifest(config.input, config.manifest_columns(), config.image.max_file_bytes, info.header,
                            stat=not config.columns.skip_stat)


def check_http(options) -> None:
    """The user agent and the headers file of `options` (a DownloadOptions), checked as the workers
    will use them, before the engine starts: raises ValueError naming the setting, never a value."""
    download.check_user_agent(options.http_user_agent)
    if options.http_headers:
        try:
            download.read_headers(options.http_headers)
        except OSError as e:
            raise ValueError(f"{setting('http_headers', options.http_headers)}: cannot read it "
                             f"({storage.os_reason(e)})") from None


def _manifest_lines(path: str, csv: bool, start: int = 0, end: Optional[int] = None) -> Iterator[bytes]:
    """The manifest's lines as Beam's ReadFromText gives them with a bytes coder: split at '\\n',
    one trailing '\\r' dropped, a CSV's header line skipped (assign_lib.manifest_row decodes them).
    With `start`/`end` (byte offsets at line starts, from _line_ranges), only the lines that start
    in [start, end)."""
    with storage.open_read(path) as f:
        if start:
            f.seek(start)
        elif csv:
            f.readline()
        position = f.tell()
        for raw in f:
            if end is not None and position >= end:
                return
            position += len(raw)
            line = raw[:-1] if raw.endswith(b"\n") else raw
            if line.endswith(b"\r"):
                line = line[:-1]
            yield line


def _line_ranges(path: str, csv: bool, parts: int) -> List[Part]:
    """Cuts the manifest into at most `parts` byte ranges that begin at line starts (after a CSV's
    header): together they hold every line once, in order."""
    size = os.path.getsize(path)
    with storage.open_read(path) as f:
        first = len(f.readline()) if csv else 0
        starts = [first]
        for i in range(1, parts):
            target = first + (size - first) * i // parts
            if target <= starts[-1]:
                continue
            f.seek(target - 1)
            f.readline()  # on to the start of the next line (target - 1: a line starting at target stays)
            if f.tell() >= size:
                break
            if f.tell() > starts[-1]:
                starts.append(f.tell())
    return [(a, b) for a, b in zip(starts, starts[1:] + [None])]


def _manifest_kind(path: str) -> Optional[str]:
    lower = path.lower()
    if lower.endswith(".csv"):
        return "csv"
    if lower.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    return None



@contextlib.contextmanager
def _open_input(path: str) -> Iterator[IO[bytes]]:
    """Opens a manifest for reading, turning every failure into an InputError naming it."""
    if has_scheme(path):
        # Beam: 1.2 s to import; only a gs:// (or other remote) path needs its file systems
        from apache_beam.io.filesystem import BeamIOError
        from apache_beam.io.filesystems import FileSystems

        try:
            found = FileSystems.match([path], limits=[1])[0].metadata_list
        except BeamIOError as e:
            raise InputError(f"{setting('input', path)}: cannot read it ({_first_line(e)})") from None
        if not found or found[0].path.rstrip("/") != path.rstrip("/"):
            raise InputError(f"{setting('input', path)}: no such file")
        try:
            f = storage.open_read(path)
        except (BeamIOError, OSError) as e:
            raise InputError(f"{setting('input', path)}: cannot read it ({_first_line(e)})") from None
    else:
        if os.path.isdir(path):
            raise InputError(f"{setting('input', path)}: is a folder named like a manifest; give the .csv/.jsonl file, "
                             "or rename the folder")
        try:
            f = storage.open_read(path)
        except FileNotFoundError:
            raise InputError(f"{setting('input', path)}: no such file") from None
        except OSError as e:
            raise InputError(f"{setting('input', path)}: cannot read it ({e.strerror or e})") from None
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
            raise InputError(f"{setting('input', path)}: line {i + 1} is not UTF-8 text ({e.reason}); "
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
        raise InputError(f"{setting('input', path)}: the manifest is empty; it needs "
                         + ("a header line (path,label) and one line per image" if kind == "csv"
                            else "one JSON object per line, such as {\"path\": ..., \"label\": ...}"))
    if kind == "csv":
        header = lines[0]
        try:
            columns = tuple(c.strip() for c in next(csv.reader([header])))
        except csv.Error as e:
            raise InputError(f"{setting('input', path)}: the CSV header is not a CSV line ({e})") from None
        if len(lines) < 2:
            raise InputError(f"{setting('input', path)}: the CSV manifest has a header ({header}) but no rows")
        try:
            first = dict(zip(columns, next(csv.reader([lines[1]]))))
        except csv.Error:
            first = {}  # the build rejects that line, naming it
        return InputInfo("csv", columns, header, first_row=_texts(first))
    while True:
        try:
            row = json.loads(lines[0])
            break
        except RecursionError:  # a row too deep to parse: the build rejects it; the next rows name the columns
            lines = lines[1:]
            if not lines:
                raise InputError(f"{setting('input', path)}: no row of the manifest's start can be read: each holds "
                                 "a JSON value nested deeper than the parser's limit") from None
        except ValueError as e:
            raise InputError(f"{setting('input', path)}: the first row is not JSON ({e})") from None
    if not isinstance(row, dict):
        raise InputError(f"{setting('input', path)}: the first row is not a JSON object; each line must be one, "
                         "such as {\"path\": ..., \"label\": ...}")
    columns = dict.fromkeys(_printable(k) for k in row)
    for line in lines[1:]:  # rows may differ in their keys: the columns seen in the first rows
        try:
            later = json.loads(line)
        except (ValueError, RecursionError):
            continue  # the build rejects that row, naming the line
        if isinstance(later, dict):
            columns.update(dict.fromkeys(_printable(k) for k in later))
    return InputInfo("jsonl", tuple(columns), first_row=_texts(row))


def _texts(row) -> Tuple[Tuple[str, str], ...]:
    return tuple((str(k), v) for k, v in row.items() if isinstance(v, str))


def _printable(name: str) -> str:
    """A JSONL key as the summary prints it: a lone surrogate (a \\ud800 escape) as its escape."""
    return str(name).encode("utf-8", "backslashreplace").decode("utf-8")


JSONL_COLUMN_ROWS = 1000  # the rows whose keys name a JSONL manifest's columns (see ignored_columns)


def ignored_columns(config, info: InputInfo) -> Tuple[str, ...]:
    """The manifest's columns that no setting or feature reads (JSONL: of its first rows)."""
    used = set(config.manifest_columns().used())
    return tuple(c for c in info.columns if c not in used)


def _check_csv_columns(config, info: InputInfo) -> None:
    columns = set(info.columns)
    listed = ", ".join(info.columns)
    path_ok = config.columns.path_column in columns or (config.columns.path_column == "path" and "uri" in columns)
    if not path_ok:
        also = " (or 'uri')" if config.columns.path_column == "path" else ""
        raise InputError(f"{setting('input', config.input)}: the CSV header has no '{config.columns.path_column}'{also} column "
                         f"(columns: {listed}); name the image path column with {setting('path_column')}")
    if config.columns.label_column not in columns:
        raise InputError(f"{setting('input', config.input)}: the CSV header has no '{config.columns.label_column}' column "
                         f"(columns: {listed}); name the label column with {setting('label_column')}")
