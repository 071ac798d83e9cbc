"""WriteShards: one worker streams each shard to a temporary file in staging, renamed when complete."""

from __future__ import annotations

import concurrent.futures
from typing import Iterable, List, Tuple, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from imagerecords.build import shard_writer, stages
from imagerecords.build.dataset_files import ShardResult
from imagerecords.build.refs import ImageRef, LabelMap
from imagerecords.build.engines.beam.common import CONTENTS, METRICS_NAMESPACE, REJECTED

__all__ = ["WriteShards"]


class _WriteShardFn(beam.DoFn):
    def __init__(self, writer: stages.ShardWriter, threads: int):
        self._writer = writer
        self._threads = threads
        self._written = Metrics.counter(METRICS_NAMESPACE, "written")
        self._rejected = Metrics.counter(METRICS_NAMESPACE, "rejected_at_write")
        self._passthrough = Metrics.counter(METRICS_NAMESPACE, "passthrough")
        self._bytes = Metrics.counter(METRICS_NAMESPACE, "bytes_written")

    def setup(self):
        self._read = shard_writer.limited_reader(self._writer.options)
        self._executor = concurrent.futures.ThreadPoolExecutor(self._threads) if self._threads > 1 else None

    def teardown(self):
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def process(self, element: Tuple[Tuple[str, int, int], List[ImageRef]], labels: LabelMap
                ) -> Iterable[Union[ShardResult, beam.pvalue.TaggedOutput]]:
        shard, refs = element
        staged = self._writer.write(shard, refs, labels, read_bytes=self._read, executor=self._executor,
                                    window=2 * self._threads)
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
    """Writes each (shard key, [ImageRef]) group as one TFRecord shard with `writer` (a
    stages.ShardWriter) into its build's staging area, `threads` images at a time per worker.

    Outputs: main (ShardResult), REJECTED (Rejected: unreadable, undecodable, duplicate key) and
    CONTENTS ((16-byte digest of the source file, (key, split, uri, label name)) per written image;
    empty when the writer keeps no contents, because no duplicate check consumes them).
    """

    def __init__(self, writer: stages.ShardWriter, labels, threads: int = 4):
        super().__init__()
        if not writer.output:
            raise ValueError("WriteShards: output folder is empty")
        if threads < 1:
            raise ValueError(f"WriteShards: threads must be >= 1, got {threads}")
        self._fn = _WriteShardFn(writer, threads)
        self._labels = labels

    def expand(self, shards):
        return shards | "Write" >> beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._labels)).with_outputs(
            REJECTED, CONTENTS, main="results")
