"""A record format is one module: a toy format registered here, from a test module, is built by
imagerecords.build and WriteDataset and read back by the Grain source, verify, inspect and --append,
with no edit under imagerecords/ (as tests/test_sources.py registers an input source)."""

import base64
import os

import pytest

import imagerecords
from imagerecords.format import record_format
from imagerecords.format.records import CorruptRecordError


class _LinesWriter(record_format.RecordWriter):
    """One base64 line per record: offsets and size as it goes, digests of the whole stream."""

    def __init__(self, stream):
        import hashlib

        import google_crc32c

        self._stream, self._sha, self._crc = stream, hashlib.sha256(), google_crc32c.Checksum()
        self.count, self.num_bytes, self.offsets = 0, 0, []

    def write(self, record: bytes) -> None:
        line = base64.b64encode(record) + b"\n"
        self._stream.write(line)
        self._sha.update(line)
        self._crc.update(line)
        self.offsets.append(self.num_bytes)
        self.count += 1
        self.num_bytes += len(line)

    def sha256(self) -> str:
        return self._sha.hexdigest()

    def crc32c(self) -> str:
        return base64.b64encode(self._crc.digest()).decode("ascii")


class Lines(record_format.RecordFormat):
    name = "b64lines"
    suffix = ".b64lines"
    min_record_bytes = 1

    def writer(self, stream):
        return _LinesWriter(stream)

    def read(self, stream, name="<stream>"):
        for number, line in enumerate(stream.read().splitlines()):
            try:
                yield base64.b64decode(line, validate=True)
            except ValueError:
                raise CorruptRecordError(f"{name}: line {number + 1} is not base64") from None

    def entries(self, files, dataset, shard_path, shard, index_path):
        at, out = 0, []
        for line in files.read(shard_path).splitlines(keepends=True):
            out.append((at, len(line)))
            at += len(line)
        if len(out) != shard.count:
            raise CorruptRecordError(f"{shard_path}: {len(out)} lines, manifest.json says {shard.count}")
        return out

    def record_at(self, read_range, dataset, shard_path, offset, length):
        return next(self.read(_Bytes(read_range(shard_path, offset, length)), shard_path))


class _Bytes:
    def __init__(self, data):
        self.data = data

    def read(self, *_):
        return self.data


@pytest.fixture(scope="module")
def toy():
    fmt = record_format.register(Lines())
    yield fmt
    record_format._FORMATS.pop(fmt.name)


def test_a_format_registered_by_a_test_module_builds_and_reads_back(toy, image_tree, tmp_path):
    from imagerecords.cli import inspection
    from imagerecords.grain import RecordSource

    root, _ = image_tree
    out = tmp_path / "out"
    manifest = imagerecords.build(input=str(root), output=str(out), record_format="b64lines", num_shards=2,
                                  max_reject_fraction=0.05)
    assert manifest.record_format == "b64lines"
    shards = manifest.split("train").shards
    assert [os.path.basename(s.filename) for s in shards] == [f"images-train.b64lines-0000{i}-of-00002" for i in (0, 1)]
    lines = (out / shards[0].filename).read_bytes().splitlines()
    assert len(lines) == shards[0].count and b"image/filename" in base64.b64decode(lines[0])  # an Example, base64'd
    assert not (out / "dataset_info.json").exists()  # TFDS has no name for it
    source = RecordSource(str(out), "train")
    assert len(source) == manifest.split("train").num_examples == 40
    assert inspection.verify(str(out), records=True) == ([], [])
    # The same input as TFRecord holds the same records in the same order: the format changes the file only.
    imagerecords.build(input=str(root), output=str(tmp_path / "tf"), num_shards=2, max_reject_fraction=0.05)
    tf_source = RecordSource(str(tmp_path / "tf"), "train", index="scan")
    assert [source.record(i) for i in range(len(source))] == [tf_source.record(i) for i in range(len(tf_source))]


def test_an_unknown_format_is_one_line_naming_the_known_ones(image_tree, tmp_path):
    root, _ = image_tree
    with pytest.raises(ValueError, match=r"record format 'parquet' is not one of array_record, (b64lines, )?tfrecord$"):
        imagerecords.build(input=str(root), output=str(tmp_path / "o"), record_format="parquet")


def test_a_manifest_naming_an_unknown_format_is_refused_where_every_reader_loads_it(image_tree, tmp_path):
    import json

    from imagerecords.format import manifest as manifest_lib
    from imagerecords.format.access import load_manifest
    from imagerecords.reader import info

    root, _ = image_tree
    out = tmp_path / "out"
    imagerecords.build(input=str(root), output=str(out), num_shards=1, max_reject_fraction=0.05)
    data = json.loads((out / "manifest.json").read_text())
    data["record_format"] = "parquet"
    (out / "manifest.json").write_text(json.dumps(data))
    for load in (load_manifest, info.load_info):  # the Grain and torch readers' loader, and tf.data's
        with pytest.raises(manifest_lib.ManifestError, match=r"manifest.json: record format 'parquet' is not one of"):
            load(str(out))


def test_a_format_whose_library_is_missing_is_one_line_saying_what_to_install(monkeypatch):
    # As on a reader-only install (or Windows): the array_record package cannot be imported.
    import sys

    monkeypatch.delitem(record_format._FORMATS, "array_record", raising=False)
    monkeypatch.delitem(sys.modules, "imagerecords.format.array_record_format", raising=False)
    for loaded in [m for m in sys.modules if m == "array_record" or m.startswith("array_record.")] + ["array_record"]:
        monkeypatch.setitem(sys.modules, loaded, None)  # None in sys.modules: its import fails
    with pytest.raises(record_format.FormatUnavailable) as caught:
        record_format.get("array_record")
    message = str(caught.value)
    assert "\n" not in message and "record format 'array_record' needs the array-record package" in message
    assert "pip install array-record" in message
    assert isinstance(caught.value, imagerecords.Error) and isinstance(caught.value, ValueError)
