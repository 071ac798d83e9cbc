"""RecordResults: the graph's last step writes errors.jsonl and results.json into staging.

The graph only computes; the launcher (or `imagerecords finish`) reads results.json, decides the
reject budget and commits. A results.json in staging therefore means every shard was written.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import apache_beam as beam

from imagerecords import publish
from imagerecords.manifest import DUPLICATES, ERRORS
from imagerecords.metadata import ShardResult
from imagerecords.refs import DuplicateGroup, LabelMap, Rejected

__all__ = ["RecordResults"]


def errors_jsonl(rejected: Sequence[Rejected]) -> bytes:
    """errors.jsonl: one row per rejected or skipped input, in a fixed order."""
    rows = sorted(rejected, key=lambda r: (r.split, r.key, r.uri, r.stage, r.reason))
    return "".join(r.to_json() + "\n" for r in rows).encode("utf-8")


def duplicates_jsonl(groups: Sequence[DuplicateGroup]) -> bytes:
    """duplicates.jsonl: one row per group of identical files, groups that leak across splits first."""
    rows = sorted(groups, key=lambda g: (not g.leaks, g.members))
    return "".join(g.to_json() + "\n" for g in rows).encode("utf-8")


def record_results(_, results: Sequence[ShardResult], rejected: Sequence[Rejected], labels: LabelMap,
                   duplicates: Sequence[DuplicateGroup], *, output: str, build: Mapping[str, Any],
                   find_duplicates: bool) -> publish.BuildResults:
    staging = publish.staging_dir(output)
    publish.write_bytes(publish.join(staging, ERRORS), errors_jsonl(rejected))
    if find_duplicates:
        publish.write_bytes(publish.join(staging, DUPLICATES), duplicates_jsonl(duplicates))
    skipped = sum(1 for r in rejected if r.skipped)
    out = publish.BuildResults(labels=labels.to_json(), shards=tuple(sorted(results, key=lambda r: (r.split, r.index))),
                               num_rejected=len(rejected) - skipped, num_skipped=skipped,
                               num_duplicate_groups=len(duplicates) if find_duplicates else -1,
                               num_leaking_groups=sum(1 for g in duplicates if g.leaks), **build)
    # Written last: its presence says the whole graph completed.
    publish.write_bytes(publish.join(staging, publish.RESULTS), publish.dumps(out.to_json()))
    return out


class RecordResults(beam.PTransform):
    """Consumes {'results', 'rejected', 'labels', 'duplicates'} and writes them into staging once,
    on one worker. Without duplicate detection ('duplicates' absent), no duplicates.jsonl is staged.

    Output: a single BuildResults.
    """

    def __init__(self, output: str, *, build_id: str, name: str, schema: str, seed: int,
                 parameters: Mapping[str, Any], versions: Mapping[str, str], max_reject_fraction: float):
        super().__init__()
        if not output:
            raise ValueError("RecordResults: output folder is empty")
        self._output = output
        self._build = dict(build_id=build_id, name=name, schema=schema, seed=seed, parameters=dict(parameters),
                           versions=dict(versions), max_reject_fraction=max_reject_fraction)

    def expand(self, inputs):
        results = inputs["results"] | "CollectShards" >> beam.combiners.ToList()
        rejected = inputs["rejected"] | "CollectRejected" >> beam.combiners.ToList()
        find_duplicates = "duplicates" in inputs
        duplicates = (inputs["duplicates"] if find_duplicates
                      else inputs["results"].pipeline | "NoDuplicates" >> beam.Create([]))
        duplicates = duplicates | "CollectDuplicates" >> beam.combiners.ToList()
        return (
            inputs["results"].pipeline
            | "Once" >> beam.Create([None])
            | "Write" >> beam.Map(record_results, beam.pvalue.AsSingleton(results), beam.pvalue.AsSingleton(rejected),
                                  beam.pvalue.AsSingleton(inputs["labels"]), beam.pvalue.AsSingleton(duplicates),
                                  output=self._output, build=self._build, find_duplicates=find_duplicates)
        )
