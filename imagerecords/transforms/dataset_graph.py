"""The one wiring of a build's Beam graph behind its refs: labels, the global shuffle, the shard
writers, the duplicate and near-duplicate reports, the results and, when asked, the commit.

The command's Beam engine puts a listing in front of it (builder/engines/beam/graph.py), WriteDataset
the user's rows; a build-level step is added here once, for both."""

from __future__ import annotations

from typing import Any, List, Sequence

import apache_beam as beam

from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline import staging
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline.publish import appending
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import lifecycle
from imagerecords.pipeline.publish.build import Build
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.transforms.beam_sink import WriteWithBeamSink
from imagerecords.transforms.common import CONTENTS, NEAR, REJECTED
from imagerecords.transforms.duplicates import FindDuplicates
from imagerecords.transforms.labels import AssignLabels
from imagerecords.transforms.near_duplicates import FindNearDuplicates
from imagerecords.transforms.results import RecordResults
from imagerecords.transforms.shuffle import GlobalShuffle
from imagerecords.transforms.write_shards import WriteShards


def write_dataset(p: beam.Pipeline, refs, rejected: Sequence[Any], build: Build, *, source, build_ids=None,
                  carried=None, known=None, commit: bool = False, own_job: bool = False):
    """Adds a build behind `refs` to pipeline `p`: every shard lands in the output's staging area and
    the results last; with `commit`, a final step publishes them.

    Args:
      p: the pipeline.
      refs: the listed ImageRefs (no split or label id yet).
      rejected: the PCollections of Rejected rows found before this point (the listing's, the rows').
      build: the build: its config, id ('' when `build_ids` names it as the job runs: WriteDataset),
        versions, label map (None: the vocabulary seen) and, with --append, the published dataset
        (its class ids grown, its hashes compared).
      source: the sources.Source whose reader the shard writers read the refs with (its downloads'
        per-host limit already divided among the job's downloaders).
      build_ids: a singleton PCollection of the build id, or None.
      carried: (ImageRef, bytes) of rows that carried their image, joined to their shard (WriteDataset).
      known: DuplicateGroups of the keys `base` holds unchanged, or None.
      commit: end with the commit on a worker (lifecycle.conclude: PIPELINE, or with `own_job` JOB, the
        lock its launcher took: a detached or templated command's job).

    Returns:
      The single BuildResults staged, or with `commit` the published Manifest.
    """
    config, label_map, base, build_id = build.config, build.label_map, build.base, build.build_id
    labelled = refs | "AssignLabels" >> AssignLabels(
        label_map, source.label_type(config), config.labels.label_offset, config.split.splits, config.split.split_seed, config.features,
        base_labels=base.labels if base is not None else None)
    # ImageRef with split and label_id set
    if config.writer == "shards":
        shuffled = labelled["refs"] | "GlobalShuffle" >> GlobalShuffle.of(config.split, config.shards)
        # ((split, shard index, num shards), [ImageRef sorted by hash])
        shards = shuffled["shards"]
        if carried is not None:  # the carried bytes join their shard
            carried_shards = carried | "CarriedShard" >> beam.FlatMap(
                _carried_shard, beam.pvalue.AsSingleton(labelled["labels"]), beam.pvalue.AsDict(shuffled["plans"]),
                config.split.splits, config.split.split_seed, config.split.seed)
            # (ShardKey, (uri, bytes))
            shards = ({"refs": shards, "bytes": carried_shards}
                      | "JoinBytes" >> beam.CoGroupByKey()
                      | "WithBytes" >> beam.Map(_with_bytes))
            # (ShardKey, [ImageRef], {uri: bytes})
        written = shards | "WriteShards" >> WriteShards(
            config.output, labelled["labels"], build_id=build_id or None, build_ids=build_ids, config=config,
            source=source)
    else:
        split_names = [n for n, _ in config.split.splits] if config.split.splits else list(config.split.split_names or ["train"])
        written = labelled["refs"] | "WriteWithBeamSink" >> WriteWithBeamSink(
            staging.staging_dir(config.output, build_id), config.name, labelled["labels"], split_names,
            config.shards.num_shards or config.shards.min_shards, config.schema, config.image, source)
    rejected = (*rejected, labelled[REJECTED], written[REJECTED]) | "AllRejected" >> beam.Flatten()
    outcome = {"results": written["results"], "rejected": rejected, "labels": labelled["labels"]}
    if build_ids is not None:
        outcome["build_id"] = build_ids
    if config.writer == "shards" and (not config.publish.skip_duplicate_check or known is not None):
        found = written[CONTENTS] | "FindDuplicates" >> FindDuplicates()
        # DuplicateGroup per content shared by two or more keys
        outcome["duplicates"] = found if known is None else (found, known) | "WithKnown" >> beam.Flatten()
    if config.writer == "shards" and config.publish.near_duplicates == "report":
        hashed = written[NEAR]
        if base is not None:  # the dataset's records, from its hashes files: compared with this build's
            # Hashes travel as hex: the coder Create infers for ints is signed 64-bit, and hashes are unsigned.
            dataset = [(f"{h:016x}", *rest) for h, *rest in appending.near_items(config.output, base.manifest)]
            hashed = (hashed, p | "DatasetHashes" >> beam.Create(dataset)
                      | "Unhex" >> beam.Map(lambda item: (int(item[0], 16), *item[1:]))) | "WithDataset" >> beam.Flatten()
        outcome["near"] = hashed | "FindNearDuplicates" >> FindNearDuplicates()
    results = outcome | "RecordResults" >> RecordResults(config.output, build.header())
    if not commit:
        return results
    # a single BuildResults, staged; the commit publishes it
    return (p | "Last" >> beam.Create([None])
            | "Commit" >> beam.Map(_commit, beam.pvalue.AsSingleton(results), output=config.output,
                                   keep_versions=config.publish.keep_versions, overwrite=config.publish.overwrite, own_job=own_job))


def _carried_shard(pair, labels: LabelMap, plans, splits, split_seed: int, seed: int):
    ref, data = pair
    out = assign_lib.assign(ref, labels, splits, split_seed)  # the split AssignLabels gives the same ref
    if isinstance(out, Rejected) or out.split not in plans:
        return
    plan = plans[out.split]
    yield (out.split, plan.shard_of(refs_lib.shuffle_hash(seed, out.key)), plan.num_shards), (out.uri, data)


def _with_bytes(item):
    shard, grouped = item
    found: List[ImageRef] = next(iter(grouped["refs"]), [])
    return shard, found, dict(grouped["bytes"])


def _commit(_, results: publish.BuildResults, *, output: str, keep_versions: int, overwrite: bool, own_job: bool):
    return lifecycle.conclude(output, results, lifecycle.JOB if own_job else lifecycle.PIPELINE,
                              keep_versions=keep_versions, overwrite=overwrite)
