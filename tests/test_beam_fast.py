"""Beam in the fast tier: one DirectRunner build per input kind (a folder, CSV and JSONL manifests,
URLs from tests/support/web.py's server, NumPy arrays, a registered source, WriteDataset over a user's
rows), in this process, in memory on one worker, over a handful of tiny images: each writes the local
engine's bytes (every file, build ids and the work folder masked) and the records read back hold the
expected keys, labels and bytes. Where worker processes add a risk (a source's module imported by
name, downloads, rows of arrays), the same build on two of them (DirectRunner's multi_processing
mode, the one a real run gets) is the slow parameter; folders and manifests get theirs in
tests/test_local_engine.py and tests/test_golden.py."""

import json
import os

import numpy as np
import pytest

from conftest import build
from support.web import Server, jpeg
from test_golden import differences, digests
from imagerecords.format.records import read_records
from imagerecords.format.schema import parse_example

IN_MEMORY = ["--runner=DirectRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
TWO_PROCESSES = ["--runner=DirectRunner", "--direct_num_workers=2", "--direct_running_mode=multi_processing"]
ENGINES = [pytest.param(IN_MEMORY, id="in_memory"),
           pytest.param(TWO_PROCESSES, id="two_processes", marks=pytest.mark.slow)]  # seconds of process start-up
SPLITS = ["--splits", "train=0.75,validation=0.25", "--num_shards", 2, "--write_index"]


def same_bytes_on_beam(inp, tmp_path, beam, *args):
    """Builds `inp` on the local engine and on DirectRunner with `beam`, asserts every file alike and
    returns the local build's manifest."""
    manifest = build(inp, tmp_path / "local", *args)
    build(inp, tmp_path / "beam", *args, *beam)
    local, direct = digests(str(tmp_path / "local"), str(tmp_path)), digests(str(tmp_path / "beam"), str(tmp_path))
    assert any(".tfrecord-" in name for name in local), sorted(local)
    assert not differences(local, direct), "local engine (expected) against DirectRunner (got):\n  " + "\n  ".join(
        differences(local, direct))
    return manifest


def records(out):
    """Every record of the published dataset in `out`, parsed without TensorFlow."""
    with open(os.path.join(str(out), "manifest.json")) as f:
        manifest = json.load(f)
    found = []
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            with open(os.path.join(str(out), shard["filename"]), "rb") as f:
                found.extend(parse_example(r) for r in read_records(f))
    return found


def keys_and_labels(out):
    """{image/filename: label id} of every record in `out`."""
    return {r["image/filename"][0].decode(): r["label"][0] for r in records(out)}


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """4 classes x 2 images (a baseline JPEG and a PNG each) and one truncated JPEG."""
    from imagerecords.pipeline import example_images

    root = tmp_path_factory.mktemp("tree") / "images"
    return root, example_images.write_tree(str(root), per_class=2, broken=True)


def test_a_folder(tree, tmp_path):
    root, files = tree
    manifest = same_bytes_on_beam(root, tmp_path, IN_MEMORY, *SPLITS, "--max_reject_fraction", 0.2)
    assert (manifest.num_examples, manifest.num_rejected) == (8, 1)
    names = sorted(files)  # label ids by sorted class name
    want = {f"{cls}/{rel}": names.index(cls) for cls, rels in files.items() for rel in rels
            if not rel.endswith("truncated.jpg")}
    assert keys_and_labels(tmp_path / "beam") == want


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_manifest(tree, tmp_path, kind):
    root, files = tree
    rows = [{"path": str(root / cls / rel), "label": cls, "key": f"k-{cls}-{i}"}
            for cls, rels in sorted(files.items()) for i, rel in enumerate(rels) if not rel.endswith("truncated.jpg")]
    rows.append({"path": str(tmp_path / "gone.jpg"), "label": "circle", "key": "gone"})  # a rejected row
    path = tmp_path / f"list.{kind}"
    if kind == "csv":
        path.write_text("path,label,key\n" + "".join(f"{r['path']},{r['label']},{r['key']}\n" for r in rows))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = same_bytes_on_beam(path, tmp_path, IN_MEMORY, *SPLITS, "--max_reject_fraction", 0.2)
    assert (manifest.num_examples, manifest.num_rejected) == (8, 1)
    names = sorted(files)
    assert keys_and_labels(tmp_path / "beam") == {r["key"]: names.index(r["label"]) for r in rows[:-1]}
    with open(tmp_path / "beam" / "errors.jsonl") as f:
        assert [(e["key"], e["stage"], e["reason"]) for e in map(json.loads, f)] == [("gone", "list", "file not found")]


IMAGES = {f"p{i:02d}.jpg": jpeg(i) for i in range(6)}


@pytest.mark.parametrize("beam", ENGINES)
def test_a_manifest_of_urls(tmp_path, beam):
    with Server(IMAGES) as server:
        urls = [server.url(f"/img/{name}") for name in sorted(IMAGES)]
        path = tmp_path / "urls.csv"
        path.write_text("url,label\n" + "".join(f"{u},{'cat' if i % 2 else 'dog'}\n" for i, u in enumerate(urls))
                        + f"{server.url('/missing')},cat\n")
        manifest = same_bytes_on_beam(path, tmp_path, beam, *SPLITS, "--path_column", "url", "--http_timeout", 2,
                                      "--http_deadline", 4, "--http_retries", 0, "--max_reject_fraction", 0.2)
    assert (manifest.num_examples, manifest.num_rejected) == (6, 1)
    stored = {r["image/filename"][0].decode(): r["image"][0] for r in records(tmp_path / "beam")}
    assert stored == {u: IMAGES[u.rsplit("/", 1)[1]] for u in urls}  # the served bytes: baseline JPEGs pass through
    with open(tmp_path / "beam" / "errors.jsonl") as f:
        [row] = map(json.loads, f)
    assert (row["stage"], row["reason"]) == ("download", "HTTP 404 (Not Found)")


@pytest.mark.parametrize("beam", ENGINES)
def test_numpy_arrays(tmp_path, beam):
    rng = np.random.default_rng(3)
    arrays = {"image": rng.standard_normal((10, 4, 5)).astype(np.float32), "label": rng.integers(0, 3, 10),
              "row": np.arange(10, dtype=np.int64)}
    np.savez(tmp_path / "d.npz", **arrays)
    manifest = same_bytes_on_beam(tmp_path / "d.npz", tmp_path, beam, *SPLITS)
    assert manifest.num_examples == 10
    got = {r["row"][0]: r for r in records(tmp_path / "beam")}
    assert sorted(got) == list(range(10))
    for i, r in got.items():
        assert r["image"][0] == arrays["image"][i].tobytes() and r["label"][0] == arrays["label"][i], i


@pytest.fixture
def counting(monkeypatch):
    from test_sources import CountingSource
    from imagerecords.pipeline import sources

    # Beam's worker processes import the source's module by name, as they import any DoFn's: this folder.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [os.path.dirname(__file__),
                                                                  os.environ.get("PYTHONPATH")])))
    source = sources.register(CountingSource())
    yield source
    sources.unregister(source)


@pytest.mark.parametrize("beam", ENGINES)
def test_a_registered_source(counting, tmp_path, beam):
    from test_sources import BROKEN, SKIPPED, SHAPES

    manifest = same_bytes_on_beam("counting://12", tmp_path, beam, *SPLITS, "--max_reject_fraction", 0.2,
                                  "--image_encoding", "png")
    assert (manifest.num_examples, manifest.num_rejected) == (10, 2)
    assert keys_and_labels(tmp_path / "beam") == {f"pic{i:03d}": sorted(SHAPES).index(SHAPES[i % 3])
                                                  for i in range(12) if i not in (BROKEN, SKIPPED)}


def _without_uris(out):
    with open(out / "duplicates.jsonl") as f:
        rows = list(map(json.loads, f))
    for row in rows:
        for member in row["members"]:
            del member["uri"]
    return rows


@pytest.mark.parametrize("carry", ["bytes", "paths"])
def test_write_dataset_over_a_users_rows(tmp_path, carry):
    """A user's rows through WriteDataset publish what the command writes from the same rows as files,
    whether a row carries its image's bytes or its path (a reference the writers read)."""
    from test_write_dataset import OPTIONS, _rows, command_build, run_here
    from imagerecords.format.manifest import LOCK, STAGING

    rows = _rows(12)
    (tmp_path / "files").mkdir()
    command = command_build(rows, tmp_path / "files")
    if carry == "paths":
        rows = [{"path": str(tmp_path / "files" / f"{r['key']}.jpg"), **{k: r[k] for k in ("key", "label", "box")}}
                for r in rows]
    out = tmp_path / "ds"
    code, err = run_here(rows, out, OPTIONS)
    assert code == 0, err
    want, got = digests(str(command), str(tmp_path)), digests(str(out), str(tmp_path))
    if carry == "bytes":  # a near-duplicate row names its members' uris: bytes:<digest> here, the files' paths there
        assert _without_uris(command) == _without_uris(out)
        del want["duplicates.jsonl"], got["duplicates.jsonl"]
    assert not differences(want, got)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["num_rejected"] == 0 and manifest["name"] == "pets"
    assert not (out / STAGING).exists() and not (out / LOCK).exists()
    want = {r["key"]: r for r in _rows(12)}
    got = {r["image/filename"][0].decode(): r for r in records(out)}
    assert sorted(got) == sorted(want)
    for key, r in got.items():
        assert r["image"][0] == want[key]["image"]  # a baseline JPEG is stored as the row's bytes
        assert r["label"][0] == ["cat", "dog", "owl"].index(want[key]["label"])
        assert np.array_equal(np.frombuffer(r["box"][0], np.float32).reshape(-1, 4),
                              np.array(want[key]["box"], np.float32).reshape(-1, 4))
