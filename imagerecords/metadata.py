"""Output metadata: manifest.json, TFDS dataset_info.json / features.json, label names, errors."""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

MANIFEST = "manifest.json"
ERRORS = "errors.jsonl"
DATASET_INFO = "dataset_info.json"
FEATURES = "features.json"
LABEL_NAMES = "label.labels.txt"
FORMAT_VERSION = 1
FILEPATH_TEMPLATE = "{DATASET}-{SPLIT}.{FILEFORMAT}-{SHARD_X_OF_Y}"


@dataclasses.dataclass(frozen=True)
class ShardResult:
    """What one written shard holds (a row of manifest.json).

    Attributes:
      split: split name.
      index: shard number within the split.
      filename: file name relative to the output folder.
      count: records in the shard.
      num_bytes: file size in bytes.
      sha256: hex digest of the file.
      labels: ((label_id, count), ...) sorted by id.
      passthrough: records whose JPEG is the source file unchanged.
    """

    split: str
    index: int
    filename: str
    count: int
    num_bytes: int
    sha256: str
    labels: Tuple[Tuple[int, int], ...] = ()
    passthrough: int = 0

    def to_json(self) -> Dict[str, object]:
        return {
            "index": self.index,
            "filename": self.filename,
            "count": self.count,
            "num_bytes": self.num_bytes,
            "sha256": self.sha256,
            "labels": {str(k): v for k, v in self.labels},
            "passthrough": self.passthrough,
        }


def build_manifest(
    *,
    name: str,
    schema: str,
    label_map: Mapping[str, object],
    seed: int,
    parameters: Mapping[str, object],
    shards: Sequence[ShardResult],
    num_rejected: int,
    versions: Mapping[str, str],
    created: Optional[str] = None,
) -> Dict[str, object]:
    """Returns the manifest dict: everything a reader needs, and what a build was made from.

    Splits and shards are sorted, so the same build always serializes to the same bytes;
    `created` is the only field that varies between identical builds.
    """
    splits: Dict[str, Dict[str, object]] = {}
    for shard in sorted(shards, key=lambda s: (s.split, s.index)):
        entry = splits.setdefault(shard.split, {"num_examples": 0, "num_bytes": 0, "shards": []})
        entry["num_examples"] += shard.count
        entry["num_bytes"] += shard.num_bytes
        entry["shards"].append(shard.to_json())
    return {
        "format_version": FORMAT_VERSION,
        "name": name,
        "schema": schema,
        "label_names": list(label_map["names"]),
        "label_offset": label_map["offset"],
        "integer_labels": label_map["integer"],
        "seed": seed,
        "parameters": dict(parameters),
        "splits": splits,
        "num_rejected": num_rejected,
        "errors_file": ERRORS,
        "versions": dict(versions),
        "created": created,
    }


def dumps(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def tfds_dataset_info(manifest: Mapping[str, object]) -> Dict[str, object]:
    """Returns TFDS's dataset_info.json content for the manifest (what tfds.builder_from_directory
    reads to find the shards and count the examples)."""
    splits = []
    for split, entry in sorted(manifest["splits"].items()):
        splits.append({
            "name": split,
            "filepathTemplate": FILEPATH_TEMPLATE,
            "numBytes": str(entry["num_bytes"]),
            "shardLengths": [str(s["count"]) for s in entry["shards"]],
        })
    return {
        "name": manifest["name"],
        "description": f"Images converted by imagerecords (schema {manifest['schema']}).",
        "fileFormat": "tfrecord",
        "version": "1.0.0",
        "splits": splits,
    }


def tfds_features(num_classes: int) -> Dict[str, object]:
    """Returns TFDS's features.json for the 'tfds' schema preset (keys as in schema.py)."""

    def tensor(dtype: str) -> Dict[str, object]:
        return {
            "pythonClassName": "tensorflow_datasets.core.features.tensor_feature.Tensor",
            "tensor": {"dtype": dtype, "encoding": "none", "shape": {}},
        }

    return {
        "pythonClassName": "tensorflow_datasets.core.features.features_dict.FeaturesDict",
        "featuresDict": {"features": {
            "image": {
                "pythonClassName": "tensorflow_datasets.core.features.image_feature.Image",
                "image": {"dtype": "uint8", "encodingFormat": "jpeg", "shape": {"dimensions": ["-1", "-1", "3"]}},
            },
            "label": {
                "pythonClassName": "tensorflow_datasets.core.features.class_label_feature.ClassLabel",
                "classLabel": {"numClasses": str(num_classes)},
            },
            "image/filename": {"pythonClassName": "tensorflow_datasets.core.features.text_feature.Text", "text": {}},
            "image/height": tensor("int64"),
            "image/width": tensor("int64"),
        }},
    }


def label_names_text(names: Sequence[str]) -> bytes:
    return "".join(f"{n}\n" for n in names).encode("utf-8")


def metadata_files(manifest: Mapping[str, object]) -> List[Tuple[str, bytes]]:
    """Returns (filename, content) of every metadata file except errors.jsonl, manifest.json last
    (it is the publication mark: a folder without it holds no finished dataset)."""
    files = [(LABEL_NAMES, label_names_text(manifest["label_names"]))]
    if manifest["schema"] == "tfds":
        files.append((DATASET_INFO, dumps(tfds_dataset_info(manifest))))
        files.append((FEATURES, dumps(tfds_features(len(manifest["label_names"])))))
    files.append((MANIFEST, dumps(manifest)))
    return files
