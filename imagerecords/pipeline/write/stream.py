"""Writes one shard: load, prepare and serialize its images in hash order, streaming to a file."""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import hashlib
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from imagerecords.format import record_format, schema
from imagerecords.format.features import Feature, ValueProblem
from imagerecords.pipeline.encode import arrays as array_encode
from imagerecords.pipeline.encode import features as feature_encoder
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode.encoded import Encoded
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import download, input_files


limited_reader = input_files.limited_reader  # the reader of file inputs (a source may read its own way)


def encode_ref(
    ref: ImageRef,
    read_bytes: Callable[[str], bytes],
    preset: str,
    labels: LabelMap,
    options: codec.ImageOptions,
    features: Sequence[Feature] = (),
    perceptual: bool = False,
) -> Union[Encoded, Rejected]:
    """Loads and prepares one image and returns its Example, or the reason it cannot be used
    (with `perceptual`, the Encoded holds the image's perceptual hash).

    Args:
      read_bytes: reads a uri whole; use `limited_reader(options)`, which refuses FIFOs and files
        over `options.max_file_mb` without reading them. Whatever reads, bytes over the limit are
        rejected here too.
    """
    if ref.row >= 0:  # an arrays row, as its source listed it
        return array_encode.encode_ref(ref, preset, labels, options)
    try:
        data = read_bytes(ref.uri)
    except download.OptedOut as e:  # the site said no (robots.txt, X-Robots-Tag): not downloaded, not a failure
        return Rejected(ref.uri, str(e), ref.key, ref.split, stage="opted_out", error=e.error)
    except download.Failed as e:  # a URL that gave no image bytes: its status, timeout, size...
        return Rejected(ref.uri, str(e), ref.key, ref.split, stage="download", error=e.error)
    except input_files.Refused as e:  # turned away by policy: no exception type to report
        return Rejected(ref.uri, str(e), ref.key, ref.split, stage="read")
    except OSError as e:  # FileSystems raises BeamIOError, an IOError
        return Rejected(ref.uri, f"cannot read file: {input_files.describe_os_error(e)}", ref.key, ref.split,
                        stage="read", error=type(e).__name__)
    too_big = input_files.size_refusal(len(data), options.max_file_bytes)
    if too_big is not None:
        return Rejected(ref.uri, too_big.replace("it was not read", "it was not decoded"), ref.key, ref.split, stage="read")
    try:
        image = codec.prepare_image(data, options, perceptual)
    except codec.ImageError as e:
        return Rejected(ref.uri, str(e), ref.key, ref.split, stage="decode", error=e.error)
    extra = None
    if features:
        try:
            follows = any(f.dtype == "image" and not f.independent for f in features)
            extra = feature_encoder.encode_extras(ref, features, labels, read_bytes, options.quality,
                                                  codec.geometry(data, options) if follows else None,
                                                  options.png_level)
        except ValueProblem as e:
            return Rejected(ref.uri, str(e), ref.key, ref.split, stage="decode", error="ValueProblem")
    index = ref.label_id - labels.offset
    record = schema.make_example(
        preset,
        image=image.data,
        image_format=image.format,
        label=ref.label_id,
        label_text=labels.names[index],
        filename=ref.key,
        height=image.height,
        width=image.width,
        extra=extra,
    )
    kind = codec.prepared_kind(image) if options.image_encoding != "jpeg" else ""
    return Encoded(record, ref.label_id, image.passthrough, content_digest(data), kind, image.phash)


def content_digest(data: bytes) -> bytes:
    """The first 16 bytes of SHA-256: collisions are out of reach for any dataset (2**64 files for an
    even chance). SHA-256 rather than BLAKE2b: CPUs hash it in hardware, and every written image is
    hashed."""
    return hashlib.sha256(data).digest()[:16]


def dedupe_sorted(refs: Sequence[ImageRef]) -> Tuple[List[ImageRef], List[Rejected]]:
    """Drops repeated keys from hash-sorted refs (repeats are adjacent); each repeat is rejected."""
    kept: List[ImageRef] = []
    rejected: List[Rejected] = []
    for ref in refs:
        if kept and kept[-1].key == ref.key:
            rejected.append(Rejected(ref.uri, f"duplicate key {ref.key!r}: already listed as {kept[-1].uri}", ref.key,
                                     ref.split, stage="duplicate"))
        else:
            kept.append(ref)
    return kept, rejected


@dataclasses.dataclass
class ShardStats:
    """What write_shard wrote.

    Attributes:
      count, num_bytes, sha256: records, file size and digest of the shard.
      crc32c: the shard file's crc32c as GCS shows it (records.crc32c_text).
      labels: ((label id, records), ...) sorted by id.
      passthrough: records stored as their source bytes.
      offsets: every record's locator in its file (TFRecord: its frame's byte offset).
      contents: (source content digest, ref) of every record written, in shard order.
      kinds: ((codec.stored_kind, records), ...) sorted, when the encoding is not 'jpeg' (else ()).
      ends_crc: the first and last records' data checksums (Shard.ends_crc).
    """

    count: int
    num_bytes: int
    sha256: str
    labels: Tuple[Tuple[int, int], ...]
    passthrough: int
    offsets: List[int]
    contents: List[Tuple[bytes, ImageRef]] = dataclasses.field(default_factory=list)
    kinds: Tuple[Tuple[str, int], ...] = ()
    crc32c: Optional[str] = None
    ends_crc: Optional[str] = None
    hashes: List[Optional[int]] = dataclasses.field(default_factory=list)


def _ordered_map(fn, items: Iterable, executor: Optional[concurrent.futures.Executor], window: int):
    """Like map(fn, items) but up to `window` calls run in `executor` at once; order is kept and
    at most `window` results are held, so a shard's memory is bounded whatever its size."""
    if executor is None:
        yield from map(fn, items)
        return
    pending = collections.deque()
    for item in items:
        pending.append(executor.submit(fn, item))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def write_shard(
    refs: Sequence[ImageRef],
    writer: record_format.RecordWriter,
    *,
    read_bytes: Callable[[str], bytes],
    preset: str,
    labels: LabelMap,
    options: codec.ImageOptions,
    executor: Optional[concurrent.futures.Executor] = None,
    window: int = 16,
    on_progress: Optional[Callable[[int, int], None]] = None,
    features: Sequence[Feature] = (),
    perceptual: bool = False,
) -> Tuple[ShardStats, List[Rejected]]:
    """Writes `refs` (already in hash order, repeats removed) as records through `writer` (a
    record format's writer of one file), and closes it; with `perceptual`, keeps each record's
    perceptual hash (ShardStats.hashes).

    Returns:
      The shard's statistics and the rejected inputs.
    """
    histogram = collections.Counter()
    kinds = collections.Counter()
    rejected: List[Rejected] = []
    passthrough = 0
    done = 0
    contents: List[Tuple[bytes, ImageRef]] = []
    hashes: List[Optional[int]] = []
    if refs and refs[0].row >= 0:
        # Array rows are encoded in blocks (array_encode.encode_rows), in this thread: they wait on no I/O.
        encoded = array_encode.encode_rows(refs, preset, labels, options)
    else:
        encoded = _ordered_map(lambda r: (r, encode_ref(r, read_bytes, preset, labels, options, features, perceptual)),
                               refs,
                               executor, window)
    for item in encoded:
        if isinstance(item, array_encode.Block):
            writer.write_many(item.records)
            contents.extend(zip(item.contents, item.refs))
            hashes.extend([None] * len(item.refs) if perceptual else ())
            histogram.update(ref.label_id for ref in item.refs)
            done += len(item.refs)
            if on_progress is not None:
                on_progress(done, len(rejected))
            continue
        ref, result = item
        done += 1
        if isinstance(result, Rejected):
            rejected.append(result)
        else:
            writer.write(result.record)
            contents.append((result.content, ref))
            if perceptual:
                hashes.append(result.phash)
            histogram[result.label_id] += 1
            passthrough += result.passthrough
            if result.kind:
                kinds[result.kind] += 1
        if on_progress is not None:
            on_progress(done, len(rejected))
    writer.close()
    stats = ShardStats(writer.count, writer.num_bytes, writer.sha256(), tuple(sorted(histogram.items())), passthrough,
                       writer.offsets, contents, tuple(sorted(kinds.items())), writer.crc32c(), writer.ends_crc(),
                       hashes)
    return stats, rejected
