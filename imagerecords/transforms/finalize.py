"""Finalize: errors.jsonl, the error budget, then the metadata files with manifest.json last."""

from __future__ import annotations

import datetime
import logging
from typing import Dict, List, Mapping, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from imagerecords import metadata
from imagerecords.metadata import ShardResult
from imagerecords.refs import LabelMap, Rejected
from imagerecords.transforms.common import write_bytes

__all__ = ["Finalize", "RejectBudgetExceeded"]


class RejectBudgetExceeded(RuntimeError):
    """More inputs were rejected than the build allows; nothing was published."""


def _stale_files(output: str, name: str, keep: Sequence[str]) -> List[str]:
    """This tool's files that the new build did not write: shards (and their .index) of an earlier
    build that the new manifest does not list, and temporary files a killed build left."""
    patterns = [FileSystems.join(output, f"{name}-*.tfrecord-*"), FileSystems.join(output, f".{name}-*.tmp")]
    found = [m.path for r in FileSystems.match(patterns) for m in r.metadata_list]
    keep_set = set(keep) | {k + ".index" for k in keep}
    return sorted(p for p in found if p.rsplit("/", 1)[-1] not in keep_set)


def finalize(_, results: Sequence[ShardResult], rejected: Sequence[Rejected], labels: LabelMap, *,
             output: str, name: str, schema: str, seed: int, parameters: Mapping[str, object],
             versions: Mapping[str, str], max_reject_fraction: float, overwrite: bool) -> Dict[str, object]:
    """Writes the build's metadata; returns the manifest.

    Raises:
      RejectBudgetExceeded: when the rejected fraction is over budget (errors.jsonl is written
        first, manifest.json is not).
    """
    rows = sorted(rejected, key=lambda r: (r.split, r.key, r.uri, r.reason))
    write_bytes(FileSystems.join(output, metadata.ERRORS), "".join(r.to_json() + "\n" for r in rows).encode("utf-8"))
    written = sum(r.count for r in results)
    total = written + len(rows)
    if total == 0:
        raise RejectBudgetExceeded(f"no images were listed from the input; nothing written to {output}")
    if len(rows) > max_reject_fraction * total:
        raise RejectBudgetExceeded(
            f"{len(rows)} of {total} inputs rejected ({100 * len(rows) / total:.2f}%), over the budget of "
            f"{100 * max_reject_fraction:g}% (--max_reject_fraction); reasons are in "
            f"{FileSystems.join(output, metadata.ERRORS)}; the dataset was not published")
    manifest = metadata.build_manifest(
        name=name, schema=schema, label_map=labels.to_json(), seed=seed, parameters=parameters,
        shards=results, num_rejected=len(rows), versions=versions,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
    if overwrite:
        stale = _stale_files(output, name, [r.filename for r in results])
        if stale:
            logging.info("removing %d files of an earlier build: %s", len(stale), stale[:3])
            FileSystems.delete(stale)
    for filename, content in metadata.metadata_files(manifest):
        write_bytes(FileSystems.join(output, filename), content)
    return manifest


class Finalize(beam.PTransform):
    """Consumes {'results', 'rejected', 'labels'} and writes the metadata once, on one worker.

    Output: a single manifest dict.
    """

    def __init__(self, output: str, name: str, schema: str, seed: int, parameters: Mapping[str, object],
                 versions: Mapping[str, str], max_reject_fraction: float, overwrite: bool):
        super().__init__()
        if not output:
            raise ValueError("Finalize: output folder is empty")
        self._kwargs = dict(output=output, name=name, schema=schema, seed=seed, parameters=dict(parameters),
                            versions=dict(versions), max_reject_fraction=max_reject_fraction, overwrite=overwrite)

    def expand(self, inputs):
        results = inputs["results"] | "CollectShards" >> beam.combiners.ToList()
        rejected = inputs["rejected"] | "CollectRejected" >> beam.combiners.ToList()
        return (
            inputs["results"].pipeline
            | "Once" >> beam.Create([None])
            | "Write" >> beam.Map(finalize, beam.pvalue.AsSingleton(results), beam.pvalue.AsSingleton(rejected),
                                  beam.pvalue.AsSingleton(inputs["labels"]), **self._kwargs)
        )
