"""RecordResults: the graph's last step writes errors.jsonl and results.json into staging.

The graph only computes; the launcher (or `imagerecords finish`) reads results.json, decides the
reject budget and commits. A results.json in staging therefore means every shard was written.
"""

from __future__ import annotations

from typing import Any, Mapping

import apache_beam as beam

from imagerecords.build import publish, stages

__all__ = ["RecordResults"]


def _record(_, results, rejected, labels, duplicates, **kwargs) -> publish.BuildResults:
    return stages.record_results(results, rejected, labels, duplicates, **kwargs)


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
            | "Write" >> beam.Map(_record, beam.pvalue.AsSingleton(results), beam.pvalue.AsSingleton(rejected),
                                  beam.pvalue.AsSingleton(inputs["labels"]), beam.pvalue.AsSingleton(duplicates),
                                  output=self._output, build=self._build, find_duplicates=find_duplicates)
        )
