"""The command's build graph: build_pipeline(p, config, ...) lists the input (and with --append checks it
against the published dataset) in front of the one build graph, transforms.dataset_graph; it computes,
the launcher decides."""

from __future__ import annotations

from typing import Iterable, Optional, Union

import apache_beam as beam

from imagerecords import transforms
from imagerecords.pipeline import sources
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.read import politeness
from imagerecords.pipeline.publish import appending
from imagerecords.pipeline.publish.build import Build
from imagerecords.pipeline.refs import DuplicateGroup, ImageRef, Rejected
from imagerecords.pipeline.sources import InputInfo
from imagerecords.transforms import ListSource
from imagerecords.transforms.common import REJECTED
from imagerecords.transforms.dataset_graph import write_dataset


# The tag of the refs whose keys the published dataset already holds with the same content.
_KNOWN = "known"


class _AgainstBaseFn(beam.DoFn):
    """--append: keeps a ref whose key is new; a key the dataset holds becomes a duplicates.jsonl row
    (same content) or a rejected row (changed file), as appending.against decides for the local engine."""

    def __init__(self, base: appending.Base, config: BuildConfig, source: sources.Source):
        self._base = base
        self._source = source
        self._options = config.image
        self._splits = tuple(config.split.splits) if config.split.splits else None
        self._split_seed = config.split.split_seed

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


def build_pipeline(p: beam.Pipeline, build: Build, *, input_info: Optional[InputInfo] = None, commit: bool = False):
    """Adds the whole build to pipeline `p`: every shard lands in the output's staging area, and the
    last step writes staging/results.json. Nothing is published here (see imagerecords.pipeline.publish.commit).

    Args:
      p: the pipeline.
      build: the build (config, id, versions, label map; with --append the published dataset, whose
        keys' refs are dropped, class ids grown and manifest recorded for the commit to merge).
      input_info: what the launcher's checks learned of the input (a CSV manifest's header line).
      commit: end with the commit, as WriteDataset does (lifecycle.conclude on a worker, taking
        the lock its launcher took): a job that runs on without its launcher (a detached submit, a
        Dataflow template) publishes itself.

    Returns:
      A PCollection holding the single publish.BuildResults written.
    """
    config, base = build.config, build.base
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
    return write_dataset(p, refs, rejected, build, source=source, known=known, commit=commit, own_job=True)
