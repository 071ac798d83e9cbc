"""What the report reads beside the typed manifest (errors.jsonl, duplicates.jsonl), and the manifest's declared features."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any, BinaryIO, Dict, Iterator, List, Optional, Tuple

from imagerecords.format import features as feature_spec
from imagerecords.format.manifest import DUPLICATES, ERRORS, Manifest
from imagerecords.pipeline.refs import OPTED_OUT
from imagerecords.pipeline.publish import hosts as hosts_lib
from imagerecords.pipeline.storage import join, open_if_exists

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
class FeatureRow:
    """One entry of manifest.json's `features`, as the report lists it.

    Attributes:
      name: the feature key.
      dtype: its dtype ('' when not given).
      shape: a numeric tensor's shape as JSON text, e.g. '[null, 4]' (null: a variable dimension); '' otherwise.
      encoding: how its values are stored (png/keep/jpeg for an image, list/bytes for a tensor); '' when none.
      problem: why the entry is not a declaration imagerecords reads (the message names the feature); ''
        when it is.
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
      opted_out: groups of opted-out rows (URLs their sites opted out of).
      hosts: the hosts with the most failed or opted-out URLs, by reason (hosts.HostRow).
      bad_error_lines: errors.jsonl lines that were not JSON objects.
      duplicates: duplicates.jsonl rows of identical content; None when the file is absent.
      near: duplicates.jsonl rows of near-duplicates ("kind": "near").
      bad_duplicate_lines: duplicates.jsonl lines that were not rows.
      features: the manifest's declared features (Manifest.features), by name; None when it declares none.
    """

    rejected: Optional[List[ReasonGroup]] = None
    skipped: List[ReasonGroup] = dataclasses.field(default_factory=list)
    opted_out: List[ReasonGroup] = dataclasses.field(default_factory=list)
    hosts: Tuple[hosts_lib.HostRow, ...] = ()
    bad_error_lines: int = 0
    duplicates: Optional[List[dict]] = None
    near: List[dict] = dataclasses.field(default_factory=list)
    bad_duplicate_lines: int = 0
    features: Optional[List[FeatureRow]] = None


def read_extras(output: str, manifest: Manifest) -> Extras:
    """Reads the errors and duplicates files of the dataset in `output`, where they exist."""
    extras = Extras()
    stream = open_if_exists(join(output, manifest.errors_file or ERRORS))
    if stream is not None:
        with stream:
            counts = hosts_lib.HostCounts()
            groups, extras.skipped, extras.bad_error_lines = read_errors(stream, counts)
            extras.rejected = [g for g in groups if g.stage != OPTED_OUT]
            extras.opted_out = [g for g in groups if g.stage == OPTED_OUT]
            extras.hosts = counts.top()
    stream = open_if_exists(join(output, DUPLICATES))
    if stream is not None:
        with stream:
            rows, extras.bad_duplicate_lines = read_duplicates(stream)
        # Near-duplicates are another kind of row: the identical-content sections never count them.
        extras.duplicates = [r for r in rows if r.get("kind") != "near"]
        extras.near = [r for r in rows if r.get("kind") == "near"]
    extras.features = read_features(manifest)
    return extras


def read_features(manifest: Manifest) -> Optional[List[FeatureRow]]:
    """A row per declared feature of `manifest`, sorted by name; None when it declares none."""
    if not manifest.features:
        return None
    return [_feature(str(name), manifest.features[name]) for name in sorted(manifest.features)]


def valid_features(manifest: Manifest) -> Dict[str, Any]:
    """The declarations of `manifest` that the builder's spec reads ({name: entry}); the others are listed
    with their problem (FeatureRow.problem) and their values are not read."""
    out = {}
    for name in sorted(manifest.features):
        try:
            feature_spec.from_json(str(name), manifest.features[name])
        except feature_spec.SpecError:
            continue
        out[name] = manifest.features[name]
    return out


def _feature(name: str, entry: Any) -> FeatureRow:
    """The entry read by the builder's own spec (so defaults, e.g. an image's png, show as they apply)."""
    try:
        spec = feature_spec.from_json(name, entry)
    except feature_spec.SpecError as e:
        raw = entry if isinstance(entry, dict) else {}
        return FeatureRow(name, *(_text(raw.get(k)) for k in ("dtype", "shape", "encoding")), problem=str(e))
    return FeatureRow(name, spec.dtype, json.dumps(list(spec.shape)) if spec.numeric else "", spec.encoding)


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else json.dumps(value)


def read_errors(stream: BinaryIO, hosts: Optional[hosts_lib.HostCounts] = None
                ) -> Tuple[List[ReasonGroup], List[ReasonGroup], int]:
    """Groups errors.jsonl rows by stage and reason, streaming (the file can have millions of rows);
    `hosts`, when given, counts each URL row by host too.

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
        if hosts is not None:
            hosts.add_row(row)
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
