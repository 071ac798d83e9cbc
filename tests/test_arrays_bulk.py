"""Array rows written in bulk (array_encode.encode_rows) give the bytes of the per-row encoder, row for row.

Fixtures are seeded numpy arrays saved by the test; the per-row encoder (array_encode.encode_ref, then
records.frame) is the reference every bulk frame, digest and rejected row is compared with.
"""

import filecmp
import io

import numpy as np
import pytest

from conftest import build, manifest_without_time, shard_files
from imagerecords.format import record_format, records
from imagerecords.pipeline.encode import arrays as array_encode
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import Rejected
from imagerecords.pipeline.read import array_files as arrays

N = 300


def _refs(path):
    listed = list(arrays.list_refs(str(path), "tfds", "png"))
    kept = [r for r in listed if not isinstance(r, Rejected)]
    with np.load(path) as z:
        kind = "name" if z["label"].dtype.kind in "US" else "int"
    labels = refs_lib.vocabulary(sorted({r.label for r in kept}), kind, 0)
    return [assign_lib.assign(r, labels, None, 0) for r in kept], labels


def _compare(path, options=None):
    """(rows written in blocks, rows encoded one by one); asserts both ways give the same output."""
    arrays.opened.cache_clear()
    arrays.open_arrays.cache_clear()
    refs, labels = _refs(path)
    options = options or codec.ImageOptions()
    expected = []
    for ref in refs:
        out = array_encode.encode_ref(ref, "tfds", labels, options)
        expected.append(("rejected", out.reason) if isinstance(out, Rejected)
                        else ("record", records.frame(out.record), out.content))
    got, in_blocks, alone = [], 0, 0
    for item in array_encode.encode_rows(refs, "tfds", labels, options):
        if isinstance(item, array_encode.Block):
            assert len(item.records) == len(item.contents) == len(item.refs)
            # What the TFRecord writer makes of the block (write_many) is each record's frame.
            sink = io.BytesIO()
            writer = record_format.writer(sink)
            writer.write_many(item.records)
            data = sink.getvalue()
            for (at, length), content in zip(records.index_entries(writer.offsets, writer.num_bytes), item.contents):
                got.append(("record", data[at:at + length], content))
            in_blocks += len(item.refs)
        else:
            ref, out = item
            got.append(("rejected", out.reason) if isinstance(out, Rejected)
                       else ("record", records.frame(out.record), out.content))
            alone += 1
    assert len(got) == len(expected) == len(refs)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert a == b, f"row {refs[i].key}"
    return in_blocks, alone


def _rng(seed=0):
    return np.random.default_rng(seed)


def test_float32_images_with_int_labels(tmp_path):
    r = _rng()
    np.savez(tmp_path / "f.npz", image=r.random((N, 28, 28), dtype=np.float32), label=r.integers(0, 10, N))
    assert _compare(tmp_path / "f.npz") == (N, 0)


@pytest.mark.parametrize("dtype", ["uint8", "int64", "int32", "float64", "bool"])
def test_raw_tensors_of_each_dtype(tmp_path, dtype):
    r = _rng(1)
    values = (r.integers(-1000, 1000, (N, 4, 3)) if dtype != "uint8" else r.integers(0, 256, (N, 4, 3)))
    np.savez(tmp_path / "t.npz", pixels=values.astype(dtype), label=r.integers(0, 5, N))
    assert _compare(tmp_path / "t.npz") == (N, 0)


def test_list_features_and_many_features_per_row(tmp_path):
    r = _rng(2)
    ints = r.integers(0, 100, (N, 5))
    ints[9, 2] = 300  # a two-byte varint: that row is encoded alone
    ints[11, 0] = -4  # a ten-byte varint
    np.savez(tmp_path / "m.npz", image=r.random((N, 6, 6), dtype=np.float32), label=r.integers(0, 10, N),
             vec=r.random((N, 4), dtype=np.float32), half=r.random((N, 3)).astype(np.float16),
             ints=ints, flags=r.random((N, 2)) > 0.5, scalar=r.random(N, dtype=np.float32),
             big=r.random((N, 2, 2)))
    assert _compare(tmp_path / "m.npz") == (N - 2, 2)


def test_varint_boundary_labels(tmp_path):
    r = _rng(3)
    label = r.integers(0, 10, N)
    edges = [0, 127, 128, 16383, 16384, arrays.MAX_CLASS_ID]
    label[:len(edges)] = edges
    label[50:60] = 128
    label[200:] = 16384  # a shard of rows of one wide layout after rows of mixed widths
    np.savez(tmp_path / "v.npz", image=r.random((N, 5, 5), dtype=np.float32), label=label)
    assert _compare(tmp_path / "v.npz") == (N, 0)


def test_nan_and_infinite_rows_are_still_rejected_with_their_reason(tmp_path):
    r = _rng(4)
    x = r.random((N, 4, 4), dtype=np.float32)
    x[5, 1, 1] = np.nan
    x[77, 0, 0] = -np.inf
    vec = r.random((N, 3), dtype=np.float32)
    vec[123, 2] = np.inf
    np.savez(tmp_path / "n.npz", image=x, vec=vec, label=r.integers(0, 3, N))
    assert _compare(tmp_path / "n.npz") == (N - 3, 3)


def test_class_names_take_the_row_by_row_path(tmp_path):
    r = _rng(5)
    np.savez(tmp_path / "p.npz", image=r.integers(0, 256, (40, 8, 8, 3), dtype=np.uint8),
             label=np.array(["cat", "dog"] * 20))
    assert _compare(tmp_path / "p.npz") == (0, 40)


@pytest.mark.parametrize("shape", [(8, 8, 3), (8, 8), (8, 8, 1), (1, 9, 3)])
@pytest.mark.parametrize("level", [0, 1, 9])
def test_png_images_are_encoded_in_blocks_with_the_per_row_bytes(tmp_path, shape, level):
    r = _rng(11)
    image = r.integers(0, 256, (N,) + shape, dtype=np.uint8)
    image[N // 2:] //= 64  # flatter pictures compress: records of many lengths in one block
    image[:10] = 7
    vec = r.random((N, 2), dtype=np.float32)
    vec[33, 1] = np.nan  # this row alone goes to the per-row encoder, and is rejected there
    label = r.integers(0, 200, N)  # label entries of one and two varint bytes
    np.savez(tmp_path / "i.npz", image=image, label=label, vec=vec)
    assert _compare(tmp_path / "i.npz", codec.ImageOptions(image_encoding="png", png_level=level)) == (N - 1, 1)


def test_jpeg_images_take_the_row_by_row_path(tmp_path):
    r = _rng(12)
    np.savez(tmp_path / "j.npz", image=r.integers(0, 256, (20, 8, 8, 3), dtype=np.uint8), label=r.integers(0, 3, 20))
    arrays.opened.cache_clear()
    refs = [r for r in arrays.list_refs(str(tmp_path / "j.npz"), "tfds", "jpeg") if not isinstance(r, Rejected)]
    labels = refs_lib.vocabulary(sorted({r.label for r in refs}), "int", 0)
    refs = [assign_lib.assign(r, labels, None, 0) for r in refs]
    items = list(array_encode.encode_rows(refs, "tfds", labels, codec.ImageOptions(image_encoding="jpeg")))
    assert len(items) == 20 and not any(isinstance(item, array_encode.Block) for item in items)


@pytest.mark.slow
def test_local_engine_and_direct_runner_write_the_same_bulk_bytes(tmp_path):
    r = _rng(6)
    label = r.integers(0, 10, N)
    label[:4] = [127, 128, 16384, 0]
    x = r.random((N, 7, 7), dtype=np.float32)
    x[3, 0, 0] = np.nan
    np.savez(tmp_path / "d.npz", image=x, label=label, vec=r.random((N, 3), dtype=np.float32))
    local, direct = tmp_path / "local", tmp_path / "direct"
    build(tmp_path / "d.npz", local, "--num_shards", 2, "--splits", "train=0.7,test=0.3")
    build(tmp_path / "d.npz", direct, "--num_shards", 2, "--splits", "train=0.7,test=0.3", "--runner=DirectRunner")
    names = [p.split("/")[-1] for p in shard_files(local)]
    assert names == [p.split("/")[-1] for p in shard_files(direct)] and len(names) == 4
    for a, b in zip(shard_files(local), shard_files(direct)):
        assert filecmp.cmp(a, b, shallow=False), a
    assert filecmp.cmp(local / "errors.jsonl", direct / "errors.jsonl", shallow=False)
    assert manifest_without_time(local) == manifest_without_time(direct)
    assert len(open(local / "errors.jsonl").readlines()) == 1


def test_blocks_are_bounded_by_bytes_and_still_the_same_records(tmp_path, monkeypatch):
    r = _rng(7)
    label = r.integers(120, 136, N)  # one- and two-byte varints mixed inside every block
    x = r.random((N, 4, 4), dtype=np.float32)
    x[40, 0, 0] = np.nan
    np.savez(tmp_path / "b.npz", image=x, label=label)
    monkeypatch.setattr(array_encode, "BLOCK_BYTES", 1000)  # 13 rows of 72 bytes per block
    refs, labels = _refs(tmp_path / "b.npz")
    blocks = [item for item in array_encode.encode_rows(refs, "tfds", labels, codec.ImageOptions())
              if isinstance(item, array_encode.Block)]
    assert max(len(b.refs) for b in blocks) <= 13 and len(blocks) > N // 13
    assert _compare(tmp_path / "b.npz") == (N - 1, 1)


def test_a_big_endian_array_takes_the_row_by_row_path_with_the_same_bytes(tmp_path):
    r = _rng(8)
    np.savez(tmp_path / "e.npz", image=r.random((60, 3, 3)).astype(">f4"), label=r.integers(0, 3, 60))
    assert _compare(tmp_path / "e.npz") == (0, 60)
