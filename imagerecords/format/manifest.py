"""manifest.json as a typed contract: what the builder publishes and every reader of it relies on."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from imagerecords.format.paths import inside_problem, join, segment_problem

MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
DUPLICATES = "duplicates.jsonl"
# Version 2: seed/name/schema are no longer repeated under `parameters`; `num_skipped` was added.
# Version 1 manifests still read (the missing fields take their defaults).
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)

# Names inside an output folder that belong to the publish protocol (imagerecords.pipeline.publish). They
# live here, in a module without Beam or TensorFlow, so the reader can name them in its errors.
STAGING = ".imagerecords-staging"  # one folder per build inside, named by its build id
# Each published build's shards live in a folder of their own, `v-<build id>`: a rebuild never
# writes over a file that a loaded manifest points at.
VERSION_PREFIX = "v-"
FLAT_LAYOUT = "."  # in previous_versions: a dataset whose shards lie directly in the folder
LOCK = ".imagerecords.lock"


class ManifestError(ValueError):
    """manifest.json is not a manifest this version can read; the message names the file and why."""


class NotPublished(FileNotFoundError):
    """A folder holds no manifest.json; the message says whether an unfinished build is there.

    Attributes:
      unfinished: True when the folder holds a staging area (a build that did not publish).
    """

    def __init__(self, message: str, unfinished: bool):
        super().__init__(message)
        self.unfinished = unfinished


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard file of a split.

    Attributes:
      index: shard number within the split.
      filename: file name relative to the dataset folder.
      count: records in the shard.
      num_bytes: file size in bytes.
      sha256: hex digest of the file.
      labels: ((label id, records with it), ...) sorted by id; ids include the label offset.
      passthrough: records whose image bytes are the source file unchanged.
      index_file: path (relative to the dataset folder) of the shard's tfrecord2idx index file
        (one "offset frame_length" line per record), when one was written.
      index_sha256: hex digest of the index file.
      image_kinds: ((kind, records), ...) sorted, where kind is 'format:channels:dtype' of the stored
        image as TensorFlow decodes it ('png:1:uint16'); only for builds whose image encoding is
        not 'jpeg' (a 'jpeg' build stores 3-channel uint8 JPEGs only).
    """

    index: int
    filename: str
    count: int
    num_bytes: int
    sha256: str
    labels: Tuple[Tuple[int, int], ...] = ()
    passthrough: int = 0
    index_file: Optional[str] = None
    index_sha256: Optional[str] = None
    image_kinds: Tuple[Tuple[str, int], ...] = ()

    def to_json(self) -> Dict[str, Any]:
        out = {"index": self.index, "filename": self.filename, "count": self.count, "num_bytes": self.num_bytes,
               "sha256": self.sha256, "labels": {str(k): v for k, v in self.labels}, "passthrough": self.passthrough}
        if self.index_file:
            out["index_file"] = self.index_file
        if self.index_sha256:
            out["index_sha256"] = self.index_sha256
        if self.image_kinds:
            out["image_kinds"] = dict(self.image_kinds)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Shard":
        """Reads a shard's row (a manifest's, a staged record's, a build's results).

        Raises:
          ManifestError: when its file or index file name would lead outside the dataset folder.
        """
        if "filename" in d:
            _check_inside("shard file name", d["filename"])
        if d.get("index_file") is not None:
            _check_inside("index file name", d["index_file"])
        return cls(index=int(d["index"]), filename=str(d["filename"]), count=int(d["count"]),
                   num_bytes=int(d["num_bytes"]), sha256=str(d["sha256"]),
                   labels=tuple(sorted((int(k), int(v)) for k, v in dict(d.get("labels") or {}).items())),
                   passthrough=int(d.get("passthrough", 0)), index_file=d.get("index_file"),
                   index_sha256=d.get("index_sha256"),
                   image_kinds=tuple(sorted((str(k), int(v)) for k, v in dict(d.get("image_kinds") or {}).items())))


@dataclasses.dataclass(frozen=True)
class Split:
    """One split and its shards, in shard order.

    Attributes:
      name: split name.
      shards: the split's shards sorted by index.
    """

    name: str
    shards: Tuple[Shard, ...]

    @property
    def num_examples(self) -> int:
        return sum(s.count for s in self.shards)

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)

    def to_json(self) -> Dict[str, Any]:
        return {"num_examples": self.num_examples, "num_bytes": self.num_bytes,
                "shards": [s.to_json() for s in self.shards]}


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
      num_duplicate_groups: groups of written images whose source files hold identical bytes
        (rows of duplicates.jsonl; -1 when the build did not look).
      num_leaking_groups: those of them that span more than one split.
      num_label_conflicts: those of them whose members carry different labels (the same image
        under two classes; 0 in manifests written before it was counted).
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
        retention keeps every folder named here. Empty otherwise.
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
    version: Optional[str] = None
    previous_versions: Tuple[str, ...] = ()
    features: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    image_encoding: str = "jpeg"
    features_only: bool = False
    listed_folders: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)

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
        out: Dict[str, int] = {}
        for split in self.splits:
            for shard in split.shards:
                for kind, count in shard.image_kinds:
                    out[kind] = out.get(kind, 0) + count
        return dict(sorted(out.items()))

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

    def to_json(self) -> Dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "name": self.name,
            "schema": self.schema,
            "label_names": list(self.label_names),
            "label_offset": self.label_offset,
            "integer_labels": self.integer_labels,
            "seed": self.seed,
            "parameters": dict(self.parameters),
            "splits": {s.name: s.to_json() for s in self.splits},
            "num_rejected": self.num_rejected,
            "num_skipped": self.num_skipped,
            "errors_file": self.errors_file,
            "versions": dict(self.versions),
            "created": self.created,
            "num_duplicate_groups": self.num_duplicate_groups,
            "num_leaking_groups": self.num_leaking_groups,
            "num_label_conflicts": self.num_label_conflicts,
            **({"version": self.version} if self.version else {}),
            **({"previous_versions": list(self.previous_versions)} if self.previous_versions else {}),
            **({"features": {k: dict(v) for k, v in sorted(self.features.items())}} if self.features else {}),
            # Written only when not 'jpeg', so a default build's manifest keeps its bytes.
            **({"image_encoding": self.image_encoding} if self.image_encoding != "jpeg" else {}),
            **({"features_only": True} if self.features_only else {}),
            **({"listed_folders": {k: list(v) for k, v in sorted(self.listed_folders.items())}}
               if self.listed_folders else {}),
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
            splits = tuple(
                Split(name, tuple(sorted((Shard.from_json(s) for s in entry["shards"]), key=lambda s: s.index)))
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
                           version=d.get("version") or None,
                           previous_versions=tuple(map(str, d.get("previous_versions") or ())),
                           features=dict(d.get("features") or {}),
                           image_encoding=str(d.get("image_encoding") or "jpeg"),
                           features_only=d.get("features_only") is True,
                           listed_folders={str(k): tuple(map(str, v))
                                           for k, v in dict(d.get("listed_folders") or {}).items()})
            # Names that readers, TFDS's filepathTemplate or the commit turn into paths.
            _check_inside("errors_file", d.get("errors_file", ERRORS))
            for name in d.get("features") or {}:
                _check_inside("feature name", name)
            _check_inside("dataset name", d["name"], one_part=True)
            for split in d["splits"]:
                _check_inside("split name", split, one_part=True)
            if d.get("version"):
                _check_inside("version", d["version"], one_part=True)
            for version, folders in manifest.listed_folders.items():
                for folder in (version, *folders):
                    _check_inside("listed folder", folder, one_part=True)
            for previous in d.get("previous_versions") or ():
                if previous != FLAT_LAYOUT:
                    _check_inside("previous version", previous, one_part=True)
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


def load(folder: str, read: Callable[[str], bytes], exists: Callable[[str], bool]) -> Manifest:
    """Reads `folder`/manifest.json: the one loader behind every reader, verify and the report.

    Each caller brings its own file access (plain files, TensorFlow's gfile, Beam's filesystems,
    google-cloud-storage), so the reader side needs none of the builder's.

    Args:
      folder: the dataset folder.
      read: returns a file's bytes; raises FileNotFoundError when it is not there.
      exists: whether a path exists (asked of the staging area only when there is no manifest).

    Raises:
      NotPublished: when there is no manifest.json (the message says whether an unfinished build
        is there, and how to finish or clear it).
      ManifestError: when the manifest is unreadable.
    """
    path = join(folder, MANIFEST)
    try:
        data = read(path)
    except FileNotFoundError:
        if exists(join(folder, STAGING)):
            raise NotPublished(unfinished_hint(folder), unfinished=True) from None
        raise NotPublished(no_manifest_hint(folder), unfinished=False) from None
    return Manifest.loads(data, path)


def _check_inside(what: str, name: Any, one_part: bool = False) -> None:
    problem = segment_problem(name) if one_part else inside_problem(name)
    if problem:
        raise ManifestError(f"{what} {name!r} {problem}; every name in a manifest stays inside the dataset "
                            "folder (this one was altered, or not written by imagerecords)")


def dumps(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def unfinished_hint(folder: str) -> str:
    """The one line every reader prints for a folder that has a staging area but no manifest."""
    return (f"{folder} holds no published dataset: an unfinished build is in {folder.rstrip('/')}/{STAGING}; "
            f"run `imagerecords finish {folder}` to publish it if its shards were all written, or rerun "
            "`imagerecords build ... --overwrite` to rebuild (or delete the folder)")


def no_manifest_hint(folder: str) -> str:
    return (f"{folder} holds no published imagerecords dataset (no {MANIFEST}; the builder writes it last)")
