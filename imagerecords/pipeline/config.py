"""Build configuration: a frozen dataclass, filled from defaults, then a YAML preset, then flags."""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import numbers
import re
import typing
from typing import Any, Dict, List, Mapping, Optional, Tuple

from imagerecords.format import features as features_lib
from imagerecords.format import schema
from imagerecords.format import record_format
from imagerecords.format.manifest import VERSION_PREFIX
from imagerecords.format.paths import segment_problem
from imagerecords.format.record_format import is_shard_name
from imagerecords.pipeline import naming, storage
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode.image_codec import ImageOptions
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.refs import MAX_NAME_LENGTH, ManifestColumns, split_name_problem
from imagerecords.pipeline.read import download, optouts

WRITERS = ("shards", "beam")
NEAR_DUPLICATES = ("report", "off")
LABEL_TYPES = ("auto", "name", "int")
_NAME_RE = re.compile(r"[a-z][a-z0-9_]*")  # fullmatch: '$' also matches before a last '\n'
_VERSION_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# Files and folders the dataset folder itself holds: a version named so would shadow or be shadowed.
_RESERVED_NAMES = ("manifest.json", "errors.jsonl", "duplicates.jsonl", "dataset_info.json", "features.json",
                   "label.labels.txt", "index")


def version_name_problem(name: object) -> Optional[str]:
    """Why `name` cannot name a version folder (--version_name), or None when it can: one file-name-safe
    segment of letters, digits, '.', '_' and '-', not a name the dataset folder uses for its own files,
    and outside the 'v-' names of unnamed builds."""
    problem = segment_problem(name)
    if problem:
        return f"{name!r:.80} {problem}"
    if not _VERSION_NAME_RE.fullmatch(name):
        return f"{name!r:.80} must be 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit"
    if name.startswith(VERSION_PREFIX):
        return f"{name!r} starts with {VERSION_PREFIX!r}, which names unnamed builds' folders"
    if name in _RESERVED_NAMES or name.endswith(".labels.txt") or is_shard_name(name):
        return f"{name!r} is the name of a file the dataset folder holds"
    return None


def parse_splits(text: str) -> Tuple[Tuple[str, float], ...]:
    """Parses 'train=0.8,validation=0.2' into (('train', 0.8), ('validation', 0.2)).

    Raises:
      ValueError: naming the bad part when a part is malformed or the fractions do not sum to 1.
    """
    parts = []
    for part in text.split(","):
        name, sep, frac = part.strip().partition("=")
        if not sep or not name:
            raise ValueError(f"{setting('splits')}: {part!r} is not NAME=FRACTION")
        try:
            value = float(frac)
        except ValueError:
            raise ValueError(f"{setting('splits')}: {frac!r} in {part!r} is not a number") from None
        parts.append((name, value))
    return checked_splits(parts, f"{setting('splits')}", repr(text))


def checked_splits(pairs: Any, what: str = "splits", shown: Optional[str] = None) -> Tuple[Tuple[str, float], ...]:
    """(name, fraction) pairs checked as one set of splits: names that can name a split, each once;
    fractions that are numbers (not text, not bool) in (0, 1] summing to 1. `pairs` may be a
    mapping {name: fraction} or a sequence of (name, fraction) pairs, as build() takes them.

    Raises:
      ValueError: starting with `what`, naming the bad pair or the sum.
    """
    items = list(pairs.items()) if isinstance(pairs, Mapping) else pairs
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"{what}: expected {{name: fraction}} or [(name, fraction), ...], got {pairs!r:.80}")
    parts = []
    for item in items:
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], str)):
            raise ValueError(f"{what}: {item!r:.80} is not a (name, fraction) pair")
        name, value = item
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{what}: fraction of {name!r} must be a number, got {value!r:.80}")
        problem = split_name_problem(name)
        if problem:
            raise ValueError(f"{what}: {problem}")
        if not 0 < value <= 1:
            raise ValueError(f"{what}: fraction of {name!r} must be in (0, 1], got {value}")
        parts.append((name, float(value)))
    shown = shown or repr(pairs)
    names = [n for n, _ in parts]
    if len(set(names)) != len(names):
        raise ValueError(f"{what}: a split name repeats in {shown}")
    total = sum(v for _, v in parts)
    if abs(total - 1.0) > 1e-6:
        raise ValueError(f"{what}: fractions sum to {total:g}, not 1, in {shown}")
    return tuple(parts)



# Shards of one split, at most: the five digits of the shard numbering. A plan holds a boundary per
# shard and every shard is a file, so num_shards=10**9 on 40 images grew to 20 GB before this cap.
MAX_SHARDS = 99_999


_HTTP = download.HttpSettings()  # the download settings' defaults, spelled there


# Each concern's settings are a small frozen class that checks its own fields (`_problems`), and
# BuildConfig holds one of each as a field beside what is the build's own: a stage takes the concern
# it reads. The edges (build(), the flags, presets, the transforms' keywords) name settings flat,
# through one table, SETTINGS. Every setting's text is in BuildConfig's Attributes (the flags' help reads it).


def _raise_problems(problems: List[str]) -> None:
    if problems:
        raise ValueError("invalid build configuration: " + "; ".join(problems))


# Set while BuildConfig.of makes its concerns: BuildConfig checks them all together, in one message.
_TOGETHER = contextvars.ContextVar("imagerecords_config_together", default=False)


class _Concern:
    """A concern's settings check their own fields when made alone; BuildConfig checks them all
    together, with its own, in one message."""

    def __post_init__(self):
        if not _TOGETHER.get():
            _raise_problems(self._problems())

    def _problems(self) -> List[str]:
        return []


@naming.declare
@dataclasses.dataclass(frozen=True)
class InputColumns(_Concern):
    """Where a manifest's rows keep each image's path, label, split, key and size, and whether
    sizes are looked up."""

    path_column: str = "path"
    label_column: str = "label"
    split_column: str = "split"
    key_column: str = "key"
    size_column: str = "size"
    skip_stat: bool = False

    def _problems(self) -> List[str]:
        names = ("path_column", "label_column", "split_column", "key_column", "size_column")
        return [f"{name} must name a column, got an empty name" for name in names if getattr(self, name) == ""]

    def manifest_columns(self, features=()) -> ManifestColumns:
        """The column names a manifest input is read with (and the declared features' columns)."""
        return ManifestColumns(self.path_column, self.label_column, self.split_column, self.key_column,
                               self.size_column, tuple(features))


@naming.declare
@dataclasses.dataclass(frozen=True)
class LabelOptions(_Concern):
    """How labels become class ids: a fixed map, the label type and an offset."""

    label_map: Optional[str] = None
    label_type: str = "auto"
    label_offset: int = 0

    def _problems(self) -> List[str]:
        problems = []
        if self.label_type not in LABEL_TYPES:
            problems.append(f"label_type {self.label_type!r} is not one of {', '.join(LABEL_TYPES)}")
        if self.label_offset < 0:
            problems.append(f"label_offset must be >= 0, got {self.label_offset}")
        return problems


@naming.declare
@dataclasses.dataclass(frozen=True)
class SplitOptions(_Concern):
    """How keys are shuffled and assigned to splits: the two hash salts, the split fractions (one
    set, checked whole by checked_splits) and the names of splits a manifest column gives."""

    seed: int = 0
    splits: Optional[Tuple[Tuple[str, float], ...]] = None
    split_seed: int = 0
    split_names: Optional[Tuple[str, ...]] = None

    def _problems(self) -> List[str]:
        problems = []
        if self.splits is not None:
            try:
                checked_splits(self.splits)
            except ValueError as e:
                problems.append(str(e))
        for name in self.split_names or ():
            problem = split_name_problem(name) if isinstance(name, str) else f"{name!r:.80} is not a name"
            if problem:
                problems.append(f"split_names: {problem}")
        return problems


@naming.declare
@dataclasses.dataclass(frozen=True)
class ShardOptions(_Concern):
    """How many shards a split is cut into: a count, or a target size with a floor."""

    num_shards: Optional[int] = None
    target_shard_mb: float = 192.0
    min_shards: int = 8

    def _problems(self) -> List[str]:
        problems = []
        if self.num_shards is not None and not 1 <= self.num_shards <= MAX_SHARDS:
            problems.append(f"num_shards must be within 1..{MAX_SHARDS:,} (shards of one split), got {self.num_shards}")
        if not 1 <= self.min_shards <= MAX_SHARDS:
            problems.append(f"min_shards must be within 1..{MAX_SHARDS:,}, got {self.min_shards}")
        if self.target_shard_mb <= 0:
            problems.append(f"target_shard_mb must be > 0, got {self.target_shard_mb}")
        return problems


@naming.declare
@dataclasses.dataclass(frozen=True)
class DownloadOptions(_Concern):
    """How manifest rows that are http(s) URLs are downloaded by the shard writers (a worker's
    download.HttpSettings is made from these, the headers file read)."""

    http_workers: int = _HTTP.workers
    http_per_host: int = _HTTP.per_host
    http_timeout: float = _HTTP.timeout
    http_deadline: float = _HTTP.deadline
    http_retries: int = _HTTP.retries
    http_user_agent: str = ""
    http_headers: Optional[str] = None
    disallowed_header_directives: Tuple[str, ...] = optouts.DEFAULT_DIRECTIVES
    robots_txt: str = "obey"

    def http_settings(self) -> download.HttpSettings:
        """What a worker downloads with: these settings and the headers file's path (each worker
        reads the file; ManifestSource.check reads it first, in the launcher)."""
        return download.HttpSettings(workers=self.http_workers, per_host=self.http_per_host, timeout=self.http_timeout,
                                     deadline=self.http_deadline, retries=self.http_retries,
                                     user_agent=self.http_user_agent, headers_file=self.http_headers,
                                     optouts=optouts.OptOutSettings(optouts.normalized(self.disallowed_header_directives),
                                                                    self.robots_txt))

    def _problems(self) -> List[str]:
        problems = []
        for name in ("http_workers", "http_per_host"):
            if not 1 <= getattr(self, name) <= download.MAX_CONNECTIONS:
                problems.append(f"{name} must be within 1..{download.MAX_CONNECTIONS}, got {getattr(self, name)}")
        for name in ("http_timeout", "http_deadline"):
            if not 0 < getattr(self, name) <= download.MAX_SECONDS:
                problems.append(f"{name} must be > 0 and at most {download.MAX_SECONDS:g} seconds, "
                                f"got {getattr(self, name)}")
        if not 0 <= self.http_retries <= download.MAX_RETRIES:
            problems.append(f"http_retries must be within 0..{download.MAX_RETRIES}, got {self.http_retries}")
        if self.robots_txt not in optouts.ROBOTS_CHOICES:
            problems.append(f"robots_txt {self.robots_txt!r:.40} is not one of {', '.join(optouts.ROBOTS_CHOICES)}")
        directives = self.disallowed_header_directives
        if isinstance(directives, str) or not all(isinstance(d, str) for d in directives):
            problems.append(f"disallowed_header_directives must be a list of directives, got {directives!r:.80}")
        else:
            problems += [f"disallowed_header_directives: {p}" for p in map(optouts.directive_problem, directives) if p]
        return problems


@naming.declare
@dataclasses.dataclass(frozen=True)
class PublishOptions(_Concern):
    """How a build publishes into its output: replacing, appending or resuming, the versions kept
    and named, index files, the duplicate check, and the reject budget that fails a build."""

    skip_duplicate_check: bool = False
    near_duplicates: str = "report"
    max_reject_fraction: float = 0.01
    # Link rot is normal: a public URL list loses a few percent of its links within months, more every
    # year; 0.10 passes that while a manifest of mostly dead links (a wrong column, a host that is down
    # or blocks the crawler) still fails.
    max_download_failures: float = 0.10
    overwrite: bool = False
    write_index: bool = False
    keep_versions: int = 2
    resume: bool = False
    append: bool = False
    version_name: Optional[str] = None

    def _problems(self) -> List[str]:
        problems = []
        for name in ("max_reject_fraction", "max_download_failures"):
            if not 0 <= getattr(self, name) <= 1:
                problems.append(f"{name} must be within 0..1, got {getattr(self, name)}")
        if self.near_duplicates not in NEAR_DUPLICATES:
            problems.append(f"near_duplicates {self.near_duplicates!r} is not one of {', '.join(NEAR_DUPLICATES)}")
        if self.keep_versions < 1:
            problems.append(f"keep_versions must be >= 1, got {self.keep_versions}")
        if self.append and self.overwrite:
            problems.append(f"append and overwrite exclude each other: {setting('append')} adds to the published "
                            f"dataset, {setting('overwrite')} replaces it")
        if self.version_name is not None and version_name_problem(self.version_name):
            problems.append(f"version_name {version_name_problem(self.version_name)}")
        return problems


# BuildConfig's field for each concern, in the order the settings are listed (flags, to_json).
_CONCERN_FIELDS = (("columns", InputColumns), ("labels", LabelOptions), ("split", SplitOptions),
                   ("shards", ShardOptions), ("download", DownloadOptions), ("publish", PublishOptions))
CONCERNS = tuple(cls for _, cls in _CONCERN_FIELDS)
_OWN = ("input", "output", "name", "schema", "writer", "record_format", "threads", "features")


@dataclasses.dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Everything a build needs besides the Beam pipeline options: each concern's settings (the
    classes above, as the fields columns, labels, split, shards, download, publish and image) and
    the build's own; every setting's text is here, by its flat name (the flags' help reads it).
    Made from flat settings by BuildConfig.of or make_config, changed by replace.

    Attributes:
      input: a class-folder root (`root/<label>/**/<image>`) or a .csv / .jsonl manifest; local path
        or any Beam FileSystems URI (gs://, s3://).
      output: output folder (local or FileSystems URI).
      name: dataset name, the prefix of every shard file (lowercase, digits, underscores).
      schema: feature keys of each record: 'tfds' (the keys TFDS reads, with its dataset_info.json)
        or 'tf-models' (the keys of Model Garden's ImageNet input pipeline).
      seed: salt of the shuffle hash; same seed and input give the same bytes.
      splits: split names and the fraction of images each gets, assigned by a salted hash of each
        key; when not set, the manifest's split column decides (or everything goes to 'train').
      split_seed: salt of the split hash, separate from `seed` so reshuffling keeps the splits.
      split_names: split names known up front; only `writer` 'beam' needs them (one write per
        split), and only when splits come from a manifest column.
      num_shards: shards per split; when not set, picked from `target_shard_mb` and `min_shards`.
      target_shard_mb: wanted shard size in MB (input bytes) when `num_shards` is not set.
      min_shards: the fewest shards per split when automatic (capped at the split's image count),
        so small datasets still keep every worker and reader busy.
      image: how images are decoded, resized and encoded.
      writer: 'shards' (reproducible per-shard streaming writer) or 'beam' (Beam's own TFRecord sink).
      record_format: the shard files' format: 'tfrecord' (tf.data, TFDS, DALI) or 'array_record'
        (Grain's and TFDS's random-access format; docs/formats.md).
      label_map: optional file fixing label ids: a .txt with one name per line (id = line number)
        or a .json object {name: id}.
      label_type: 'name' (sorted vocabulary), 'int' (labels are ids already) or 'auto' (int when
        every label is an integer, else name).
      label_offset: added to every label id (1 for ImageNet-style background at 0).
      path_column: manifest column with each image's path (absolute, or relative to the manifest's
        folder) or URI; with the default 'path', a row without one falls back to its 'uri' column.
      label_column: manifest column with each image's label (a class name, or an id with
        `label_type` int).
      split_column: manifest column with each image's split name; rows without one go to 'train'.
      key_column: manifest column with each image's unique id, which the shuffle and split hashes
        use; rows without one are keyed by their path.
      size_column: manifest column with each file's size in bytes; rows that give it are not
        stat-ed (one request per image on gs://).
      skip_duplicate_check: do not look for written images whose files hold identical bytes
        (duplicates.jsonl; the check moves a 16-byte digest and the key of every image).
      near_duplicates: 'report' (each image's 64-bit perceptual hash is kept in hashes/<shard>.txt and
        groups of images within 8 bits of each other, resized, recompressed or slightly cropped copies,
        are duplicates.jsonl rows of kind "near", flagged when they cross splits or labels disagree)
        or 'off'.
      skip_stat: do not look up the size of manifest rows without a size (missing files are then
        rejected when read, and the automatic shard count only knows the sizes given).
      max_reject_fraction: the build fails (nothing published) when more than this fraction of
        listed inputs is rejected, URLs that fail to download aside (`max_download_failures`);
        every reject is in errors.jsonl either way.
      max_download_failures: the build fails (nothing published) when more than this fraction of
        its inputs are URLs that could not be downloaded (a 404, a timeout: link rot, normal on the
        web), or than `max_reject_fraction` when that is larger; with --append, of the dataset's
        records and this build's inputs together, so retrying the URLs that failed passes while
        some stay dead.
      threads: image threads inside each shard writer (the local engine's worker processes: for
        URL rows; for files they keep 2, enough to keep a core busy).
      http_workers: downloads at once per worker process, for manifest rows that are http(s) URLs (each
        shard writer fetches with its `threads` image threads: the smaller bound wins).
      http_per_host: requests at once to one host for the whole build: shared by the local engine's
        workers, divided among a Beam job's shard writers (read/politeness.py).
      http_timeout: seconds to connect to a server, and to wait for its next byte.
      http_deadline: seconds one URL may take in all (retries, redirects, status line, headers and
        body included; waiting for a worker or per-host slot not); a server that drips its headers or
        body is cut off then.
      http_retries: further tries of a URL after a broken connection, a timeout or HTTP 429/500/502/503/504, with
        exponential backoff and jitter (a Retry-After is honoured up to 60 s).
      http_user_agent: the User-Agent of downloads; the default names the tool, where its opt-out rules
        are documented and its robots.txt token; give your own with a URL or e-mail a site owner can
        reach (Beam has a --user_agent of its own).
      disallowed_header_directives: X-Robots-Tag directives (for every agent, or addressed to
        `imagerecords:`) that keep a URL out of the dataset before its body is read, img2dataset's set by
        default; `tdm-reservation: 1` is obeyed with them; empty turns both off. Such URLs are
        errors.jsonl rows of stage opted_out, outside every reject budget.
      robots_txt: 'obey' (each origin's robots.txt, read once per worker process, decides for the
        token imagerecords; one that answers 5xx or times out disallows its site for the build, a 4xx
        allows it) or 'ignore'.
      http_headers: a file of request headers for downloads, one `Name: value` per line (a token);
        never logged, and written into no file of the output; its path travels to the workers, which
        read it (on a cluster: a path every worker reads, such as gs://...).
      overwrite: allow replacing a dataset this tool wrote earlier in `output`.
      write_index: also write `index/<shard>.idx` (tfrecord2idx: offset and frame length per
        record) for DALI and the PyTorch tfrecord package.
      keep_versions: published versions kept in `output`, the new one included: a reader that
        loaded an older manifest reads its files until they fall out of this count.
      resume: reuse the complete shards a killed or failed build of the same inputs and settings
        staged in `output` (each checked by its fingerprint) and write only the rest.
      features: declared features beyond the image and its class (imagerecords.format.features),
        each fed by the manifest column of its name (or its `column`).
      append: add the inputs that the published dataset in `output` does not hold yet as new shards
        of a new version that also lists the old shards (shared, not copied); keys already there are
        duplicates.jsonl rows, changed ones errors.jsonl rows.
      version_name: the name of the version folder the build publishes into, instead of
        v-<build id>: a path a training config can hold (letters, digits, '.', '_', '-'); refused
        if the output already holds that version (versions are never rewritten).
    """

    input: Optional[str]
    output: str
    name: str = "images"
    schema: str = "tfds"
    image: ImageOptions = ImageOptions()
    writer: str = "shards"
    record_format: str = "tfrecord"
    threads: int = 4
    features: Tuple[features_lib.Feature, ...] = ()
    columns: InputColumns = InputColumns()
    labels: LabelOptions = LabelOptions()
    split: SplitOptions = SplitOptions()
    shards: ShardOptions = ShardOptions()
    download: DownloadOptions = DownloadOptions()
    publish: PublishOptions = PublishOptions()

    def __post_init__(self):
        problems = []
        taken = {getattr(schema.keys(self.schema), k) for k in ("image", "label", "filename", "height", "width",
                                                                 "image_format", "label_text")
                 if self.schema in schema.PRESETS} - {None}
        for f in self.features:
            if f.name in taken:
                problems.append(f"feature {f.name!r}: the {self.schema} schema stores this key itself")
        if self.features and self.writer == "beam":
            problems.append(f"{setting('writer', 'beam')} does not write declared features; use the default writer (shards)")
        if self.image.image_encoding == "raw" and self.writer == "beam":
            problems.append(f"{setting('writer', 'beam')} does not write {setting('image_encoding', 'raw')}; use the default writer (shards)")
        sources = [f.source for f in self.features]
        for column in sorted({c for c in sources if sources.count(c) > 1}):
            problems.append(f"features: column {column!r} feeds more than one feature")
        if self.input == "":  # None: a pipeline's own rows (WriteDataset), which have no path
            problems.append("input is required")
        if not self.output:
            problems.append("output is required")
        if not _NAME_RE.fullmatch(self.name) or len(self.name) > MAX_NAME_LENGTH:
            problems.append(f"name {self.name[:80]!r} must match {_NAME_RE.pattern}, at most {MAX_NAME_LENGTH} "
                            "characters (it begins every shard file name)")
        if self.schema not in schema.PRESETS:
            problems.append(f"schema {self.schema!r} is not one of {', '.join(schema.PRESETS)}")
        problems += self.shards._problems()
        if self.writer not in WRITERS:
            problems.append(f"writer {self.writer!r} is not one of {', '.join(WRITERS)}")
        problems += self._format_problems()
        problems += self.labels._problems()
        if self.schema == "tfds" and self.labels.label_offset != 0:
            problems.append("label_offset must be 0 with schema 'tfds' (TFDS ClassLabel ids start at 0); "
                            "use schema 'tf-models' for ImageNet-style offsets")
        if self.threads < 1:
            problems.append(f"threads must be >= 1, got {self.threads}")
        problems += self.columns._problems() + self.split._problems() + self.download._problems()
        problems += self.publish._problems()
        if self.publish.append and self.writer == "beam":
            problems.append(f"{setting('append')} needs {setting('writer', 'shards')}")
        if self.publish.write_index and self.writer == "beam":
            problems.append(f"{setting('write_index')} needs {setting('writer', 'shards')} (the Beam sink reports no "
                            "record offsets)")
        if self.publish.resume and self.writer == "beam":
            problems.append(f"{setting('resume')} needs {setting('writer', 'shards')} (the Beam sink's shards have no "
                            "fingerprints)")
        _raise_problems(problems)

    @classmethod
    def of(cls, **settings: Any) -> "BuildConfig":
        """The config of flat settings (SETTINGS' names; `image` or the image settings by name),
        checked together in one message; make_config also merges layers and parses text."""
        image = settings.pop("image", None)
        by_field: Dict[str, Dict[str, Any]] = {}
        own: Dict[str, Any] = {}
        for name, value in settings.items():
            where = SETTINGS.get(name)
            if where is None:
                raise ValueError(f"unknown setting(s) {name}")
            if where:
                by_field.setdefault(where, {})[name] = value
            else:
                own[name] = value
        if image is not None and "image" in by_field:
            raise ValueError("give `image` or the image settings by name, not both")
        token = _TOGETHER.set(True)
        try:
            made = {attr: concern(**by_field.get(attr, {})) for attr, concern in _CONCERN_FIELDS}
            made["image"] = image if image is not None else ImageOptions(**by_field.get("image", {}))
        finally:
            _TOGETHER.reset(token)
        return cls(**own, **made)

    def replace(self, **settings: Any) -> "BuildConfig":
        """This config with the flat settings given changed (None sets a setting to None)."""
        return BuildConfig.of(**dict(self.flat(), **settings))

    def flat(self) -> Dict[str, Any]:
        """Every setting by its flat name (the image's included), in the order the flags list them."""
        out: Dict[str, Any] = {}
        for attr, _ in _CONCERN_FIELDS:
            concern = getattr(self, attr)
            out.update((f.name, getattr(concern, f.name)) for f in dataclasses.fields(concern))
        out.update((name, getattr(self, name)) for name in _OWN)
        out.update((f.name, getattr(self.image, f.name)) for f in dataclasses.fields(self.image))
        return out

    def _format_problems(self) -> List[str]:
        try:
            fmt = record_format.get(self.record_format)
        except record_format.UnknownFormat as e:
            return [str(e)]
        problems = []
        if self.publish.write_index and not fmt.index_files:
            problems.append(f"{setting('write_index')} writes index files, and {fmt.name} files carry their own "
                            f"index: leave {setting('write_index')} out with {setting('record_format', fmt.name)}")
        if self.writer == "beam" and fmt is not record_format.TFRECORD:
            problems.append(f"{setting('writer', 'beam')} writes TFRecord only; use the default writer (shards) "
                            f"with {setting('record_format', fmt.name)}")
        return problems

    def manifest_columns(self, features=None) -> ManifestColumns:
        """The column names a manifest input is read with, the declared features' columns with them."""
        return self.columns.manifest_columns(self.features if features is None else features)

    def to_json(self) -> Dict[str, Any]:
        """Returns the parameters recorded in manifest.json (paths excluded: they vary by machine)."""
        d: Dict[str, Any] = {}
        for attr, _ in _CONCERN_FIELDS:  # flat, in the order of the settings that BuildConfig inherited once
            d.update(dataclasses.asdict(getattr(self, attr)))
        d.update(input=self.input, output=self.output, name=self.name, schema=self.schema,
                 image=dataclasses.asdict(self.image), writer=self.writer, record_format=self.record_format,
                 threads=self.threads, features=self.features)
        # How inputs are fetched shapes no byte (and the headers file may name a secret): not recorded.
        for k in ("input", "output", "overwrite", "keep_versions", "resume", "features", "append",
                  "version_name", *HTTP_FIELDS):
            d.pop(k)
        if self.features:  # manifest.json's "features" is the spec; here only what feeds it
            d["features"] = features_lib.specs_to_json(self.features)
        elif _is_arrays(self.input):  # an arrays input's spec comes from its arrays
            d["features"] = arrays.manifest_features(self)
            d["features_only"] = True
        d["splits"] = dict(self.split.splits) if self.split.splits else None
        if self.publish.near_duplicates == PublishOptions.near_duplicates:
            del d["near_duplicates"]  # a default build's manifest keeps the bytes it had before the setting
        if self.record_format == record_format.DEFAULT:
            del d["record_format"]  # a TFRecord build's manifest keeps the bytes it had before the setting
        if self.publish.max_download_failures == PublishOptions.max_download_failures:
            del d["max_download_failures"]  # a default build's manifest keeps the bytes it had before the setting
        if self.image.image_encoding == "jpeg":
            del d["image"]["image_encoding"]  # a default build's manifest keeps the bytes it had before the setting
            if not any(f.dtype == "image" and f.encoding != "jpeg" for f in self.features or ()):
                del d["image"]["png_level"]  # writes no PNG: the level shapes no byte
        if "png_level" in d["image"]:
            d["image"]["png_writer"] = codec.PNG_WRITER  # the level's bytes depend on the writer too
        return d


HTTP_FIELDS = tuple(f.name for f in dataclasses.fields(DownloadOptions))
# The one table of flat setting names: where each lives in a BuildConfig (a concern's field, "image",
# or "" for the build's own), in the order the flags list them.
SETTINGS: Dict[str, str] = {
    **{f.name: attr for attr, concern in _CONCERN_FIELDS for f in dataclasses.fields(concern)},
    **{name: "" for name in _OWN},
    **{f.name: "image" for f in dataclasses.fields(ImageOptions)},
}


def field_docs(cls: type) -> Dict[str, str]:
    """Returns {field name: text} from the `Attributes:` section of a dataclass docstring.

    An entry starts with `name: text` (or `a, b, c: text`, shared by several fields) one indent
    below `Attributes:`; deeper-indented lines continue it. Whitespace is collapsed to one space.
    """
    lines = (cls.__doc__ or "").expandtabs().splitlines()
    docs: Dict[str, str] = {}
    current: List[str] = []
    entry_indent = None
    in_section = False
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not in_section:
            in_section = stripped == "Attributes:"
            continue
        if not stripped:
            continue
        if entry_indent is None:
            entry_indent = indent
        if indent < entry_indent:
            break  # the next section (or the end of the docstring)
        if indent == entry_indent:
            names, sep, text = stripped.partition(":")
            if not sep:
                break
            current = [n.strip() for n in names.split(",")]
            for name in current:
                docs[name] = text.strip()
        else:
            for name in current:
                docs[name] = f"{docs[name]} {stripped}".strip()
    return docs


_IMAGE_FIELDS = {f.name for f in dataclasses.fields(ImageOptions)}


def defaults() -> Dict[str, Any]:
    """Every setting's default by its flat name (input and output, which have none, aside)."""
    out = {}
    for cls in (*CONCERNS, BuildConfig, ImageOptions):
        for f in dataclasses.fields(cls):
            if f.name in SETTINGS and f.name not in ("input", "output"):
                out[f.name] = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    return out

_BUILD_FIELDS = set(SETTINGS) - _IMAGE_FIELDS


def load_preset(path: str) -> Tuple[Dict[str, Any], List[str]]:
    """Reads a YAML preset into (build settings, Beam args).

    The file holds build settings at the top level and Beam pipeline options under
    `beam_options:` (a mapping; `true` becomes a bare flag).

    Raises:
      ValueError: naming the file and the unknown key.
    """
    import yaml  # only for config files: a build without one never imports it

    data = yaml.safe_load(storage.read_bytes(path).decode("utf-8")) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: a preset must be a mapping of settings")
    beam = data.pop("beam_options", None) or {}
    unknown = sorted(set(data) - _BUILD_FIELDS - _IMAGE_FIELDS)
    if unknown:
        raise ValueError(f"{path}: unknown setting(s) {', '.join(unknown)}")
    beam_args = []
    for key, value in beam.items():
        if value is True:
            beam_args.append(f"--{key}")
        elif value is not False and value is not None:
            beam_args.append(f"--{key}={value}")
    return dict(data), beam_args


def _is_arrays(path: Any) -> bool:
    return isinstance(path, str) and arrays.is_arrays_input(path)


@functools.lru_cache(maxsize=None)
def _setting_types() -> Dict[str, Any]:
    """{setting: its type, Optional unwrapped} of BuildConfig's and ImageOptions' fields, read once."""
    hints = {name: tp for cls in (*CONCERNS, BuildConfig, ImageOptions) for name, tp in typing.get_type_hints(cls).items()
             if name in SETTINGS}
    for name, tp in hints.items():
        if typing.get_origin(tp) is typing.Union:
            hints[name] = next((a for a in typing.get_args(tp) if a is not type(None)), tp)
    return hints


def check_setting_types(settings: Dict[str, Any]) -> None:
    """Refuses a value whose type cannot be the setting's (a string or True for a number, 1.0 for an
    integer seed), in place turning integral and real numbers (np.int64) into int and float; before
    BuildConfig compares them (the wrong types would raise TypeError there, or build other bytes
    than the manifest records). The one check of build(), the flags, presets and the transforms."""
    hints = _setting_types()
    for name, value in settings.items():
        if value is None or name not in hints:
            continue  # unset, or unknown: make_config names an unknown setting
        tp = hints[name]
        if tp is bool:
            ok = isinstance(value, bool)
        elif tp is int:
            ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
        elif tp is float:
            ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
        elif tp is str:
            ok = isinstance(value, str)
        else:
            continue  # splits, features, lists of names: make_config parses and checks them
        if not ok:
            raise ValueError(f"{name} must be {getattr(tp, '__name__', tp)}, got {value!r:.80}")
        if tp is int:
            settings[name] = int(value)
        elif tp is float:
            settings[name] = float(value)


def make_config(*layers: Mapping[str, Any]) -> BuildConfig:
    """Merges setting layers (later wins, None means unset) into a validated BuildConfig."""
    merged: Dict[str, Any] = {}
    for layer in layers:
        merged.update({k: v for k, v in layer.items() if v is not None})
    if "image_encoding" not in merged and _is_arrays(merged.get("input")):
        merged["image_encoding"] = "png"  # a uint8 image array is stored losslessly unless JPEG is asked for
    check_setting_types(merged)
    image = ImageOptions(**{k: merged.pop(k) for k in list(merged) if k in _IMAGE_FIELDS})
    if isinstance(merged.get("features"), Mapping):
        merged["features"] = features_lib.parse_declarations(merged["features"])
    if isinstance(merged.get("splits"), str):
        merged["splits"] = parse_splits(merged["splits"])
    elif merged.get("splits") is not None:  # a mapping or pairs (build(), presets, the transforms)
        merged["splits"] = checked_splits(merged["splits"])
    unknown = sorted(set(merged) - _BUILD_FIELDS)
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)}")
    return BuildConfig.of(image=image, **merged)

