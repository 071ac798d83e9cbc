"""Output metadata around the manifest: TFDS dataset_info.json / features.json and label names."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from imagerecords.format import features as features_lib
from imagerecords.format.manifest import MANIFEST, Manifest, Shard, Split, dumps
from imagerecords.format import record_format
from imagerecords.format import schema
from imagerecords.format.record_format import INDEX_DIR, INDEX_SUFFIX

DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
LABEL_NAMES = "label.labels.txt"
FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"
# Index files live in a sub-folder, `index/<shard file name>.idx` (DALI's examples keep theirs in a
# folder the same way): a shard glob in the dataset folder (`images-train*`, `*.tfrecord*`,
# `*-of-*`) never reaches into a sub-folder, so it can never pick an index up as a shard, and
# `OUT/index/{}.idx` with the shard's file name is the index path every reader wants
# (INDEX_DIR and INDEX_SUFFIX live with the manifest, which derives a columnar split's index names).
# What TFDS reads to find a dataset: removed with manifest.json when a commit starts, so that
# neither our readers nor TFDS see the previous dataset's metadata over the new shards.
PUBLICATION_MARKS = (MANIFEST, DATASET_INFO, FEATURES)


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """A written shard as the shard writer reports it: its split and its manifest row.

    Attributes:
      split: split name.
      shard: the manifest's row for the shard (manifest.Shard).
      crc32c, index_crc32c: the shard's and its index file's crc32c as GCS shows it (base64,
        big-endian), or None: the commit on gs:// compares them with the objects' metadata instead
        of reading the objects back. Kept in the results, not in the manifest (readers use sha256).
      identity, index_identity: the local staged files' storage.identity as their writer saw it
        once they were in place, or None: a local commit reads back only a file whose identity
        changed since.
    """

    split: str
    shard: Shard
    crc32c: Optional[str] = None
    index_crc32c: Optional[str] = None
    identity: Optional[str] = None
    index_identity: Optional[str] = None

    @property
    def index(self) -> int:
        return self.shard.index

    @property
    def filename(self) -> str:
        return self.shard.filename

    @property
    def count(self) -> int:
        return self.shard.count

    @property
    def index_file(self) -> Optional[str]:
        return self.shard.index_file

    def to_json(self) -> Dict[str, object]:
        out = dict(self.shard.to_json(), split=self.split)
        if self.crc32c:
            out["crc32c"] = self.crc32c
        if self.index_crc32c:
            out["index_crc32c"] = self.index_crc32c
        for key in ("identity", "index_identity"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "ShardResult":
        text = lambda key: str(d[key]) if d.get(key) else None  # noqa: E731
        return cls(str(d["split"]), Shard.from_json(d), text("crc32c"), text("index_crc32c"), text("identity"),
                   text("index_identity"))


def contents_entry(digest: str, key: str, split: str, uri: str, label: str) -> str:
    """One entry of a staged shard record's "contents" (shard_writer.StagedShard.contents), its values
    spelled as JSON like keys_line's: ["digest hex",[key,split,uri,label name]]."""
    return f'["{digest}",[{key},{split},{uri},{label}]]'


def index_name(shard_filename: str) -> str:
    """The index file of a shard, relative to the dataset folder ('/' separated on every filesystem)."""
    return f"{INDEX_DIR}/{shard_filename}{INDEX_SUFFIX}"


def build_manifest(
    *,
    name: str,
    schema: str,
    label_map: Mapping[str, object],
    seed: int,
    parameters: Mapping[str, object],
    shards: Sequence[ShardResult],
    num_rejected: int,
    num_skipped: int = 0,
    versions: Mapping[str, str],
    created: Optional[str] = None,
    num_duplicate_groups: int = -1,
    num_leaking_groups: int = 0,
    num_label_conflicts: int = 0,
    num_already_present: int = 0,
    num_opted_out: int = 0,
) -> Manifest:
    """Returns the manifest of a build from its shard results; splits and shards are sorted, so the
    same build always serializes to the same bytes (`created` aside)."""
    by_split: Dict[str, List[Shard]] = {}
    for result in sorted(shards, key=lambda s: (s.split, s.index)):
        by_split.setdefault(result.split, []).append(result.shard)
    params = {k: v for k, v in parameters.items() if k not in ("name", "schema", "seed", "features", "features_only")}
    features = {key: dict(spec) for key, spec in (parameters.get("features") or {}).items()}
    for key, names in dict(label_map.get("lists") or {}).items():
        features[key]["names"] = list(names)
    image_encoding = str(dict(params.get("image") or {}).get("image_encoding") or "jpeg")
    fmt = str(params.get("record_format") or record_format.DEFAULT)
    return Manifest(name=name, schema=schema, label_names=tuple(label_map["names"]),
                    label_offset=int(label_map["offset"]), integer_labels=bool(label_map["integer"]), seed=seed,
                    parameters=params, splits=tuple(Split(k, tuple(v)) for k, v in sorted(by_split.items())),
                    num_rejected=num_rejected, num_skipped=num_skipped, versions=dict(versions), created=created,
                    num_duplicate_groups=num_duplicate_groups, num_leaking_groups=num_leaking_groups,
                    num_label_conflicts=num_label_conflicts, num_already_present=num_already_present,
                    num_opted_out=num_opted_out, features=features, image_encoding=image_encoding, record_format=fmt,
                    features_only=bool(parameters.get("features_only")))


def tfds_dataset_info(manifest: Manifest) -> Dict[str, object]:
    """Returns TFDS's dataset_info.json content for the manifest (what tfds.builder_from_directory
    reads to find the shards and count the examples)."""
    splits = []
    for split in manifest.splits:
        splits.append({
            "name": split.name,
            "filepathTemplate": f"{manifest.version}/{FILEPATH_TEMPLATE}" if manifest.version else FILEPATH_TEMPLATE,
            "numBytes": str(split.num_bytes),
            "shardLengths": [str(n) for n in split.counts],
        })
    return {
        "name": manifest.name,
        "description": f"Images converted by imagerecords (schema {manifest.schema}).",
        "fileFormat": record_format.of(manifest).tfds_name,
        "version": "1.0.0",
        "splits": splits,
        # What as_supervised=True yields: (image, label), for records that hold both. The JSON form of
        # TFDS's SupervisedKeys proto as TFDS 4.x writes it (a tuple of feature keys).
        **({} if _arrays_spec(manifest) and not {"image", "label"} <= set(manifest.features) else
           {"supervisedKeys": {"tuple": {"items": [{"featureKey": "image"}, {"featureKey": "label"}]}}}),
    }


def tfds_image(image_kinds: Mapping[str, int]) -> Dict[str, object]:
    """The `image` of TFDS's Image feature for records of these kinds (Manifest.image_kinds).

    TFDS decodes with tf.image.decode_image(channels=the declared count, dtype=the declared dtype),
    so one count and dtype hold for all: uint16 when any record is 16-bit (8-bit ones are scaled
    up by 257); the records' channel count when they share one, else 3 (grey becomes RGB, alpha is
    dropped), or 4 when every record is a PNG and some have alpha (a JPEG decodes to 1 or 3 only).
    """
    encoding, count, bits = features_lib.image_summary(image_kinds)
    dtype = "uint16" if bits == 16 else "uint8"
    return {"dtype": dtype, "encodingFormat": encoding, "shape": {"dimensions": ["-1", "-1", str(count)]}}


def tfds_features(num_classes: int, declared: Optional[Mapping[str, Mapping[str, object]]] = None,
                  image_kinds: Optional[Mapping[str, int]] = None) -> Dict[str, object]:
    """Returns TFDS's features.json for the 'tfds' schema preset (keys as in schema.py) plus the
    declared features (manifest.json's "features"); the image feature is an RGB JPEG unless
    `image_kinds` (Manifest.image_kinds) says otherwise."""
    extra = {f.name: features_lib.tfds_feature(f) for f in features_lib.specs_from_json(declared or {})}
    if image_kinds and features_lib.image_summary(image_kinds)[0] == "raw":
        # --image_encoding raw: TFDS has no float image; a flat float32 tensor, shaped by height and width
        image_entry = features_lib.tfds_feature(features_lib.Feature("image", "image", encoding="raw"))
    else:
        image_entry = {"pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
                       "image": tfds_image(image_kinds) if image_kinds is not None else {
                           "dtype": "uint8", "encodingFormat": "jpeg", "shape": {"dimensions": ["-1", "-1", "3"]}}}

    def tensor(dtype: str) -> Dict[str, object]:
        return {
            "pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
            "tensor": {"dtype": dtype, "encoding": "none", "shape": {}},
        }

    return {
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {"features": {
            "image": image_entry,
            "label": {
                "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                "classLabel": {"numClasses": str(num_classes)},
            },
            "image/filename": {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}},
            "image/height": tensor("int64"),
            "image/width": tensor("int64"),
            **extra,
        }},
    }


def _arrays_spec(manifest: Manifest) -> bool:
    """Whether the records hold the declared features only (an arrays build's)."""
    return features_lib.declared_only(manifest)


def tfds_declared(manifest: Manifest) -> Dict[str, object]:
    """TFDS's features.json from the manifest's feature spec; the preset's int64 label is a ClassLabel."""
    label = schema.keys(manifest.schema).label
    out: Dict[str, object] = {}
    for spec in features_lib.specs_from_json(manifest.features):
        if spec.name == label and spec.dtype == "int64" and spec.shape == () and manifest.label_names != ("",):
            out[spec.name] = {"pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                              "classLabel": {"numClasses": str(len(manifest.label_names))}}
        else:
            out[spec.name] = features_lib.tfds_feature(spec)
    return {"pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
            "featuresDict": {"features": out}}


def label_names_text(names: Sequence[str]) -> bytes:
    return "".join(f"{n}\n" for n in names).encode("utf-8")


def metadata_files(manifest: Manifest) -> List[Tuple[str, bytes]]:
    """Returns (filename, content) of every metadata file except errors.jsonl and manifest.json
    (the commit writes those itself, manifest.json last)."""
    files = [(LABEL_NAMES, label_names_text(manifest.label_names))]
    if manifest.schema == "tfds":
        if record_format.of(manifest).tfds_name:  # a format TFDS cannot read gets no dataset_info.json
            files.append((DATASET_INFO, dumps(tfds_dataset_info(manifest))))
        if _arrays_spec(manifest):
            files.append((FEATURES, dumps(tfds_declared(manifest))))
            return files
        kinds = manifest.image_kinds if manifest.image_encoding != "jpeg" else None
        files.append((FEATURES, dumps(tfds_features(len(manifest.label_names), manifest.features, kinds))))
        # TFDS reads a ClassLabel's names from <feature>.labels.txt, a Sequence's inner one too.
        for name, spec in sorted(manifest.features.items()):
            if spec.get("dtype") == "class_list":
                files.append((f"{name}.labels.txt", label_names_text(spec.get("names") or ())))
    return files
