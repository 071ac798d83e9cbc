"""The build graph: build_pipeline(p, config, ...) wires the stages; it computes, the launcher decides."""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Union

import apache_beam as beam

from imagerecords import transforms
from imagerecords.pipeline import staging
from imagerecords.pipeline import sources
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.read import politeness
from imagerecords.pipeline.publish import appending
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import DuplicateGroup, ImageRef, Rejected
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.sources import InputInfo
from imagerecords.transforms import (AssignLabels, FindDuplicates, FindNearDuplicates, GlobalShuffle, ListSource,
                                     RecordResults, WriteShards, WriteWithBeamSink)
from imagerecords.transforms.common import CONTENTS, NEAR, REJECTED


# The tag of the refs whose keys the published dataset already holds with the same content.
_KNOWN = "known"


class _AgainstBaseFn(beam.DoFn):
    """--append: keeps a ref whose key is new; a key the dataset holds becomes a duplicates.jsonl row
    (same content) or a rejected row (changed file), as appending.against decides for the local engine."""

    def __init__(self, base: appending.Base, config: BuildConfig, source: sources.Source):
        self._base = base
        self._source = source
        self._options = config.image
        self._splits = tuple(config.splits) if config.splits else None
        self._split_seed = config.split_seed

    def setup(self) -> None:
        self._read = self._source.reader(self._options)

    def process(self, ref: ImageRef) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        out = appending.against(ref, self._base, self._read, self._options, self._splits, self._split_seed)
        if isinstance(out, Rejected):
            yield beam.pvalue.TaggedOutput(REJECTED, out)
        elif isinstance(out, DuplicateGroup):
            yield beam.pvalue.TaggedOutput(_KNOWN, out)
        else:
            yield out


def build_pipeline(p: beam.Pipeline, config: BuildConfig, *, build_id: str, versions: Mapping[str, str],
                   label_map: Optional[refs_lib.LabelMap] = None, input_info: Optional[InputInfo] = None,
                   base: Optional[appending.Base] = None, commit: bool = False):
    """Adds the whole build to pipeline `p`: every shard lands in the output's staging area, and the
    last step writes staging/results.json. Nothing is published here (see imagerecords.pipeline.publish.commit).

    Args:
      p: the pipeline.
      config: what to build.
      build_id: the launcher's build id, recorded in the results.
      versions: library versions, recorded in the manifest.
      label_map: the ids of `config.label_map`, read by the launcher; None for the vocabulary seen.
      input_info: what the launcher's checks learned of the input (a CSV manifest's header line).
      base: with --append, the published dataset (appending.load_base): refs of keys it holds are
        dropped, its class ids grown, and its manifest recorded for the commit to merge.
      commit: end with the commit, as WriteDataset does (publish.commit_results on a worker, taking
        the lock its launcher took): a job that runs on without its launcher (a detached submit, a
        Dataflow template) publishes itself.

    Returns:
      A PCollection holding the single publish.BuildResults written.
    """
    source = politeness.divide(sources.for_build(config), p.options)  # --http_per_host holds job-wide
    info = input_info if input_info is not None else InputInfo(source.kind)
    listing = source.beam_listing(config, info, transforms)
    if listing is None:
        listing = ListSource(source, config, info)
    listed = p | listing.label >> listing
    refs = listed.refs
    rejected = [listed[REJECTED]]
    known = None
    if base is not None:
        checked = refs | "AgainstBase" >> beam.ParDo(_AgainstBaseFn(base, config, source)).with_outputs(
            REJECTED, _KNOWN, main="refs")
        refs, known = checked.refs, checked[_KNOWN]  # known: DuplicateGroup per key the dataset holds unchanged
        rejected.append(checked[REJECTED])
    labelled = refs | "AssignLabels" >> AssignLabels(
        label_map, source.label_type(config), config.label_offset, config.splits, config.split_seed, config.features,
        base_labels=base.labels if base is not None else None)
    # ImageRef with split and label_id set
    if config.writer == "shards":
        shuffled = labelled["refs"] | "GlobalShuffle" >> GlobalShuffle(
            config.seed, config.num_shards, config.target_shard_mb, config.min_shards)
        # ((split, shard index, num shards), [ImageRef sorted by hash])
        written = shuffled["shards"] | "WriteShards" >> WriteShards(
            config.output, labelled["labels"], build_id=build_id, config=config, source=source)
    else:
        split_names = [n for n, _ in config.splits] if config.splits else list(config.split_names or ["train"])
        written = labelled["refs"] | "WriteWithBeamSink" >> WriteWithBeamSink(
            staging.staging_dir(config.output, build_id), config.name, labelled["labels"], split_names,
            config.num_shards or config.min_shards, config.schema, config.image, source)
    rejected = (*rejected, labelled[REJECTED], written[REJECTED]) | "AllRejected" >> beam.Flatten()
    outcome = {"results": written["results"], "rejected": rejected, "labels": labelled["labels"]}
    if config.writer == "shards" and (not config.skip_duplicate_check or known is not None):
        found = written[CONTENTS] | "FindDuplicates" >> FindDuplicates()
        # DuplicateGroup per content shared by two or more keys
        outcome["duplicates"] = found if known is None else (found, known) | "WithKnown" >> beam.Flatten()
    if config.writer == "shards" and config.near_duplicates == "report":
        hashed = written[NEAR]
        if base is not None:  # the dataset's records, from its hashes files: compared with this build's
            # Hashes travel as hex: the coder Create infers for ints is signed 64-bit, and hashes are unsigned.
            dataset = [(f"{h:016x}", *rest) for h, *rest in appending.near_items(config.output, base.manifest)]
            hashed = (hashed, p | "DatasetHashes" >> beam.Create(dataset)
                      | "Unhex" >> beam.Map(lambda item: (int(item[0], 16), *item[1:]))) | "WithDataset" >> beam.Flatten()
        outcome["near"] = hashed | "FindNearDuplicates" >> FindNearDuplicates()
    results = outcome | "RecordResults" >> RecordResults(
        config.output, build_id=build_id, name=config.name, schema=config.schema, seed=config.seed,
        parameters=config.to_json(), versions=versions, max_reject_fraction=config.max_reject_fraction,
        max_download_failures=config.max_download_failures, version_name=config.version_name,
        base=base.manifest.to_json() if base is not None else None)
    if commit:
        # the same last step as WriteDataset's: the published Manifest
        return (p | "Last" >> beam.Create([None])
                | "Commit" >> beam.Map(_commit, beam.pvalue.AsSingleton(results), output=config.output,
                                       keep_versions=config.keep_versions, overwrite=config.overwrite))
    return results


def _commit(_, results: publish.BuildResults, *, output: str, keep_versions: int, overwrite: bool):
    return publish.commit_results(output, results, keep_versions=keep_versions, overwrite=overwrite, own_job=True)


