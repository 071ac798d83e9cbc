"""A build's results, written last into staging: errors.jsonl, duplicates.jsonl and results.json
(RecordResults in Beam, the local engine's last step)."""

from __future__ import annotations

from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

from imagerecords.format.manifest import DUPLICATES, ERRORS
from imagerecords.pipeline import staging
from imagerecords.pipeline import storage
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.plan.near import NearGroup
from imagerecords.pipeline.refs import DuplicateGroup, LabelMap, Rejected
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import hosts
from imagerecords.pipeline.write.dataset_files import ShardResult

# Duplicates and results ---------------------------------------------------------------------------


def errors_jsonl(rejected: Sequence[Rejected]) -> Iterator[bytes]:
    """errors.jsonl, line by line: one row per rejected or skipped input, in a fixed order."""
    for r in sorted(rejected, key=lambda r: (r.split, r.key, r.uri, r.stage, r.reason)):
        yield (r.to_json() + "\n").encode("utf-8")


def duplicates_jsonl(groups: Sequence[DuplicateGroup], near: Sequence[NearGroup] = ()) -> Iterator[bytes]:
    """duplicates.jsonl, line by line: one row per group of identical files, groups that leak
    across splits first, then label conflicts; then the near-duplicate groups ("kind": "near"), in
    the same order."""
    for g in sorted(groups, key=lambda g: (not g.leaks, not g.conflicts, g.members)):
        yield (g.to_json() + "\n").encode("utf-8")
    for n in sorted(near, key=lambda g: (not g.leaks, not g.conflicts, g.members)):
        yield (n.to_json() + "\n").encode("utf-8")


def header(config: BuildConfig, *, build_id: str, versions: Mapping[str, str],
           base: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """What results.json says of the build besides its shards and rows (BuildResults' fields): its
    id ('' when it is named as the job runs), the settings the manifest records, the budgets;
    `base`, an append's published manifest (JSON). Spelled here for every engine."""
    return dict(build_id=build_id, name=config.name, schema=config.schema, seed=config.split.seed,
                parameters=config.to_json(), versions=dict(versions), max_reject_fraction=config.publish.max_reject_fraction,
                max_download_failures=config.publish.max_download_failures, version_name=config.publish.version_name,
                **({"base": dict(base)} if base is not None else {}))


def record_results(results: Sequence[ShardResult], rejected: Sequence[Rejected], labels: LabelMap,
                   duplicates: Sequence[DuplicateGroup], *, output: str, build: Mapping[str, Any],
                   find_duplicates: bool, near: Optional[Sequence[NearGroup]] = None) -> publish.BuildResults:
    """Writes errors.jsonl, duplicates.jsonl (when looked for: identical files, or `near`, the
    near-duplicate groups, when not None) and, last, results.json into staging: the presence of
    results.json says every shard was written."""
    staged_dir = staging.staging_dir(output, build["build_id"])
    storage.write_bytes(storage.join(staged_dir, ERRORS), errors_jsonl(rejected))
    if find_duplicates or near is not None:
        storage.write_bytes(storage.join(staged_dir, DUPLICATES), duplicates_jsonl(duplicates if find_duplicates else (),
                                                                                near or ()))
    skipped = sum(1 for r in rejected if r.skipped)
    opted_out = sum(1 for r in rejected if r.opted_out)
    downloads = sum(1 for r in rejected if r.stage == "download" and not r.skipped)
    # An append's rows of keys the dataset holds are counted apart: present, not duplicated.
    groups = [g for g in duplicates if not g.already_present]
    out = publish.BuildResults(labels=labels.to_json(), shards=tuple(sorted(results, key=lambda r: (r.split, r.index))),
                               num_rejected=len(rejected) - skipped - opted_out, num_skipped=skipped,
                               num_download_failures=downloads, num_opted_out=opted_out,
                               failed_hosts=hosts.top_hosts(rejected),
                               near_groups=(len(near or ()), sum(1 for n in near or () if n.leaks)),
                               num_duplicate_groups=len(groups) if find_duplicates else -1,
                               num_leaking_groups=sum(1 for g in groups if g.leaks),
                               num_label_conflicts=sum(1 for g in groups if g.conflicts),
                               num_already_present=len(duplicates) - len(groups), **build)
    storage.write_bytes(storage.join(staged_dir, publish.RESULTS), publish.dumps(out.to_json()))
    return out
