"""What the report reads beside the typed manifest: errors.jsonl, duplicates.jsonl, manifest.json's `features`."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Tuple

from imagerecords.format.manifest import DUPLICATES, ERRORS, MANIFEST, Manifest
from imagerecords.build.storage import join, open_if_exists

_EXAMPLES_PER_REASON = 3
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


@dataclasses.dataclass
class ReasonGroup:
    """Rejected (or skipped) rows that share a stage and a reason.

    Attributes:
      stage: pipeline stage that rejected them.
      reason: the reason, with quoted names replaced by '…' so rows differing only in a key group.
      count: rows in the group.
      examples: up to a few (key, split, full reason) of them, in file order.
    """

    stage: str
    reason: str
    count: int = 0
    examples: List[Tuple[str, str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Feature:
    """One entry of manifest.json's `features`: a feature the records declare.

    Attributes:
      name: the feature key.
      dtype: its declared dtype ('' when not given).
      shape: its declared shape as JSON text, e.g. '[null, null, 3]' ('' when not given).
      encoding: how its bytes are encoded, e.g. 'jpeg' ('' when not given).
      problem: why the entry could not be read as {dtype, shape, ...}; '' when it could.
    """

    name: str
    dtype: str = ""
    shape: str = ""
    encoding: str = ""
    problem: str = ""


@dataclasses.dataclass
class Extras:
    """The optional files next to the manifest.

    Attributes:
      rejected: groups of rejected rows; None when errors.jsonl is absent.
      skipped: groups of skipped rows.
      bad_error_lines: errors.jsonl lines that were not JSON objects.
      duplicates: duplicates.jsonl rows; None when the file is absent.
      bad_duplicate_lines: duplicates.jsonl lines that were not rows.
      features: manifest.json's declared features, by name; None when it declares none.
      features_problem: why manifest.json's `features` could not be read; '' when it could.
    """

    rejected: Optional[List[ReasonGroup]] = None
    skipped: List[ReasonGroup] = dataclasses.field(default_factory=list)
    bad_error_lines: int = 0
    duplicates: Optional[List[dict]] = None
    bad_duplicate_lines: int = 0
    features: Optional[List[Feature]] = None
    features_problem: str = ""


def read_extras(output: str, manifest: Manifest) -> Extras:
    """Reads the errors and duplicates files of the dataset in `output`, where they exist."""
    extras = Extras()
    stream = open_if_exists(join(output, manifest.errors_file or ERRORS))
    if stream is not None:
        with stream:
            extras.rejected, extras.skipped, extras.bad_error_lines = read_errors(stream)
    stream = open_if_exists(join(output, DUPLICATES))
    if stream is not None:
        with stream:
            extras.duplicates, extras.bad_duplicate_lines = read_duplicates(stream)
    stream = open_if_exists(join(output, MANIFEST))
    if stream is not None:
        with stream:
            # The typed Manifest keeps only the fields it knows; `features` is read from the file itself.
            extras.features, extras.features_problem = read_features(stream)
    return extras


def read_features(stream: BinaryIO) -> Tuple[Optional[List[Feature]], str]:
    """Reads the top-level `features` of a manifest.json: {name: {"dtype": ..., "shape": ..., "encoding": ...}}.

    Returns:
      (the features sorted by name, or None when the file declares none; why `features` is not such a
      mapping, or '').
    """
    try:
        parsed = json.loads(stream.read().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:  # replaced since the manifest was loaded
        return None, f"{MANIFEST} no longer reads as JSON ({e})"
    declared = parsed.get("features") if isinstance(parsed, dict) else None
    if declared is None:
        return None, ""
    if not isinstance(declared, dict):
        return None, f"`features` is a JSON {type(declared).__name__}, not an object of name: {{dtype, shape}}"
    return [_feature(str(name), declared[name]) for name in sorted(declared)], ""


def _feature(name: str, entry: Any) -> Feature:
    if not isinstance(entry, dict):
        return Feature(name, problem=f"not an object but {json.dumps(entry)[:60]}")
    text = {k: "" if k not in entry else entry[k] if isinstance(entry[k], str) else json.dumps(entry[k])
            for k in ("dtype", "shape", "encoding")}
    missing = [k for k in ("dtype", "shape") if k not in entry]
    return Feature(name, text["dtype"], text["shape"], text["encoding"],
                   problem=f"no {' or '.join(missing)}" if missing else "")


def read_errors(stream: BinaryIO) -> Tuple[List[ReasonGroup], List[ReasonGroup], int]:
    """Groups errors.jsonl rows by stage and reason, streaming (the file can have millions of rows).

    Returns:
      (rejected groups, skipped groups, lines that were not JSON objects); groups by count, largest first.
    """
    groups: Dict[Tuple[bool, str, str], ReasonGroup] = {}
    bad = 0
    for row in _json_objects(stream):
        if row is None:
            bad += 1
            continue
        reason = str(row.get("reason", ""))
        key = (bool(row.get("skipped")), str(row.get("stage", "")), _QUOTED.sub("'…'", reason))
        group = groups.setdefault(key, ReasonGroup(key[1], key[2]))
        group.count += 1
        if len(group.examples) < _EXAMPLES_PER_REASON:
            group.examples.append((str(row.get("key") or row.get("uri", "")), str(row.get("split", "")), reason))
    order = sorted(groups.items(), key=lambda kv: (-kv[1].count, kv[0]))
    return [g for k, g in order if not k[0]], [g for k, g in order if k[0]], bad


def read_duplicates(stream: BinaryIO) -> Tuple[List[dict], int]:
    """Returns (rows of duplicates.jsonl, lines that were not such rows); each row is
    {content, members: [{key, split, uri, label}], ...} (no member label before label conflicts
    were counted)."""
    rows, bad = [], 0
    for row in _json_objects(stream):
        if row is None or not isinstance(row.get("members"), list):
            bad += 1
            continue
        rows.append(row)
    return rows, bad


def _json_objects(stream: BinaryIO) -> Iterator[Optional[dict]]:
    """Yields each non-blank line of a JSONL stream as a dict, or None where it is not a JSON object."""
    for line in stream:
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            yield None
            continue
        yield row if isinstance(row, dict) else None
