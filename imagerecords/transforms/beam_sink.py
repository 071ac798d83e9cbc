"""WriteWithBeamSink: the standard Beam path (Reshuffle, encode, WriteToTFRecord), for comparison.

It moves every encoded image through the runner's shuffle and its shard contents depend on
bundling, so it is not reproducible; `WriteShards` is the default for those reasons.
"""

from __future__ import annotations

import collections
from typing import Iterable, Sequence, Union

import apache_beam as beam

from imagerecords.format import record_format, records, schema
from imagerecords.format.manifest import Shard
from imagerecords.format.record_format import shard_prefix
from imagerecords.pipeline import storage
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.write import stream as write_stream
from imagerecords.pipeline.write.dataset_files import ShardResult
from imagerecords.transforms.common import REJECTED

__all__ = ["WriteWithBeamSink"]


class _EncodeFn(beam.DoFn):
    def __init__(self, preset: str, options: codec.ImageOptions, source=None):
        self._preset = preset
        self._options = options
        self._source = source

    def setup(self):
        self._read = (self._source.reader(self._options) if self._source is not None
                      else write_stream.limited_reader(self._options))

    def process(self, ref: ImageRef, labels: LabelMap) -> Iterable[Union[tuple, beam.pvalue.TaggedOutput]]:
        result = write_stream.encode_ref(ref, self._read, self._preset, labels, self._options)
        if isinstance(result, Rejected):
            yield beam.pvalue.TaggedOutput(REJECTED, result)
        else:
            yield ref.split, result.record


def _summarize(path: str, split: str, preset: str, kinds: bool = False) -> ShardResult:
    """Reads a written shard back to count its records and labels (this sink reports neither), and
    with `kinds` its stored image kinds (codec.stored_kind)."""
    keys = schema.keys(preset)
    label_key = keys.label
    histogram = collections.Counter()
    kind_counts = collections.Counter()
    count = 0
    first = last = b""
    with storage.open_read(path) as f:
        stream = records.HashingReader(f)
        for record in record_format.read(stream, path):
            first, last = first if count else record, record
            histogram[schema.read_int64(record, label_key)] += 1
            if kinds:
                kind_counts[codec.stored_kind(schema.parse_example(record, only=(keys.image,))[keys.image][0])] += 1
            count += 1
        stream.drain()
    filename = path.rsplit("/", 1)[-1]
    index = int(filename.rsplit("-of-", 1)[0].rsplit("-", 1)[-1])
    return ShardResult(split, Shard(index, filename, count, stream.num_bytes, stream.sha256(),
                                    tuple(sorted(histogram.items())), 0, image_kinds=tuple(sorted(kind_counts.items())),
                                    ends_crc=records.ends_crc_of_records(first, last) if count else None),
                       stream.crc32c())


class WriteWithBeamSink(beam.PTransform):
    """Writes refs with beam.io.WriteToTFRecord, one write per split in `split_names`.

    Outputs: main (ShardResult, read back from the files) and REJECTED. `staging` is the build's
    staging folder (pipeline.staging.staging_dir); `source`, the sources.Source that reads the refs (None: files).
    """

    def __init__(self, staging: str, name: str, labels, split_names: Sequence[str], num_shards: int,
                 preset: str = "tfds", options: codec.ImageOptions = codec.ImageOptions(), source=None):
        super().__init__()
        if not split_names:
            raise ValueError("WriteWithBeamSink needs the split names before the pipeline runs")
        if num_shards < 1:
            raise ValueError(f"WriteWithBeamSink: num_shards must be >= 1, got {num_shards}")
        self._output = staging
        self._name = name
        self._labels = labels
        self._splits = list(split_names)
        self._num_shards = num_shards
        self._preset = preset
        self._options = options
        self._source = source

    def expand(self, refs):
        splits = set(self._splits)

        def known_split(ref: ImageRef):
            if ref.split in splits:
                yield ref
            else:
                yield beam.pvalue.TaggedOutput(
                    REJECTED, Rejected(ref.uri, f"split {ref.split!r} is not among {sorted(splits)}", ref.key, ref.split, stage="label"))

        checked = refs | "KnownSplit" >> beam.FlatMap(known_split).with_outputs(REJECTED, main="refs")
        encoded = (
            checked.refs
            | "Reshuffle" >> beam.Reshuffle()
            | "Encode" >> beam.ParDo(_EncodeFn(self._preset, self._options, self._source), beam.pvalue.AsSingleton(self._labels))
            .with_outputs(REJECTED, main="records")
        )
        results = []
        for split in self._splits:
            prefix = storage.join(self._output, shard_prefix(self._name, split))
            files = (
                encoded.records
                | f"Only[{split}]" >> beam.Filter(lambda kv, s=split: kv[0] == s)
                | f"Record[{split}]" >> beam.Map(lambda kv: kv[1])
                | f"Write[{split}]" >> beam.io.WriteToTFRecord(prefix, num_shards=self._num_shards)
            )
            results.append(files | f"Summarize[{split}]" >> beam.Map(
                _summarize, split, self._preset, self._options.image_encoding != "jpeg"))
        rejected = (checked[REJECTED], encoded[REJECTED]) | "Rejected" >> beam.Flatten()
        return {"results": results | "Results" >> beam.Flatten(), REJECTED: rejected}
