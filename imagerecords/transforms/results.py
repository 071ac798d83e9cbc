"""RecordResults: the graph's last step writes errors.jsonl and results.json into staging.

The graph only computes; the launcher (or `imagerecords finish`) reads results.json, decides the
reject budget and commits. A results.json in staging therefore means every shard was written.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

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
    optionally 'duplicates': DuplicateGroup and 'build_id': a singleton str naming the build when
    it runs (then `build_id` here is ignored)}.
    Output: a single BuildResults.

    Args:
      base: with --append, the published manifest (JSON) this build adds to; the commit merges it.
      max_download_failures: the budget of URLs that could not be downloaded; None: the default.
    """

    def __init__(self, output: str, *, build_id: str, name: str, schema: str, seed: int,
                 parameters: Mapping[str, Any], versions: Mapping[str, str], max_reject_fraction: float,
                 version_name: Optional[str] = None, base: Optional[Mapping[str, Any]] = None,
                 max_download_failures: Optional[float] = None):
        super().__init__()
        if not output:
            raise ValueError("RecordResults: output folder is empty")
        self._output = output
        self._build = dict(build_id=build_id, name=name, schema=schema, seed=seed, parameters=dict(parameters),
                           versions=dict(versions), max_reject_fraction=max_reject_fraction,
                           version_name=version_name, **({"base": dict(base)} if base is not None else {}),
                           **({"max_download_failures": max_download_failures}
                              if max_download_failures is not None else {}))

    def expand(self, inputs):
        results = inputs["results"] | "CollectShards" >> beam.combiners.ToList()
        rejected = inputs["rejected"] | "CollectRejected" >> beam.combiners.ToList()
        find_duplicates = "duplicates" in inputs
        duplicates = (inputs["duplicates"] if find_duplicates
                      else inputs["results"].pipeline | "NoDuplicates" >> beam.Create([]))
        duplicates = duplicates | "CollectDuplicates" >> beam.combiners.ToList()
        named = [beam.pvalue.AsSingleton(inputs["build_id"])] if "build_id" in inputs else []
        return (
            inputs["results"].pipeline
            | "Once" >> beam.Create([None])
            | "Write" >> beam.Map(_record, beam.pvalue.AsSingleton(results), beam.pvalue.AsSingleton(rejected),
                                  beam.pvalue.AsSingleton(inputs["labels"]), beam.pvalue.AsSingleton(duplicates),
                                  *named, output=self._output, build=self._build, find_duplicates=find_duplicates)
        )
