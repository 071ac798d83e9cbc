"""A row shard written from its columns (row_writer) against the same shard written from its refs.

ShardWriter.write takes either; both must stage the same shard bytes, keys file, index, staged
record (fingerprint included) and duplicate-check contents, on inputs that send rows down every
path: bulk blocks, rows with a NaN or a list value the bulk path leaves to the per-row encoder,
rejected rows, PNG images, label names that need escaping, and a file name holding % and quotes.
"""

import json
import os
import uuid

import numpy as np
import pytest

from imagerecords.pipeline import staging

from imagerecords.pipeline import sources, storage
from imagerecords.builder.engines import local
from imagerecords.builder.options import BuildOptions
from imagerecords.pipeline.plan import array_rows
from imagerecords.pipeline.refs import LabelMap
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.write import shard_writer


_NO_IDENTITY = {"identity": None, "index_identity": None}


def _without_identity(record):
    record["staged"]["result"].update(_NO_IDENTITY)
    return record


def _floats(n, rng):
    x = rng.random((n, 3, 5), dtype=np.float32)
    x[[5, 17, 400]] = np.nan  # rejected by the per-row encoder (NaN not allowed)
    return {"image": x, "label": rng.integers(0, 7, n)}


def _names_and_lists(n, rng):
    counts = rng.integers(0, 100, (n, 3)).astype(np.int64)
    counts[[2, 9, 333]] = 1000  # past one varint byte: the per-row encoder writes these rows
    names = np.array(["cat", "d%sog", 'q"u\\o', "émeu", "😀", "a\u2028b"])[rng.integers(0, 6, n)]
    return {"counts": counts, "label": names, "weight": rng.random(n).astype(np.float32)}


def _int_lists(n, rng):
    counts = rng.integers(0, 100, (n, 3)).astype(np.int64)
    counts[[2, 9, 333]] = 1000  # in blocks, these rows alone go to the per-row encoder
    return {"counts": counts, "label": rng.integers(0, 300, n)}  # label entries of two widths


def _pngs(n, rng):
    return {"image": rng.integers(0, 256, (n, 4, 4, 3), dtype=np.uint8), "label": rng.integers(0, 3, n)}


def _stage_both_ways(tmp_path, monkeypatch, arrays_in, name, label_map=None, **options):
    path = tmp_path / name
    np.savez(path, **arrays_in)
    out = tmp_path / "out"
    config = BuildOptions.make(str(path), str(out), num_shards=3, splits={"train": 0.75, "test": 0.25},
                               **options).config
    assert array_rows.applies(config)
    arrays.forget_if_changed(str(path))
    _, label_map, table, _ = local._list_rows(config, label_map)
    planned = local._Shards(table, config.shards)
    shards = {key: planned.take(key) for key in planned.keys()}
    monkeypatch.setattr(staging, "owns_output", lambda output, build_id: True)  # no lock: no launcher here
    staged = {}
    for way in ("refs", "rows"):
        build_id = f"{way}-{uuid.uuid4().hex[:6]}"
        os.makedirs(staging.staging_dir(str(out), build_id))
        writer = shard_writer.ShardWriter.of(config, build_id, sources.of(config.input))
        for key, shard in shards.items():
            members = shard.refs() if way == "refs" else shard
            result = writer.write(key, members, label_map, read_bytes=None)
            folder = staging.staging_dir(str(out), build_id)
            files = {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
                     for d, _, fs in os.walk(folder) for f in fs}
            staged.setdefault(way, {})[key] = (result, array_rows.RowContents.of(result.contents, shard), shard)
        staged[way]["files"] = files
    return staged


@pytest.mark.parametrize("fixture,name,options", [
    (_floats, "data.npz", {}),
    (_names_and_lists, 'd%a"t%sä.npz', {"write_index": True}),
    (_names_and_lists, "plain.npz", {"skip_duplicate_check": True, "label_map": LabelMap(
        ("cat", "d%sog", 'q"u\\o', "émeu", "😀", "a\u2028b"), offset=3)}),
    (_int_lists, "ints.npz", {"label_offset": 1, "schema": "tf-models"}),
    (_pngs, "pngs.npz", {}),
])
def test_a_row_shard_stages_what_its_refs_stage(tmp_path, monkeypatch, fixture, name, options):
    rng = np.random.default_rng(len(name))
    staged = _stage_both_ways(tmp_path, monkeypatch, fixture(1500, rng), name, **options)
    refs_files, rows_files = staged["refs"].pop("files"), staged["rows"].pop("files")
    assert len(refs_files) == len(rows_files) > 6
    assert refs_files.keys() == rows_files.keys()
    for name, data in refs_files.items():
        if name.endswith(".staged.json"):  # the same record but for where each file sits (its identity)
            data, rows_data = (_without_identity(json.loads(d)) for d in (data, rows_files[name]))
            assert data == rows_data, name
        else:
            assert data == rows_files[name], name
    rejected = 0
    for key, (by_refs, contents_refs, shard) in staged["refs"].items():
        by_rows, contents_rows, _ = staged["rows"][key]
        assert by_rows.result.to_json() | _NO_IDENTITY == by_refs.result.to_json() | _NO_IDENTITY
        assert by_rows.result.identity and by_rows.result.identity != by_refs.result.identity
        assert by_rows.rejected == by_refs.rejected
        assert contents_rows.digests == contents_refs.digests
        assert contents_rows.rows.tolist() == contents_refs.rows.tolist()
        rejected += len(by_rows.rejected)
    if fixture is _floats:
        assert rejected == 3


def test_a_resumed_row_shard_reuses_the_staged_one(tmp_path, monkeypatch):
    """The fingerprint of a row shard is its refs' one: a shard staged either way is reused by the other."""
    rng = np.random.default_rng(9)
    path = tmp_path / "x.npz"
    np.savez(path, image=rng.random((600, 3), dtype=np.float32), label=rng.integers(0, 4, 600))
    out = str(tmp_path / "out")
    config = BuildOptions.make(str(path), out, num_shards=2).config
    arrays.forget_if_changed(str(path))
    _, label_map, table, _ = local._list_rows(config, None)
    planned = local._Shards(table, config.shards)
    shards = {key: planned.take(key) for key in planned.keys()}
    monkeypatch.setattr(staging, "owns_output", lambda output, build_id: True)
    first = "first-build"
    os.makedirs(staging.staging_dir(out, first))
    for key, shard in shards.items():
        shard_writer.ShardWriter.of(config, first, sources.of(config.input)).write(key, shard.refs(), label_map, read_bytes=None)
    second = "second-build"
    os.makedirs(staging.staging_dir(out, second))
    writer = shard_writer.ShardWriter(**{**shard_writer.ShardWriter.of(config, second, sources.of(config.input)).__dict__, "resume_from": (first,)})
    reads, real_read = [], staging.sha256_and_size
    monkeypatch.setattr(staging, "sha256_and_size", lambda path: reads.append(path) or real_read(path))
    for key, shard in shards.items():
        staged = writer.write(key, shard, label_map, read_bytes=None)
        name = staged.result.shard.filename
        moved = storage.join(staging.staging_dir(out, second), name)
        assert storage.exists(moved)
        assert not storage.exists(storage.join(staging.staging_dir(out, first), name))  # moved, not rewritten
        assert array_rows.RowContents.of(staged.contents, shard).rows.tolist() == shard.rows.tolist()
        # Unchanged since its writer saw it: not read back; its new place's identity is recorded for the commit.
        assert staged.result.identity == storage.identity(moved)
        record = json.loads(open(moved + staging.STAGED_RECORD, "rb").read())
        assert record["staged"]["result"]["identity"] == staged.result.identity and record["reused"]
    assert reads == []
