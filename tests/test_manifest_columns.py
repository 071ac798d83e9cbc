"""Manifest format 3 on real builds: a split held as columns, its histograms in a side file.

IMAGERECORDS_COLUMNS_FROM=1 (pipeline.publish.commit._columns_from) makes every split columnar, so a
build of example_images' 4 classes x 6 images (JPEG, PNG, GIF, greyscale, CMYK) is written in both
forms from the same input and seed; every reader must see the same records in both.
"""

import dataclasses
import hashlib
import json
import os

import pytest

from conftest import build
from imagerecords.cli import inspection, report
from imagerecords.pipeline import errors
from imagerecords.format import manifest as manifest_lib
from imagerecords.format import record_format
from imagerecords.pipeline import example_images
from imagerecords.reader.info import load_info

ARGS = ("--splits", "train=0.75,validation=0.25", "--num_shards", "3", "--write_index")


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the row-form dataset, the columnar one) of the same images, seed and shard count."""
    root = tmp_path_factory.mktemp("columns") / "images"
    example_images.write_tree(str(root), per_class=6)
    rows, columns = (str(tmp_path_factory.mktemp(n) / "ds") for n in ("rows", "cols"))
    build(root, rows, *ARGS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("IMAGERECORDS_COLUMNS_FROM", "1")
        build(root, columns, *ARGS)
    return rows, columns


@pytest.mark.slow
def test_the_columnar_form_is_written_with_its_side_file(built):
    rows, columns = built
    assert _json(os.path.join(rows, "manifest.json"))["format_version"] == 2
    m = _json(os.path.join(columns, "manifest.json"))
    assert m["format_version"] == 3
    for name, split in m["splits"].items():
        assert "shards" not in split and split["shards_file"] == f"{m['version']}/{name}.shards.jsonl"
        side = _read(os.path.join(columns, split["shards_file"]))
        assert hashlib.sha256(side).hexdigest() == split["shards_sha256"]
        assert len(side.splitlines()) == len(split["columns"]["count"]) == 3
        assert sum(split["labels"].values()) == split["num_examples"] == sum(split["columns"]["count"])


def test_the_loader_gives_the_same_shards_as_the_row_form(built):
    rows, columns = built
    plain = manifest_lib.load(rows, _read, os.path.exists, size=os.path.getsize)
    slim = manifest_lib.load(columns, _read, os.path.exists, size=os.path.getsize)
    full = manifest_lib.load(columns, _read, os.path.exists, details=True, size=os.path.getsize)

    def strip(shard, version):  # the version folder is the build id, the one thing that differs
        return (shard.index, shard.filename.replace(version, "V"), shard.count, shard.num_bytes,
                shard.index_file.replace(version, "V"), shard.labels, shard.passthrough)

    for a, b, c in zip(plain.splits, slim.splits, full.splits):
        assert (a.name, a.num_examples, a.num_bytes, a.counts) == (b.name, b.num_examples, b.num_bytes, b.counts)
        assert [s.labels for s in b.shards] == [()] * 3  # readers do not load the histograms
        assert [strip(s, plain.version) for s in a.shards] == [strip(s, full.version) for s in c.shards]
        assert b.label_counts == a.label_counts and b.image_kinds == a.image_kinds
    assert slim.image_kinds == plain.image_kinds
    # The loaded columnar manifest writes the same bytes again; with its details, the row form.
    assert slim.dumps() == _read(os.path.join(columns, "manifest.json"))
    assert json.loads(full.dumps())["format_version"] == 2


@pytest.mark.slow
def test_every_reader_reads_the_same_records(built):
    import numpy as np

    from imagerecords import reader
    from imagerecords.reader.typed import as_dataset

    rows, columns = built
    for split in ("train", "validation"):
        a, b = load_info(rows).split(split), load_info(columns).split(split)
        assert (a.num_examples, a.shard_lengths) == (b.num_examples, b.shard_lengths)
        assert [os.path.basename(p) for p in a.files] == [os.path.basename(p) for p in b.files]
        assert [s.sha256 for s in a.shards] == [s.sha256 for s in b.shards]
        counted = [sum(int(x.shape[0]) for x, _ in reader.make_dataset(p, split, batch_size=4, image_size=16))
                   for p in (rows, columns)]
        assert counted[0] == counted[1] == a.num_examples
        first = [[(ex["image/filename"].numpy(), int(ex["label"].numpy()), ex["image"].numpy().sum())
                  for ex in as_dataset(p, split).take(3)] for p in (rows, columns)]
        assert first[0] == first[1]
    from imagerecords.grain.source import RecordSource

    sources = [RecordSource(p, "train") for p in (rows, columns)]
    assert len(sources[0]) == len(sources[1]) == load_info(rows).split("train").num_examples
    assert np.array_equal(sources[0][2]["image"], sources[1][2]["image"])


@pytest.mark.slow
@pytest.mark.needs_extra("torch")
def test_the_torch_reader_reads_the_same_records(built):
    from imagerecords.torch.dataset import RecordDataset

    rows, columns = built
    sets = [RecordDataset(p, "train", image_size=16) for p in (rows, columns)]
    assert len(sets[0]) == len(sets[1]) and (sets[0][1][0] == sets[1][1][0]).all()


def test_verify_inspect_and_the_report_work_on_the_columnar_form(built, tmp_path):
    rows, columns = built
    assert inspection.verify(columns) == inspection.verify(columns, records=True)
    problems, _ = inspection.verify(columns, records=True)
    assert problems == []
    lines = [inspection.inspect(p)[0] for p in (rows, columns)]
    counts = [[line for line in found if "records in" in line] for found in lines]
    assert counts[0] == counts[1] and len(counts[0]) == 2
    page = tmp_path / "report.html"
    report.write_report(columns, str(page), load_manifest=inspection.load_for_report)
    assert "validation" in page.read_text()


def test_a_tampered_side_file_is_refused_naming_it(built, tmp_path):
    import shutil

    _, columns = built
    copy = str(tmp_path / "ds")
    shutil.copytree(columns, copy)
    m = _json(os.path.join(copy, "manifest.json"))
    side = os.path.join(copy, m["splits"]["train"]["shards_file"])
    with open(side, "ab") as f:
        f.write(b"\n")
    with pytest.raises(manifest_lib.ManifestError) as e:
        manifest_lib.load(copy, _read, os.path.exists, details=True, size=os.path.getsize)
    assert side in str(e.value) and "sha256" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(errors.InputError, match="train.shards.jsonl: sha256"):
        inspection.verify(copy)
    assert load_info(copy).split("train").num_examples > 0  # a reader does not need it
    os.remove(side)
    with pytest.raises(errors.InputError, match="train.shards.jsonl: missing"):
        inspection.inspect(copy)


def test_an_append_onto_the_columnar_form_keeps_old_and_new_shards(built, tmp_path, monkeypatch):
    import shutil

    _, columns = built
    out = str(tmp_path / "ds")
    shutil.copytree(columns, out)
    before = manifest_lib.load(out, _read, os.path.exists, details=True, size=os.path.getsize)
    more = tmp_path / "more"
    example_images.write_tree(str(more), per_class=2)
    for cls in os.listdir(more):  # new files under the same classes
        for name in os.listdir(more / cls):
            os.rename(more / cls / name, more / cls / f"new-{name}")
    monkeypatch.setenv("IMAGERECORDS_COLUMNS_FROM", "1")
    build(more, out, *ARGS, "--append")
    after = manifest_lib.load(out, _read, os.path.exists, details=True, size=os.path.getsize)
    assert _json(os.path.join(out, "manifest.json"))["format_version"] == 3
    assert after.num_examples == before.num_examples + 8
    for old in before.splits:
        new = after.split(old.name)
        # histograms kept through the append; the shards are renumbered into the new version's folder
        kept = [dataclasses.replace(s, filename="", index_file="") for s in list(new.shards)[:len(old.shards)]]
        assert kept == [dataclasses.replace(s, filename="", index_file="") for s in old.shards]
        assert all(s.filename.startswith(after.version + "/") for s in new.shards)
        assert len(new.shards) > len(old.shards)
        assert sum(n for _, n in new.label_counts) == new.num_examples
    assert inspection.verify(out, records=True)[0] == []
    info = load_info(out)
    assert sum(s.num_examples for s in info.splits.values()) == after.num_examples


def _manifest(filenames):
    shards = tuple(manifest_lib.Shard(i, name, 5, 100, hashlib.sha256(name.encode()).hexdigest(), ((0, 5),), 5)
                   for i, name in enumerate(filenames))
    return manifest_lib.Manifest("ds", "tfds", ("a",), 0, False, 0, {}, (manifest_lib.Split("train", shards),), 0,
                                 version="v-1")


def test_a_split_whose_names_are_off_the_pattern_keeps_its_rows():
    named = _manifest([f"v-1/{record_format.shard_file_name('ds', 'train', i, 2)}" for i in range(2)])
    columnar, files = named.with_side_files(1)
    assert [name for name, _ in files] == ["v-1/train.shards.jsonl"] and json.loads(columnar.dumps())["format_version"] == 3
    odd = _manifest(["v-1/ds-train.tfrecord-0-of-2", "v-1/other-name"])
    kept, files = odd.with_side_files(1)
    assert files == [] and kept == odd and json.loads(kept.dumps())["format_version"] == 2


def test_columns_that_disagree_are_refused_in_one_line():
    columnar, _ = _manifest([f"v-1/{record_format.shard_file_name('ds', 'train', i, 2)}" for i in range(2)]
                            ).with_side_files(1)
    d = json.loads(columnar.dumps())
    d["splits"]["train"]["columns"]["count"].pop()
    with pytest.raises(manifest_lib.ManifestError, match=r"manifest.json: malformed .*disagree: 1 counts, 2 sizes"):
        manifest_lib.Manifest.from_json(d)
    d = json.loads(columnar.dumps())
    d["splits"]["train"]["columns"]["files"][0][0] = ".."
    with pytest.raises(manifest_lib.ManifestError, match="shard folder '..'"):
        manifest_lib.Manifest.from_json(d)


def test_a_commit_cut_after_staging_the_side_file_is_finished_with_it(tmp_path, monkeypatch):
    from test_failures import cli_run, kill_at

    root = tmp_path / "images"
    example_images.write_tree(str(root), per_class=3)
    out = tmp_path / "ds"
    monkeypatch.setenv("IMAGERECORDS_COLUMNS_FROM", "1")
    kill_at("in_commit", root, out, str(tmp_path))  # the side file is staged and named in the commit record
    assert not (out / "manifest.json").exists()
    code, _, err = cli_run("finish", out)
    assert code == 0, err
    m = _json(out / "manifest.json")
    assert m["format_version"] == 3
    for split in m["splits"].values():
        assert hashlib.sha256(_read(out / split["shards_file"])).hexdigest() == split["shards_sha256"]
    assert inspection.verify(str(out), records=True)[0] == []
