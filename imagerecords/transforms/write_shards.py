"""WriteShards: one worker streams each shard to a temporary file in staging, renamed when complete."""

from __future__ import annotations

import concurrent.futures
from typing import Iterable, List, Optional, Tuple, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from imagerecords import codec, shard_writer, stages
from imagerecords.metadata import ShardResult
from imagerecords.refs import ImageRef, LabelMap
from imagerecords.transforms.common import CONTENTS, METRICS_NAMESPACE, REJECTED

__all__ = ["WriteShards"]


class _WriteShardFn(beam.DoFn):
    def __init__(self, output: str, build_id: str, name: str, preset: str, options: codec.ImageOptions,
                 threads: int, write_index: bool, progress_dir: Optional[str], contents: bool, resume: bool):
        self._output = output
        self._build_id = build_id
        self._resume = resume
        self._contents = contents
        self._name = name
        self._preset = preset
        self._options = options
        self._threads = threads
        self._write_index = write_index
        self._progress_dir = progress_dir
        self._written = Metrics.counter(METRICS_NAMESPACE, "written")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rejected_at_write")
        self._passthrough = Metrics.counter(METRICS_NAMESPACE, "passthrough")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")

    def setup(self):
        self._read = shard_writer.limited_reader(self._options)
        self._executor = concurrent.futures.ThreadPoolExecutor(self._threads) if self._threads > 1 else None

    def teardown(self):
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def process(self, element: Tuple[Tuple[str, int, int], List[ImageRef]], labels: LabelMap
                ) -> Iterable[Union[ShardResult, beam.pvalue.TaggedOutput]]:
        shard, refs = element
        staged = stages.stage_shard(
            shard, refs, output=self._output, build_id=self._build_id, name=self._name, preset=self._preset, labels=labels,
            options=self._options, read_bytes=self._read, executor=self._executor, window=2 * self._threads,
            write_index=self._write_index, progress_dir=self._progress_dir, contents=self._contents,
            resume=self._resume)
        self._written.inc(staged.result.shard.count)
        self._passthrough.inc(staged.passthrough)
        self._bytes.inc(staged.result.shard.num_bytes)
        for r in staged.rejected:
            self._rejected.inc()
            yield beam.pvalue.TaggedOutput(REJECTED, r)
        for item in staged.contents:
            yield beam.pvalue.TaggedOutput(CONTENTS, item)
        yield staged.result


class WriteShards(beam.PTransform):
    """Writes each (shard key, [ImageRef]) group as one TFRecord shard in `output`'s staging area.

    Outputs: main (ShardResult), REJECTED (Rejected: unreadable, undecodable, duplicate key) and
    CONTENTS ((16-byte digest of the source file, (key, split, uri, label name)) per written image; empty
    with contents=False, when no duplicate check consumes it).
    """

    def __init__(self, output: str, build_id: str, name: str, labels, preset: str = "tfds",
                 options: codec.ImageOptions = codec.ImageOptions(), threads: int = 4,
                 write_index: bool = False, progress_dir: Optional[str] = None, contents: bool = True,
                 resume: bool = False):
        super().__init__()
        if not output:
            raise ValueError("WriteShards: output folder is empty")
        if threads < 1:
            raise ValueError(f"WriteShards: threads must be >= 1, got {threads}")
        self._fn = _WriteShardFn(output, build_id, name, preset, options, threads, write_index, progress_dir, contents,
                                 resume)
        self._labels = labels

    def expand(self, shards):
        return shards | "Write" >> beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._labels)).with_outputs(
            REJECTED, CONTENTS, main="results")
