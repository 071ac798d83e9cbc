"""WriteShards: one worker streams each shard to a temporary file in staging, renamed when complete."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from imagerecords.pipeline import storage
from imagerecords.pipeline.config import BuildConfig, make_config
from imagerecords.pipeline.refs import ImageRef, LabelMap
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline.write import shard_writer
from imagerecords.pipeline.write.dataset_files import ShardResult
from imagerecords.transforms.common import CONTENTS, METRICS_NAMESPACE, NEAR, REJECTED

__all__ = ["WriteShards", "options_config"]

# BuildConfig needs an input; a pipeline's own rows have no path, so this stands for them.
PIPELINE_INPUT = "(rows of a Beam pipeline)"


def options_config(owner: str, output: str, options: Mapping[str, Any]) -> BuildConfig:
    """The validated BuildConfig of a transform's keyword options (BuildConfig's field names, and
    ImageOptions' ones such as quality or max_file_mb; `features` as a {name: declaration} mapping).

    Raises:
      ValueError: prefixed with `owner`, naming the unknown option or the bad value.
    """
    if not isinstance(output, str) or not output.strip():
        raise ValueError(f"{owner}: output must be a folder path or URI, got {output!r}")
    if not storage.has_scheme(output) and os.path.exists(output) and not os.path.isdir(output):
        raise ValueError(f"{owner}: output {output} is a file, not a folder")
    if "input" in options or "output" in options:
        raise ValueError(f"{owner}: 'input' and 'output' are not options here")
    try:
        return make_config({"input": PIPELINE_INPUT, "output": output}, dict(options))
    except (ValueError, TypeError) as e:  # SpecError is a ValueError
        raise ValueError(f"{owner}: {e}") from None


class _WriteShardFn(beam.DoFn):
    def __init__(self, writer: shard_writer.ShardWriter, threads: int):
        self._writer = writer
        self._threads = threads
        self._written = Metrics.counter(METRICS_NAMESPACE, "written")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rejected_at_write")
        self._passthrough = Metrics.counter(METRICS_NAMESPACE, "passthrough")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")

    def setup(self):
        self._read = self._writer.reader()
        self._executor = concurrent.futures.ThreadPoolExecutor(self._threads) if self._threads > 1 else None

    def teardown(self):
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def process(self, element: Union[Tuple[Tuple[str, int, int], List[ImageRef]],
                                     Tuple[Tuple[str, int, int], List[ImageRef], Dict[str, bytes]]],
                labels: LabelMap, build_id: Optional[str] = None
                ) -> Iterable[Union[ShardResult, beam.pvalue.TaggedOutput]]:
        shard, refs = element[0], element[1]
        # A third member holds the bytes of rows that carried them (WriteDataset): {uri: bytes}.
        carried = element[2] if len(element) > 2 else None
        read = self._read if not carried else (lambda uri: carried[uri] if uri in carried else self._read(uri))
        writer = self._writer if build_id is None else dataclasses.replace(self._writer, build_id=build_id)
        staged = writer.write(shard, refs, labels, read_bytes=read, executor=self._executor, window=2 * self._threads)
        self._written.inc(staged.result.shard.count)
        self._passthrough.inc(staged.passthrough)
        self._bytes.inc(staged.result.shard.num_bytes)
        for r in staged.rejected:
            self._rejected.inc()
            yield beam.pvalue.TaggedOutput(REJECTED, r)
        for item in staged.contents:
            yield beam.pvalue.TaggedOutput(CONTENTS, item)
        for item in staged.near:
            yield beam.pvalue.TaggedOutput(NEAR, item)
        yield staged.result


class WriteShards(beam.PTransform):
    """Writes each shard group as one TFRecord shard into a build's staging area in `output`
    (`<output>/.staging/<build id>/`), `threads` images at a time per worker. Nothing is published:
    WriteDataset adds the results and the commit; this is the step for pipelines that publish
    their own way.

    Input: (ShardKey, [ImageRef in shard order]) from GlobalShuffle, where ShardKey is
    (split, shard index, shards in the split).
    Outputs: 'results' (ShardResult per shard), REJECTED (Rejected: unreadable, undecodable,
    duplicate key) and CONTENTS ((16-byte digest of the source bytes, (key, split, uri, label
    name)) per written image; empty with skip_duplicate_check) and NEAR (near.Item per hashed image;
    empty with near_duplicates 'off').

    Example:
        labelled = refs | AssignLabels()
        shards = labelled["refs"] | GlobalShuffle(seed=0)
        written = shards["shards"] | WriteShards("/data/out", labelled["labels"], name="flowers")

    Args:
      output: the output folder (local path or FileSystems URI).
      labels: a singleton PCollection of LabelMap (AssignLabels' 'labels').
      build_id: names the staging area; None for a new one (output_lock.new_build_id()).
      config: a whole BuildConfig instead of `options` (the build graph's own use).
      source: the sources.Source the refs come from, which reads them; None: refs that name files.
      **options: BuildConfig's field names (name, schema, write_index, features, threads, ...) and
        ImageOptions' (quality, resize, image_encoding, max_file_mb, ...).

    Raises:
      ValueError: naming the bad option or value.
    """

    def __init__(self, output: str, labels, *, build_id: Optional[str] = None, config: Optional[BuildConfig] = None,
                 build_ids=None, source=None, **options):
        super().__init__()
        if config is not None and options:
            raise ValueError(f"WriteShards: pass a config or options, not both (got {', '.join(sorted(options))})")
        if config is None:
            config = options_config("WriteShards", output, options)
        elif config.output != output:
            raise ValueError(f"WriteShards: output {output!r} differs from the config's {config.output!r}")
        self.build_id = build_id or output_lock.new_build_id()
        self._fn = _WriteShardFn(shard_writer.ShardWriter.of(config, self.build_id, source), config.threads)
        self._labels = labels
        self._build_ids = build_ids  # a singleton PCollection naming the build when it runs (WriteDataset)

    def expand(self, shards):
        extra = [beam.pvalue.AsSingleton(self._build_ids)] if self._build_ids is not None else []
        return shards | "Write" >> beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._labels), *extra).with_outputs(
            REJECTED, CONTENTS, NEAR, main="results")
