"""manifest.json as a typed contract: what the builder publishes and every reader of it relies on."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import features as features_lib
from imagerecords.format import record_format
from imagerecords.format import schema as schema_lib
from imagerecords.format.paths import join
from imagerecords.format.errors import ManifestError, NotPublished
from imagerecords.format.shards import Shard, ShardColumns, check_inside, count_problem

MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
DUPLICATES = "duplicates.jsonl"
# Version 2: seed/name/schema are no longer repeated under `parameters`; `num_skipped` was added.
# Version 1 manifests still read (the missing fields take their defaults).
FORMAT_VERSION = 2
# Version 3: a split of COLUMNS_FROM shards or more holds its shards as columns and keeps their
# label histograms in a side file (Split.side); written only then, so smaller builds keep version 2.
COLUMNS_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
# Below this many shards a split keeps one row per shard (every build the golden pins cover). A row
# with ImageNet's histogram is ~18 KB (docs/scale.md): 1,000 rows load in ~1 s, 5,730 (10M images)
# took 27 s; at 1B images (572,917 shards) rows would be ~10 GB of JSON, columns are 58 MB.
COLUMNS_FROM = 1_000
SHARDS_SUFFIX = ".shards.jsonl"  # <version>/<split>.shards.jsonl: a columnar split's per-shard histograms
# The largest manifest.json `load` reads; a larger file is refused by its size, before a byte is read
# (it was read whole, then decoded, then parsed: several times its size in memory). Columns give a 1B-image
# build 58 MB (docs/scale.md), a million class names of 255 bytes are 0.26 GB (twice with a class_list
# feature), a row-form manifest of 100M images (format 2, still read) ~1.06 GB: docs/reader.md.
MAX_MANIFEST_BYTES = 1 << 30

# Names inside an output folder that belong to the publish protocol (imagerecords.pipeline.publish.commit). They
# live here, in a module without Beam or TensorFlow, so the reader can name them in its errors.
STAGING = ".imagerecords-staging"  # one folder per build inside, named by its build id
# Each published build's shards live in a folder of their own, `v-<build id>`: a rebuild never
# writes over a file that a loaded manifest points at.
VERSION_PREFIX = "v-"
FLAT_LAYOUT = "."  # in previous_versions: a dataset whose shards lie directly in the folder
LOCK = ".imagerecords.lock"


@dataclasses.dataclass(frozen=True)
class SideFile:
    """Where a columnar split keeps what its columns leave out, and what the split sums of it.

    Attributes:
      filename: the side file (relative to the dataset folder), `<version>/<split>.shards.jsonl`:
        one JSON line per shard, {index, labels, passthrough[, image_kinds]}.
      sha256: its hex digest; whoever loads it refuses other bytes.
      labels: ((label id, records), ...) summed over the split's shards, sorted by id.
      image_kinds: ((kind, records), ...) summed likewise (empty for 'jpeg' builds).
      passthrough: records stored as their source bytes, summed likewise.
    """

    filename: str
    sha256: str
    labels: Tuple[Tuple[int, int], ...] = ()
    image_kinds: Tuple[Tuple[str, int], ...] = ()
    passthrough: int = 0


def _side_row(shard: "Shard") -> bytes:
    row = {"index": shard.index, "labels": {str(k): v for k, v in shard.labels}, "passthrough": shard.passthrough}
    if shard.image_kinds:
        row["image_kinds"] = dict(shard.image_kinds)
    return json.dumps(row, sort_keys=True, separators=(",", ":")).encode("utf-8") + b"\n"


def _summed(pairs) -> Tuple[Tuple[Any, int], ...]:
    out: Dict[Any, int] = {}
    for key, n in pairs:
        out[key] = out.get(key, 0) + n
    return tuple(sorted(out.items()))


@dataclasses.dataclass(frozen=True)
class Split:
    """One split and its shards, in shard order.

    Attributes:
      name: split name.
      shards: the split's shards sorted by index: a tuple, or ShardColumns for a split loaded from
        columns (its shards carry no histograms until Manifest.with_details reads them).
      side: for a split written as columns, its side file and the sums the manifest keeps of it;
        None for a split written as rows (or whose side file was read back into its shards).
    """

    name: str
    shards: Sequence[Shard]
    side: Optional[SideFile] = None

    @property
    def num_examples(self) -> int:
        if isinstance(self.shards, ShardColumns):
            return self.shards.total_count
        return sum(s.count for s in self.shards)

    @property
    def num_bytes(self) -> int:
        if isinstance(self.shards, ShardColumns):
            return self.shards.total_bytes
        return sum(s.num_bytes for s in self.shards)

    @property
    def counts(self) -> List[int]:
        """Records per shard, in shard order (read from the columns, without making a Shard each)."""
        if isinstance(self.shards, ShardColumns):
            return self.shards.counts.tolist()
        return [s.count for s in self.shards]

    @property
    def label_counts(self) -> Tuple[Tuple[int, int], ...]:
        """((label id, records), ...) of the split, sorted by id: the side file's sums when it has one."""
        if self.side is not None:
            return self.side.labels
        return _summed(pair for s in self.shards for pair in s.labels)

    @property
    def image_kinds(self) -> Tuple[Tuple[str, int], ...]:
        if self.side is not None:
            return self.side.image_kinds
        return _summed(pair for s in self.shards for pair in s.image_kinds)

    def to_json(self, dataset: str = "") -> Dict[str, Any]:
        out = {"num_examples": self.num_examples, "num_bytes": self.num_bytes}
        if self.side is None:
            return {**out, "shards": [s.to_json() for s in self.shards]}
        columns = ShardColumns.encode(dataset, self.name, self.shards)
        if columns is None:
            raise ValueError(f"split {self.name!r} has a side file but shards that do not fit in columns")
        return {**out, "columns": columns.to_json(), "labels": {str(k): v for k, v in self.side.labels},
                "passthrough": self.side.passthrough, "shards_file": self.side.filename,
                "shards_sha256": self.side.sha256,
                **({"image_kinds": dict(self.side.image_kinds)} if self.side.image_kinds else {})}

    @classmethod
    def from_json(cls, dataset: str, name: str, entry: Mapping[str, Any]) -> "Split":
        if "columns" not in entry:
            return cls(name, tuple(sorted((Shard.from_json(s) for s in entry["shards"]), key=lambda s: s.index)))
        check_inside("shards file", entry["shards_file"])
        side = SideFile(str(entry["shards_file"]), str(entry["shards_sha256"]),
                        tuple(sorted((int(k), int(v)) for k, v in dict(entry.get("labels") or {}).items())),
                        tuple(sorted((str(k), int(v)) for k, v in dict(entry.get("image_kinds") or {}).items())),
                        int(entry.get("passthrough", 0)))
        return cls(name, ShardColumns.from_json(dataset, name, entry["columns"]), side)

    def side_file(self, dataset: str, version: Optional[str]) -> Tuple["Split", bytes]:
        """This split written as columns: (the split as a loader reads it back, its shards held as
        columns and naming its side file; the side file's bytes).

        Raises:
          ValueError: when its shards do not fit in columns (ShardColumns.encode).
        """
        columns = ShardColumns.encode(dataset, self.name, self.shards)
        if columns is None:
            raise ValueError(f"split {self.name!r}: its shards do not fit in columns")
        data = b"".join(_side_row(s) for s in self.shards)
        filename = f"{version}/{self.name}{SHARDS_SUFFIX}" if version else f"{self.name}{SHARDS_SUFFIX}"
        side = SideFile(filename, hashlib.sha256(data).hexdigest(), self.label_counts, self.image_kinds,
                        sum(s.passthrough for s in self.shards))
        # Columns once, not at every dumps (a regex per shard: seconds at 572,917 shards).
        return Split(self.name, columns, side), data

    def with_details(self, data: bytes, source: str) -> "Split":
        """This columnar split with its shards' histograms read from its side file's bytes `data`.

        Raises:
          ManifestError: naming `source` when the bytes are not the ones the manifest records.
        """
        got = hashlib.sha256(data).hexdigest()
        if got != self.side.sha256:
            raise ManifestError(f"{source}: sha256 {got[:12]}... is not the {self.side.sha256[:12]}... that "
                                f"{MANIFEST} records for split {self.name!r}; the file was altered or damaged "
                                "(restore it, or rebuild with --overwrite)")
        shards = []
        try:
            lines = data.decode("utf-8").splitlines()
            if len(lines) != len(self.shards):
                raise ValueError(f"{len(lines)} rows for {len(self.shards)} shards")
            for shard, line in zip(self.shards, lines):
                row = json.loads(line)
                if row["index"] != shard.index:
                    raise ValueError(f"row of shard {row['index']} where shard {shard.index} belongs")
                shards.append(dataclasses.replace(
                    shard, labels=tuple(sorted((int(k), int(v)) for k, v in dict(row["labels"]).items())),
                    passthrough=int(row.get("passthrough", 0)),
                    image_kinds=tuple(sorted((str(k), int(v)) for k, v in dict(row.get("image_kinds") or {}).items()))))
        except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise ManifestError(f"{source}: malformed ({type(e).__name__}: {e})") from None
        return Split(self.name, tuple(shards))


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A published dataset: everything a reader needs and what the build was made from.

    Attributes:
      name: dataset name, the shard file prefix.
      schema: example schema preset (imagerecords.format.schema.PRESETS).
      label_names: class name of stored label id `i + label_offset` at position i.
      label_offset: added to every label id.
      integer_labels: True when the source labels were integers.
      seed: the shuffle seed.
      parameters: the build settings (BuildConfig.to_json(), paths excluded).
      splits: the splits sorted by name.
      num_rejected: inputs that did not become records (rows of errors.jsonl, skipped ones excluded).
      num_skipped: entries that were not images of a class (rows of errors.jsonl marked skipped).
      versions: versions of imagerecords and the libraries that shaped the bytes.
      created: UTC build time, the only field that differs between two identical builds.
      errors_file: the file holding the rejected and skipped rows.
      num_duplicate_groups: groups of written images whose source files hold identical bytes under
        two keys or more (rows of duplicates.jsonl; -1 when the build did not look).
      num_leaking_groups: those of them that span more than one split.
      num_label_conflicts: those of them whose members carry different labels (the same image
        under two classes; 0 in manifests written before it was counted).
      num_already_present: an append's listed inputs whose keys the dataset already held with the
        same content, not written again (duplicates.jsonl rows whose members share one key; not
        duplicate groups). Written only when not 0, so other builds' manifests keep their bytes.
      num_opted_out: URLs their sites opted out of (robots.txt, X-Robots-Tag, tdm-reservation), not
        downloaded: errors.jsonl rows of stage opted_out, in neither num_rejected nor a budget.
        Written only when not 0, so other builds' manifests keep their bytes.
      version: the folder (relative to the dataset folder) holding this build's shards and index
        files, named after its build id; None for datasets written before versions had folders
        (their files lie directly in the dataset folder).
      image_encoding: the build's --image_encoding: 'jpeg' (every record an RGB JPEG), 'png' or
        'keep' (records may be PNG, greyscale, with alpha or 16-bit: see image_kinds).
      previous_versions: the earlier versions kept beside this one for readers that loaded their
        manifests, newest first, in the order they were published (FLAT_LAYOUT for a dataset whose
        files lie directly in the folder); the next build's retention counts from this list.
      features: the declared features each record holds besides the schema preset's keys,
        {name: imagerecords.format.features.Feature.to_json()} (a class_list's names filled in).
      features_only: the records hold `features` and nothing else, none of the schema preset's own
        keys (an arrays build, which may store no image at all).
      listed_folders: {version: the folders its manifest lists} for this version and the kept ones,
        when one lists another folder than its own (an append shares the previous shards); the
        retention keeps every folder named here. Empty otherwise (every version folder written since
        appends link the earlier shards into it is whole: it lists only itself).
      record_format: the format of its shard files (imagerecords.format.record_format's registry);
        manifest.json holds it only when it is not 'tfrecord'.
      shard_builds: {split: ((first shard index, build id), ...)}: which build wrote each run of an
        appended dataset's shards (their files all lie in this version's folder, so the folder no
        longer says); --append trusts an unchanged source file from that build's start time. Empty
        for a dataset one build wrote.
    """

    name: str
    schema: str
    label_names: Tuple[str, ...]
    label_offset: int
    integer_labels: bool
    seed: int
    parameters: Mapping[str, Any]
    splits: Tuple[Split, ...]
    num_rejected: int
    num_skipped: int = 0
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)
    created: Optional[str] = None
    errors_file: str = ERRORS
    num_duplicate_groups: int = -1
    num_leaking_groups: int = 0
    num_label_conflicts: int = 0
    num_already_present: int = 0
    num_opted_out: int = 0
    version: Optional[str] = None
    previous_versions: Tuple[str, ...] = ()
    features: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    image_encoding: str = "jpeg"
    features_only: bool = False
    listed_folders: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    shard_builds: Mapping[str, Tuple[Tuple[int, str], ...]] = dataclasses.field(default_factory=dict)
    record_format: str = "tfrecord"

    def shard_build(self, split: str, index: int) -> Optional[str]:
        """The id of the build that wrote shard `index` of `split`, when the manifest records it."""
        found = None
        for first, build_id in self.shard_builds.get(split, ()):
            if first <= index:
                found = build_id
        return found

    @property
    def num_examples(self) -> int:
        return sum(s.num_examples for s in self.splits)

    def split(self, name: str) -> Split:
        for s in self.splits:
            if s.name == name:
                return s
        raise KeyError(f"no split {name!r}; the splits are {', '.join(s.name for s in self.splits) or '(none)'}")

    @property
    def image_kinds(self) -> Dict[str, int]:
        """{'format:channels:dtype': records} over every split; {'jpeg:3:uint8': all} for 'jpeg' builds."""
        if self.image_encoding == "jpeg":
            return {"jpeg:3:uint8": self.num_examples} if self.num_examples else {}
        return dict(_summed(pair for split in self.splits for pair in split.image_kinds))

    @property
    def split_names(self) -> Tuple[str, ...]:
        return tuple(s.name for s in self.splits)

    def shard_files(self) -> Tuple[str, ...]:
        """Every file name the dataset lists: shards and their index files."""
        names = []
        for split in self.splits:
            for shard in split.shards:
                names.append(shard.filename)
                if shard.index_file:
                    names.append(shard.index_file)
        return tuple(names)

    @property
    def side_files(self) -> Tuple[str, ...]:
        """The side files of the columnar splits (relative to the dataset folder)."""
        return tuple(s.side.filename for s in self.splits if s.side is not None)

    def with_side_files(self, columns_from: int = COLUMNS_FROM) -> Tuple["Manifest", List[Tuple[str, bytes]]]:
        """This manifest with every split of `columns_from` shards or more written as columns:
        (that manifest, [(side file name, its bytes)] to write before it). A split whose shards do
        not fit in columns (ShardColumns.encode) keeps its rows."""
        splits, files = [], []
        for split in self.splits:
            if split.side is None and len(split.shards) >= columns_from:
                try:
                    split, data = split.side_file(self.name, self.version)
                except ValueError:  # shards off the name pattern: the split keeps its rows
                    pass
                else:
                    files.append((split.side.filename, data))
            splits.append(split)
        return dataclasses.replace(self, splits=tuple(splits)), files

    def with_details(self, folder: str, read: Callable[[str], bytes]) -> "Manifest":
        """This manifest with the columnar splits' per-shard histograms read from their side files
        (what the report, verify and an append need; readers do not).

        Raises:
          ManifestError: naming the side file when it is missing, or not the bytes the manifest records.
        """
        splits = []
        for split in self.splits:
            if split.side is not None:
                path = join(folder, split.side.filename)
                try:
                    data = read(path)
                except FileNotFoundError:
                    raise ManifestError(f"{path}: missing; {MANIFEST} lists it as the per-shard histograms of "
                                        f"split {split.name!r} (restore it, or rebuild with --overwrite)") from None
                except OSError as e:  # an object store's own error for a missing or unreadable object
                    raise ManifestError(f"{path}: cannot be read ({type(e).__name__}: {e})") from None
                split = split.with_details(data, path)
            splits.append(split)
        return dataclasses.replace(self, splits=tuple(splits))

    def to_json(self) -> Dict[str, Any]:
        return {
            "format_version": COLUMNS_VERSION if any(s.side for s in self.splits) else FORMAT_VERSION,
            "name": self.name,
            "schema": self.schema,
            "label_names": list(self.label_names),
            "label_offset": self.label_offset,
            "integer_labels": self.integer_labels,
            "seed": self.seed,
            "parameters": dict(self.parameters),
            "splits": {s.name: s.to_json(self.name) for s in self.splits},
            "num_rejected": self.num_rejected,
            "num_skipped": self.num_skipped,
            "errors_file": self.errors_file,
            "versions": dict(self.versions),
            "created": self.created,
            "num_duplicate_groups": self.num_duplicate_groups,
            "num_leaking_groups": self.num_leaking_groups,
            "num_label_conflicts": self.num_label_conflicts,
            **({"num_already_present": self.num_already_present} if self.num_already_present else {}),
            **({"num_opted_out": self.num_opted_out} if self.num_opted_out else {}),
            **({"version": self.version} if self.version else {}),
            **({"previous_versions": list(self.previous_versions)} if self.previous_versions else {}),
            **({"features": {k: dict(v) for k, v in sorted(self.features.items())}} if self.features else {}),
            # Written only when not 'jpeg', so a default build's manifest keeps its bytes.
            **({"image_encoding": self.image_encoding} if self.image_encoding != "jpeg" else {}),
            **({"features_only": True} if self.features_only else {}),
            **({"listed_folders": {k: list(v) for k, v in sorted(self.listed_folders.items())}}
               if self.listed_folders else {}),
            **({"shard_builds": {k: [list(run) for run in v] for k, v in sorted(self.shard_builds.items())}}
               if self.shard_builds else {}),
            # Written only when not TFRecord, so a TFRecord build's manifest keeps its bytes.
            **({"record_format": self.record_format} if self.record_format != "tfrecord" else {}),
        }

    def dumps(self) -> bytes:
        """The manifest.json bytes: sorted keys, so equal manifests give equal bytes."""
        return dumps(self.to_json())

    @classmethod
    def from_json(cls, d: Any, source: str = MANIFEST) -> "Manifest":
        """Reads a parsed manifest.json.

        Raises:
          ManifestError: naming `source` and the missing or malformed field, or an unknown version.
        """
        if not isinstance(d, Mapping):
            raise ManifestError(f"{source}: not a JSON object")
        version = d.get("format_version")
        if version not in READABLE_VERSIONS:
            raise ManifestError(f"{source}: format_version {version!r}; this imagerecords reads "
                                f"{', '.join(map(str, READABLE_VERSIONS))}")
        try:
            splits = tuple(Split.from_json(str(d["name"]), name, entry)
                           for name, entry in sorted(dict(d["splits"]).items()))
            manifest = cls(name=str(d["name"]), schema=str(d["schema"]), label_names=tuple(map(str, d["label_names"])),
                           label_offset=int(d.get("label_offset", 0)),
                           integer_labels=bool(d.get("integer_labels", False)),
                           seed=int(d.get("seed", 0)), parameters=dict(d.get("parameters") or {}), splits=splits,
                           num_rejected=int(d.get("num_rejected", 0)), num_skipped=int(d.get("num_skipped", 0)),
                           versions=dict(d.get("versions") or {}), created=d.get("created"),
                           errors_file=str(d.get("errors_file", ERRORS)),
                           num_duplicate_groups=int(d.get("num_duplicate_groups", -1)),
                           num_leaking_groups=int(d.get("num_leaking_groups", 0)),
                           num_label_conflicts=int(d.get("num_label_conflicts", 0)),
                           num_already_present=int(d.get("num_already_present", 0)),
                           num_opted_out=int(d.get("num_opted_out", 0)),
                           version=d.get("version") or None,
                           previous_versions=tuple(map(str, d.get("previous_versions") or ())),
                           features=dict(d.get("features") or {}),
                           image_encoding=str(d.get("image_encoding") or "jpeg"),
                           features_only=d.get("features_only") is True,
                           listed_folders={str(k): tuple(map(str, v))
                                           for k, v in dict(d.get("listed_folders") or {}).items()},
                           shard_builds={str(k): tuple((int(first), str(build)) for first, build in v)
                                         for k, v in dict(d.get("shard_builds") or {}).items()},
                           record_format=str(d.get("record_format") or "tfrecord"))
            # Names that readers, TFDS's filepathTemplate or the commit turn into paths.
            check_inside("errors_file", d.get("errors_file", ERRORS))
            for name in d.get("features") or {}:
                check_inside("feature name", name)
            check_inside("dataset name", d["name"], one_part=True)
            for split in d["splits"]:
                check_inside("split name", split, one_part=True)
            if d.get("version"):
                check_inside("version", d["version"], one_part=True)
            for version, folders in manifest.listed_folders.items():
                for folder in (version, *folders):
                    check_inside("listed folder", folder, one_part=True)
            for previous in d.get("previous_versions") or ():
                if previous != FLAT_LAYOUT:
                    check_inside("previous version", previous, one_part=True)
            return manifest
        except KeyError as e:
            raise ManifestError(f"{source}: missing field {e.args[0]!r}") from None
        except ManifestError as e:
            raise ManifestError(f"{source}: {e}") from None
        except (TypeError, ValueError, AttributeError) as e:
            raise ManifestError(f"{source}: malformed ({type(e).__name__}: {e})") from None

    @classmethod
    def loads(cls, data: bytes, source: str = MANIFEST) -> "Manifest":
        """Parses manifest.json bytes.

        Raises:
          ManifestError: naming `source` when the bytes are not JSON or not a readable manifest.
        """
        try:
            parsed = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ManifestError(f"{source}: not valid JSON ({e})") from None
        return cls.from_json(parsed, source)


def load(folder: str, read: Callable[[str], bytes], exists: Callable[[str], bool], details: bool = False,
         check_features: bool = True, *, size: Callable[[str], int]) -> Manifest:
    """Reads `folder`/manifest.json: the one loader behind every reader, verify and the report.

    Each caller brings its own file access (plain files, TensorFlow's gfile, Beam's filesystems,
    google-cloud-storage), so the reader side needs none of the builder's.

    Args:
      folder: the dataset folder.
      read: returns a file's bytes; raises FileNotFoundError when it is not there.
      exists: whether a path exists (asked of the staging area only when there is no manifest).
      size: returns a file's size without reading it (a stat; one metadata request on gs://); raises
        FileNotFoundError when it is not there. A manifest over MAX_MANIFEST_BYTES is never read.
      details: also read the columnar splits' side files into their shards (Manifest.with_details).
      check_features: refuse a feature spec no reader can follow (off only for the report, which
        shows each feature's problem on its page).

    Raises:
      NotPublished: when there is no manifest.json (the message says whether an unfinished build
        is there, and how to finish or clear it).
      ManifestError: when the manifest is unreadable, larger than any manifest can be, or of a
        schema preset this imagerecords does not know.
    """
    path = join(folder, MANIFEST)
    try:
        data = read_bytes(path, read, size)
    except FileNotFoundError:
        if exists(join(folder, STAGING)):
            raise NotPublished(unfinished_hint(folder), unfinished=True) from None
        raise NotPublished(no_manifest_hint(folder), unfinished=False) from None
    manifest = Manifest.loads(data, path)
    if manifest.schema not in schema_lib.PRESETS:  # every reader, verify and the report key records by it
        raise ManifestError(f"{path}: schema {manifest.schema!r} is not one this imagerecords knows "
                            f"({', '.join(schema_lib.PRESETS)}); manifest.json was altered or written by a newer version")
    try:  # every reader reads its files through it: refused here, not mid-read
        min_bytes = record_format.of(manifest).min_record_bytes
    except record_format.UnknownFormat as e:
        raise ManifestError(f"{path}: {e}; manifest.json was altered or written by a newer version") from None
    for split in manifest.splits:
        counts, sizes = ((split.shards.counts, split.shards.sizes) if isinstance(split.shards, ShardColumns)
                         else ([s.count for s in split.shards], [s.num_bytes for s in split.shards]))
        for i, (count, num_bytes) in enumerate(zip(counts, sizes)):
            problem = count_problem(count, num_bytes, min_bytes)
            if problem:
                raise ManifestError(f"{path}: shard {i} of split {split.name!r}: {problem}")
    if manifest.features and check_features:  # every reader decodes by it: refused here, not mid-read
        try:
            features_lib.specs_from_json(manifest.features)
        except (ValueError, TypeError, KeyError, AttributeError) as e:  # SpecError is a ValueError
            raise ManifestError(f"{path}: its feature spec cannot be read ({e}); manifest.json is not the one its "
                                "build wrote") from None
    return manifest.with_details(folder, read) if details else manifest


def read_bytes(path: str, read: Callable[[str], bytes], size: Callable[[str], int]) -> bytes:
    """The bytes of the manifest.json at `path` (`read`, `size`: see load), refused by its size first.

    Raises:
      FileNotFoundError: from `size` or `read`, when it is not there.
      ManifestError: when it is larger than MAX_MANIFEST_BYTES (nothing read).
    """
    num_bytes = size(path)
    if num_bytes > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: {num_bytes:,} bytes, larger than any manifest.json can be (at most "
                            f"{MAX_MANIFEST_BYTES:,}); it is not the one its build wrote, so it is not read")
    return read(path)


def dumps(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def unfinished_hint(folder: str) -> str:
    """The one line every reader prints for a folder that has a staging area but no manifest."""
    return (f"{folder} holds no published dataset: an unfinished build is in {folder.rstrip('/')}/{STAGING}; "
            f"run `imagerecords finish {folder}` to publish it if its shards were all written, or rerun "
            "`imagerecords build ... --overwrite` to rebuild (or delete the folder)")


def no_manifest_hint(folder: str) -> str:
    return (f"{folder} holds no published imagerecords dataset (no {MANIFEST}; the builder writes it last)")
