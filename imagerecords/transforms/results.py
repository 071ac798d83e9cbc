"""RecordResults: the graph's last step writes errors.jsonl and results.json into staging.

The graph only computes; the launcher (or `imagerecords finish`) reads results.json, decides the
reject budget and commits. A results.json in staging therefore means every shard was written.
"""

from __future__ import annotations

from typing import Any, Mapping

import apache_beam as beam

from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import results as results_lib

__all__ = ["RecordResults"]


def _record(_, results, rejected, labels, duplicates, build_id=None, *, build, **kwargs) -> publish.BuildResults:
    if build_id is not None:  # named when the pipeline runs (WriteDataset), not when it was built
        build = dict(build, build_id=build_id)
    return results_lib.record_results(results, rejected, labels, duplicates, build=build, **kwargs)


class RecordResults(beam.PTransform):
    """Consumes {'results', 'rejected', 'labels', 'duplicates'} and writes them into staging once,
    on one worker. Without duplicate detection ('duplicates' absent), no duplicates.jsonl is staged.

    Input: {'results': ShardResult, 'rejected': Rejected, 'labels': singleton LabelMap, and
    optionally 'duplicates': DuplicateGroup, 'near': NearGroup (FindNearDuplicates) and 'build_id':
    a singleton str naming the build when it runs (then `build_id` here is ignored)}.
    Output: a single BuildResults.

    Args:
      output: the dataset folder.
      header: the build's own fields of results.json (publish.results.header).
    """

    def __init__(self, output: str, header: Mapping[str, Any]):
        super().__init__()
        if not output:
            raise ValueError("RecordResults: output folder is empty")
        self._output = output
        self._build = dict(header)

    def expand(self, inputs):
        results = inputs["results"] | "CollectShards" >> beam.combiners.ToList()
        rejected = inputs["rejected"] | "CollectRejected" >> beam.combiners.ToList()
        find_duplicates = "duplicates" in inputs
        duplicates = (inputs["duplicates"] if find_duplicates
                      else inputs["results"].pipeline | "NoDuplicates" >> beam.Create([]))
        duplicates = duplicates | "CollectDuplicates" >> beam.combiners.ToList()
        named = [beam.pvalue.AsSingleton(inputs["build_id"])] if "build_id" in inputs else []
        # NearGroup, when the near-duplicate check ran (FindNearDuplicates)
        near = {"near": beam.pvalue.AsSingleton(inputs["near"] | "CollectNear" >> beam.combiners.ToList())} \
            if "near" in inputs else {}
        return (
            inputs["results"].pipeline
            | "Once" >> beam.Create([None])
            | "Write" >> beam.Map(_record, beam.pvalue.AsSingleton(results), beam.pvalue.AsSingleton(rejected),
                                  beam.pvalue.AsSingleton(inputs["labels"]), beam.pvalue.AsSingleton(duplicates),
                                  *named, output=self._output, build=self._build, find_duplicates=find_duplicates,
                                  **near)
        )
