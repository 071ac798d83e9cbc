"""The build graph: build_pipeline(p, config, ...) wires the stages; it computes, the launcher decides."""

from __future__ import annotations

from typing import Mapping, Optional

import apache_beam as beam

from imagerecords.build import refs as refs_lib
from imagerecords.build import arrays, publish, stages
from imagerecords.build.config import BuildConfig
from imagerecords.build.engines.beam import (AssignLabels, FindDuplicates, GlobalShuffle, ListImages, ReadManifest,
                                     RecordResults, WriteShards, WriteWithBeamSink)
from imagerecords.build.engines.beam.array_rows import ListRows
from imagerecords.build.engines.beam.common import CONTENTS, REJECTED


def build_pipeline(p: beam.Pipeline, config: BuildConfig, *, build_id: str, versions: Mapping[str, str],
                   label_map: Optional[refs_lib.LabelMap] = None, csv_header: Optional[str] = None):
    """Adds the whole build to pipeline `p`: every shard lands in the output's staging area, and the
    last step writes staging/results.json. Nothing is published here (see imagerecords.build.publish).

    Args:
      p: the pipeline.
      config: what to build.
      build_id: the launcher's build id, recorded in the results.
      versions: library versions, recorded in the manifest.
      label_map: the ids of `config.label_map`, read by the launcher; None for the vocabulary seen.
      csv_header: a CSV manifest's header line, read by the launcher's checks.

    Returns:
      A PCollection holding the single publish.BuildResults written.
    """
    if arrays.is_arrays_input(config.input):
        listed = p | "ListRows" >> ListRows(config.input, config.schema, config.image.image_encoding)
    elif refs_lib.is_manifest(config.input):
        columns = config.manifest_columns()
        listed = p | "ReadManifest" >> ReadManifest(config.input, columns, config.image.max_file_bytes, csv_header,
                                                    stat=not config.skip_stat)
    else:
        listed = p | "ListImages" >> ListImages(config.input, config.image.max_file_bytes)
    labelled = listed.refs | "AssignLabels" >> AssignLabels(
        label_map, config.label_type, config.label_offset, config.splits, config.split_seed, config.features)
    # ImageRef with split and label_id set
    if config.writer == "shards":
        shuffled = labelled["refs"] | "GlobalShuffle" >> GlobalShuffle(
            config.seed, config.num_shards, config.target_shard_mb, config.min_shards)
        # ((split, shard index, num shards), [ImageRef sorted by hash])
        written = shuffled["shards"] | "WriteShards" >> WriteShards(
            stages.ShardWriter.of(config, build_id), labelled["labels"], config.threads)
    else:
        split_names = [n for n, _ in config.splits] if config.splits else list(config.split_names or ["train"])
        written = labelled["refs"] | "WriteWithBeamSink" >> WriteWithBeamSink(
            publish.staging_dir(config.output, build_id), config.name, labelled["labels"], split_names,
            config.num_shards or config.min_shards, config.schema, config.image)
    rejected = (listed[REJECTED], labelled[REJECTED], written[REJECTED]) | "AllRejected" >> beam.Flatten()
    outcome = {"results": written["results"], "rejected": rejected, "labels": labelled["labels"]}
    if config.writer == "shards" and not config.skip_duplicate_check:
        outcome["duplicates"] = written[CONTENTS] | "FindDuplicates" >> FindDuplicates()
        # DuplicateGroup per content shared by two or more keys
    return outcome | "RecordResults" >> RecordResults(
        config.output, build_id=build_id, name=config.name, schema=config.schema, seed=config.seed,
        parameters=config.to_json(), versions=versions, max_reject_fraction=config.max_reject_fraction)


