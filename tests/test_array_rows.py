"""The columnar arrays path (array_rows) against the ref path it replaces in the local engine.

Each piece is compared value for value with the function it stands for: the NumPy plan with
planning.plan_shards on random hashes, the hashes with refs.hash64, the splits with
refs.assign_split, and whole shards (their refs, in order) with arrays.list_refs -> assign_lib.assign
-> engines.local.plan -> assign_lib.shard_order on seeded arrays with rejected labels. Fixtures are
seeded numpy arrays saved by the test.
"""

import json

import numpy as np
import pytest

from conftest import build
from imagerecords.format import side_files
from imagerecords.builder.engines import local
from imagerecords.builder.options import BuildOptions
from imagerecords.pipeline.plan import array_rows
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.write import dataset_files, fingerprint, shard_writer


def _random_hashes(rng, n):
    h = rng.integers(0, 2**64, n, dtype=np.uint64)
    # Repeats, and many hashes in one bucket, as plan_shards' bucket walk must handle.
    h[: n // 10] = h[n // 10: 2 * (n // 10)]
    h[-(n // 5):] = (h[-(n // 5):] & np.uint64(0xFFFF)) | np.uint64(0x1234 << 48)
    return h


@pytest.mark.parametrize("n,shards", [(1, 1), (7, 3), (10, 10), (5, 9), (1000, 8), (20011, 64), (50000, 1)])
def test_numpy_plan_is_plan_shards_shard_for_shard(n, shards):
    rng = np.random.default_rng(n * 31 + shards)
    h = _random_hashes(rng, n)
    expected = planning.plan_shards("train", h.tolist(), 123, shards)
    ordered = np.sort(h)
    got = planning.plan_sorted("train", ordered, 123, shards)
    assert got == expected
    # Every hash lands in the same shard both ways.
    cuts = np.searchsorted(ordered, np.array(got.boundaries, np.uint64), side="left").tolist()
    for i, (lo, hi) in enumerate(zip([0] + cuts, cuts + [n])):
        assert [expected.shard_of(v) for v in ordered[lo:hi].tolist()] == [i] * (hi - lo)


def test_empty_split_plan_is_plan_shards():
    assert planning.plan_sorted("test", np.zeros(0, np.uint64), 0, 3) == planning.plan_shards("test", [], 0, 3)


def test_hashes_and_splits_are_the_refs_ones():
    rows = np.array([0, 1, 2, 999, 123456, 999999999], np.int64)
    path = "/some/where/dätä.npz"
    got = array_rows.hashes("shuffle:7", path, rows).tolist()
    assert got == [refs_lib.shuffle_hash(7, f"dätä.npz:{i:09d}") for i in rows.tolist()]
    splits = (("train", 0.7), ("validation", 0.2), ("test", 0.1))
    n = 20000
    listed = array_rows.Listed(path, np.arange(n, dtype=np.int64), np.zeros(n, np.int64), ["3"], [], 4)
    assigned = array_rows.assign(listed, LabelMap(tuple(map(str, range(4))), integer=True), splits, 5, 0)
    names = [assigned.names[s] for s in assigned.splits.tolist()]
    assert names == [refs_lib.assign_split(splits, 5, f"dätä.npz:{i:09d}") for i in range(n)]
    assert set(names) == {"train", "validation", "test"}


def test_hashes_shared_by_worker_processes_are_the_same(monkeypatch):
    import concurrent.futures
    import multiprocessing

    monkeypatch.setattr(array_rows, "HASH_CHUNK", 1000)
    rows = np.random.default_rng(2).permutation(10**6)[:4321].astype(np.int64)
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        shared = array_rows.hashes("shuffle:3", "/x/ü.npz", rows, pool)
    assert shared.dtype == np.uint64
    assert shared.tolist() == array_rows.hashes("shuffle:3", "/x/ü.npz", rows).tolist()
    assert shared.tolist()[:3] == [refs_lib.shuffle_hash(3, f"ü.npz:{i:09d}") for i in rows[:3].tolist()]


def test_row_hashes_started_early_are_the_hashes_whoever_computes_each_chunk(monkeypatch):
    import concurrent.futures
    import multiprocessing

    monkeypatch.setattr(array_rows, "HASH_CHUNK", 1000)
    monkeypatch.setattr(array_rows.RowHashes, "CHUNK", 700)
    rows = np.random.default_rng(3).permutation(5000)[:4321].astype(np.int64)
    expected = array_rows.hashes("shuffle:3", "/x/ü.npz", rows).tolist()
    assert array_rows.RowHashes("shuffle:3", "/x/ü.npz", 5000).of(rows).tolist() == expected  # no pool
    ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=ctx) as pool:
        hashed = array_rows.RowHashes("shuffle:3", "/x/ü.npz", 5000, pool)
        assert hashed.of(rows).tolist() == expected and hashed.of(rows[:5]).tolist() == expected[:5]

    class Idle:  # a pool none of whose workers ever starts a task
        def submit(self, fn, *args):
            return concurrent.futures.Future()

    # The chunks no worker has started yet are hashed by the caller.
    stolen = array_rows.RowHashes("shuffle:3", "/x/ü.npz", 5000, Idle())
    assert stolen.of(rows).tolist() == expected and all(f.cancelled() for f in stolen._futures)


def _labels_int(n, rng):
    y = rng.integers(0, 6, n).astype(np.int64)
    y[[3, 50, 51]] = -1
    y[[7, 90]] = arrays.MAX_CLASS_ID + 1
    return y


def _labels_names(n, rng):
    y = np.array(["cat", "dog", "émeu", "b\u00e6r"])[rng.integers(0, 4, n)].astype("U8")
    y[[2, 60]] = ""
    y[[11]] = "bad\nname"
    return y


def _ref_path_shards(config, label_map):
    """The ref path's shards: {shard key: refs in shard order}, its rejected rows and label map."""
    rejected, refs = [], []
    for h, r in local.list_inputs(config, None):
        (rejected.append(r) if isinstance(r, Rejected) else refs.append((h, r)))
    if label_map is None:
        label_map = refs_lib.vocabulary(sorted({r.label for _, r in refs}), arrays.label_type(config),
                                        config.labels.label_offset)
    kept = []
    for h, r in refs:
        out = assign_lib.assign(r, label_map, tuple(config.split.splits) if config.split.splits else None, config.split.split_seed)
        (rejected.append(out) if isinstance(out, Rejected) else kept.append((h, out)))
    shards = local.plan(config, kept)
    return {k: assign_lib.shard_order(shards.take(k).pairs()) for k in shards.keys()}, shards.plans, rejected, label_map


@pytest.mark.parametrize("labels", [_labels_int, _labels_names, None])
@pytest.mark.parametrize("label_map", [None, LabelMap(("cat", "0", "1", "émeu"))])
def test_rows_path_gives_the_ref_paths_shards(tmp_path, labels, label_map):
    n = 3000
    rng = np.random.default_rng(3)
    arrays_in = {"image": rng.random((n, 4, 4), dtype=np.float32)}
    if labels is not None:
        arrays_in["label"] = labels(n, rng)
    path = tmp_path / "data.npz"
    np.savez(path, **arrays_in)
    config = BuildOptions.make(str(path), str(tmp_path / "out"), splits={"train": 0.8, "test": 0.2}, seed=4,
                               num_shards=5).config
    assert array_rows.applies(config)
    expected, plans, rejected, expected_map = _ref_path_shards(config, label_map)

    got_rejected, got_map, table, _ = local._list_rows(config, label_map)
    count, shards = len(table), local._Shards(table, config.shards)
    assert got_map == expected_map
    assert shards.plans == plans
    assert shards.keys() == sorted(expected)
    assert count == sum(len(v) for v in expected.values())
    for key in shards.keys():
        assert shards.take(key).refs() == expected[key], key
    order = lambda r: (r.split, r.key, r.uri, r.stage, r.reason)  # noqa: E731 (errors.jsonl's order)
    assert sorted(got_rejected, key=order) == sorted(rejected, key=order)
    assert rejected or (labels is None and label_map is None)  # the other fixtures do reject rows


@pytest.mark.slow
def test_build_through_rows_equals_build_through_refs(tmp_path, monkeypatch):
    """A whole local build (worker processes) writes the same files either way."""
    rng = np.random.default_rng(5)
    n = 700
    path = tmp_path / "digits.npz"
    image, label, weight = rng.integers(0, 256, (n, 6, 6), dtype=np.uint8), _labels_int(n, rng), rng.random(n)
    # Rows 100..139 repeat rows 0..39 whole: the duplicate check groups them (some across splits).
    for a in (image, label, weight):
        a[100:140] = a[0:40]
    np.savez(path, image=image, label=label, weight=weight.astype(np.float32))
    outputs = {}
    for way in ("rows", "refs"):
        if way == "refs":
            monkeypatch.setattr(array_rows, "applies", lambda config: False)
        out = tmp_path / way
        build(str(path), str(out), "--splits", "train=0.9,test=0.1", "--num_shards", "3")
        outputs[way] = out
    files = {}
    for way, out in outputs.items():
        version = next(p for p in out.iterdir() if p.name.startswith("v-"))
        files[way] = {p.relative_to(version).as_posix(): p.read_bytes() for p in version.rglob("*") if p.is_file()}
        files[way]["errors.jsonl"] = (out / "errors.jsonl").read_bytes()
        files[way]["duplicates.jsonl"] = (out / "duplicates.jsonl").read_bytes()
    assert sorted(files["rows"]) == sorted(files["refs"])
    for name in files["rows"]:
        assert files["rows"][name] == files["refs"][name], name
    assert files["rows"]["errors.jsonl"].count(b"\n") == 7  # rows 3 and 7 are repeated too
    assert files["rows"]["duplicates.jsonl"].count(b"\n") == 38  # 40 repeats less the 2 rejected
    assert b'"leak": true' in files["rows"]["duplicates.jsonl"]


TEXTS = ["plain", "ünï\u2028code", 'q"uo\\te', "\x00ctl\x7f", "😀", "", "a/b#row=3"]


def test_fingerprint_lines_are_json_dumps():
    for a in TEXTS:
        for b in TEXTS:
            row = [a, b, b, 5, a, -1, 12345678901234, "123:456"]
            assert fingerprint._json_list(row) == json.dumps(row) + "\n"
    assert fingerprint._json_list(["a", None, 1.5, True, [1]]) == json.dumps(["a", None, 1.5, True, [1]]) + "\n"


def test_keys_file_is_json_dumps_per_row():
    rows = [(a, b, size, bytes(range(i, i + 16))) for i, (a, b) in enumerate((a, b) for a in TEXTS for b in TEXTS)
            for size in (-1, 0, 2**40)]
    expected = b"".join(json.dumps({"key": k, "label": label, "size": size, "digest": d.hex()}, sort_keys=True,
                                   ensure_ascii=False).encode("utf-8") + b"\n" for k, label, size, d in rows)
    assert side_files.format_keys(rows) == expected
    assert side_files.format_keys([]) == b""


def test_fingerprint_line_is_json_dumps(tmp_path):
    image = tmp_path / "a.png"
    image.write_bytes(b"x" * 10)
    refs = [ImageRef("data.npz:000000007", "/d/data.npz#row=7", "3", "train", 3136, 3, row=7),
            ImageRef("cat/a.png", str(image), "cät\u2028", "validation", 10, 0),
            ImageRef("gone.png", str(tmp_path / "gone.png"), "dog", "train", -1, 1),
            ImageRef("e.png", str(image), "dog", "train", 10, 1, extras='{"mask":"%s","w":[1.5]}' % image),
            ImageRef("n.png", str(image), None, "", -1, -1)]
    for r in refs:
        for images in ((), ("mask",)):
            expected = json.dumps([r.key, r.uri, r.label, r.label_id, r.split, r.size,
                                   *([r.extras] if r.extras else []), *fingerprint._read_files(r, images)]) + "\n"
            assert fingerprint._fingerprint_line(r, images) == expected


@pytest.mark.parametrize("save", [np.savez, np.savez_compressed])
def test_npz_members_open_as_np_load_reads_them(tmp_path, save):
    rng = np.random.default_rng(9)
    given = {"image": rng.random((5, 3, 2), dtype=np.float32), "fortran": np.asfortranarray(rng.random((4, 6))),
             "label": np.array(["a", "bb", "ccc", "", "é"]), "flag": np.array([True, False, True]),
             "empty": np.zeros((0, 3), np.int64), "big": rng.integers(0, 2**63, (7,), dtype=np.uint64)}
    path = str(tmp_path / "x.npz")
    save(path, **given)
    arrays.open_arrays.cache_clear()
    opened = arrays.open_arrays(path)
    arrays.open_arrays.cache_clear()
    assert sorted(opened) == sorted(given)
    for name, a in given.items():
        assert opened[name].dtype == a.dtype and opened[name].shape == a.shape and np.array_equal(opened[name], a)
        # Stored members are mapped, not read; compressed ones cannot be.
        assert isinstance(opened[name], np.memmap) == (save is np.savez and a.size > 0), name


def test_the_staged_record_spelled_row_by_row_is_what_the_encoder_writes():
    from imagerecords.format.manifest import Shard

    result = dataset_files.ShardResult("train", Shard(0, "images-train.tfrecord-00000-of-00001", 3, 99, "ab" * 32,
                                                      ((0, 2), (1, 1)), 0), "AAAAAA==")
    odd = ['plain', 'quote " and \\ backslash', 'ünïcødé ✓', 'tab\tnew\nline\x01', '\u2028 line sep', '']
    contents = [(bytes([i]) * 16, (odd[i % 6], odd[(i + 1) % 6], odd[(i + 2) % 6] + "#row=7", odd[(i + 3) % 6]))
                for i in range(12)]
    rejected = [Rejected("a.npz#row=1", "row 1: value nan is not finite", "a.npz:000000001", "train", stage="decode")]
    for staged in (shard_writer.StagedShard(result, rejected, contents, 2), shard_writer.StagedShard(result, [], [], 0),
                   shard_writer.StagedShard(result, [], [(b"x" * 16, ("k", "s", "u", 3))], 0)):
        expected = shard_writer._record_bytes({"fingerprint": "f" * 64, "staged": staged.to_json()})
        assert shard_writer._staged_record_bytes("f" * 64, staged) == expected
        assert shard_writer.StagedShard.from_json(json.loads(expected)["staged"]).contents == staged.contents
