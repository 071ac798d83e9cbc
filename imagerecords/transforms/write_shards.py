"""WriteShards: one worker streams each shard to a temporary file in staging, renamed when complete."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import time
import uuid
from typing import Iterable, List, Optional, Tuple, Union

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics

from imagerecords import codec, metadata, planning, publish, records, shard_writer
from imagerecords.manifest import Shard
from imagerecords.metadata import ShardResult
from imagerecords.refs import ImageRef, LabelMap
from imagerecords.transforms.common import CONTENTS, METRICS_NAMESPACE, REJECTED

__all__ = ["WriteShards"]


class _Progress:
    """Reports a shard's progress as a small JSON file the local launcher sums up (local runs only)."""

    def __init__(self, progress_dir: Optional[str], name: str, total: int):
        self._path = os.path.join(progress_dir, name + ".json") if progress_dir else None
        self._total = total
        self._last = 0.0

    def __call__(self, done: int, rejected: int, force: bool = False) -> None:
        now = time.monotonic()
        if self._path is None or (not force and now - self._last < 0.5):
            return
        self._last = now
        tmp = f"{self._path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"done": done, "rejected": rejected, "total": self._total}, f)
        os.replace(tmp, self._path)


class _WriteShardFn(beam.DoFn):
    def __init__(self, output: str, name: str, preset: str, options: codec.ImageOptions, threads: int,
                 write_index: bool, progress_dir: Optional[str], contents: bool):
        self._output = output
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
        (split, index, num_shards), refs = element
        publish.test_pause("before_shards")
        filename = planning.shard_name(self._name, split, index, num_shards)
        staging = publish.staging_dir(self._output)
        staged = FileSystems.join(staging, filename)
        # A unique temporary name per attempt: a retried or speculative bundle never writes into
        # another attempt's file, and the last rename wins with identical bytes.
        tmp = FileSystems.join(staging, f".{filename}.{uuid.uuid4().hex}.tmp")
        kept, duplicates = shard_writer.dedupe_sorted(refs)
        progress = _Progress(self._progress_dir, filename, len(refs))

        def on_progress(done: int, rejected: int) -> None:
            progress(done + len(duplicates), rejected + len(duplicates))
            if done == len(kept) // 2:
                _fail_once_for_tests(filename)

        try:
            with FileSystems.create(tmp, mime_type="application/octet-stream",
                                    compression_type=CompressionTypes.UNCOMPRESSED) as stream:
                stats, rejected = shard_writer.write_shard(
                    kept, stream, read_bytes=self._read, preset=self._preset, labels=labels,
                    options=self._options, executor=self._executor, window=2 * self._threads,
                    on_progress=on_progress,
                )
            FileSystems.rename([tmp], [staged])
        except BaseException:
            if FileSystems.exists(tmp):
                FileSystems.delete([tmp])
            raise
        progress(len(refs), len(duplicates) + len(rejected), force=True)
        _log_writer(filename, stats.count)
        index_file = index_sha256 = None
        if self._write_index:
            # tfrecord2idx format (records.format_index), in the index folder no shard glob reaches.
            index_file = metadata.index_name(filename)
            index_data = records.format_index(records.index_entries(stats.offsets, stats.num_bytes))
            index_sha256 = hashlib.sha256(index_data).hexdigest()
            publish.write_bytes(FileSystems.join(staging, index_file), index_data)
        self._written.inc(stats.count)
        self._passthrough.inc(stats.passthrough)
        self._bytes.inc(stats.num_bytes)
        for r in duplicates + rejected:
            self._rejected.inc()
            yield beam.pvalue.TaggedOutput(REJECTED, r)
        for digest, ref in stats.contents if self._contents else ():
            yield beam.pvalue.TaggedOutput(CONTENTS, (digest, (ref.key, ref.split, ref.uri)))
        publish.test_pause("mid_shards")
        yield ShardResult(split, Shard(index, filename, stats.count, stats.num_bytes, stats.sha256, stats.labels,
                          stats.passthrough, index_file, index_sha256))


def _fail_once_for_tests(filename: str) -> None:
    """Test hook: with IMAGERECORDS_TEST_FAIL_ONCE=PATH, the first shard writer to get half-way
    through a shard creates PATH and fails, so a test sees the runner retry a shard mid-write."""
    marker = os.environ.get("IMAGERECORDS_TEST_FAIL_ONCE")
    if not marker:
        return
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise RuntimeError(f"test hook: failing once in the middle of {filename}")


def _log_writer(filename: str, count: int) -> None:
    """Debug hook: with IMAGERECORDS_WRITER_LOG=DIR, records which process wrote each shard as
    DIR/<shard>.json ({shard, records, host, pid, ppid, cpu_s}: cpu_s is the writing process's CPU
    seconds so far), so a test or an operator can see where the work ran (on a cluster, DIR must be a
    local folder of each worker's host). The last successful attempt of a shard wins."""
    log_dir = os.environ.get("IMAGERECORDS_WRITER_LOG")
    if not log_dir:
        return
    import socket

    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, filename + ".json")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"shard": filename, "records": count, "host": socket.gethostname(), "pid": os.getpid(),
                   "ppid": os.getppid(), "cpu_s": time.process_time()}, f)
    os.replace(tmp, path)


class WriteShards(beam.PTransform):
    """Writes each (shard key, [ImageRef]) group as one TFRecord shard in `output`'s staging area.

    Outputs: main (ShardResult), REJECTED (Rejected: unreadable, undecodable, duplicate key) and
    CONTENTS ((16-byte digest of the source file, (key, split, uri)) per written image; empty
    with contents=False, when no duplicate check consumes it).
    """

    def __init__(self, output: str, name: str, labels, preset: str = "tfds",
                 options: codec.ImageOptions = codec.ImageOptions(), threads: int = 4,
                 write_index: bool = False, progress_dir: Optional[str] = None, contents: bool = True):
        super().__init__()
        if not output:
            raise ValueError("WriteShards: output folder is empty")
        if threads < 1:
            raise ValueError(f"WriteShards: threads must be >= 1, got {threads}")
        self._fn = _WriteShardFn(output, name, preset, options, threads, write_index, progress_dir, contents)
        self._labels = labels

    def expand(self, shards):
        return shards | "Write" >> beam.ParDo(self._fn, beam.pvalue.AsSingleton(self._labels)).with_outputs(
            REJECTED, CONTENTS, main="results")
