"""An append takes the dataset's settings: `build --input IN --output OUT --append` alone writes records
as the dataset's build did (image size, splits, index files); only a setting given with another value is
refused, in one line naming it. Keys already in the dataset are counted apart from duplicate groups.

Fixtures: example_images.write_tree makes a class-folder tree of small real images (48x40); the
delta's images are drawn by example_images.draw at 200x120 and saved with Pillow, so a record that
obeys --max_side has been shrunk.
"""

import json
import os
import subprocess
import sys

import pytest

from imagerecords.pipeline import example_images

MAX_SIDE = 24
SPLITS = {"train": 0.6, "validation": 0.4}
BASE = ["--max_side", MAX_SIDE, "--splits", "train=0.6,validation=0.4", "--write_index", "--num_shards", 2]


def _run(*args):
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "build", *map(str, args), "--no_progress"],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def _manifest(out):
    with open(os.path.join(out, "manifest.json")) as f:
        return json.load(f)


def _records(out):
    """{key: (split, height, width of the decoded image)} of every record, read with imagerecords' reader."""
    from imagerecords.reader.typed import as_dataset

    found = {}
    for split in _manifest(out)["splits"]:
        for ex in as_dataset(out, split):
            found[ex["image/filename"].numpy().decode()] = (split, *ex["image"].shape[:2])
    return found


def _add_delta(root):
    """Three new images of 200x120 (one saved twice under two keys: a true duplicate group); returns their keys."""
    from PIL import Image

    os.makedirs(root / "zebra")
    keys = []
    for i in range(2):
        Image.fromarray(example_images.draw("circle", 50 + i, size=(200, 120))).save(root / "zebra" / f"z{i}.png")
        keys.append(f"zebra/z{i}.png")
    Image.fromarray(example_images.draw("square", 57, size=(200, 120))).save(root / "zebra" / "twin_a.png")
    with open(root / "zebra" / "twin_a.png", "rb") as src, open(root / "zebra" / "twin_b.png", "wb") as dst:
        dst.write(src.read())
    return keys + ["zebra/twin_a.png", "zebra/twin_b.png"]


@pytest.mark.slow
def test_an_append_with_only_input_output_and_append_takes_the_datasets_settings(tmp_path):
    from imagerecords.pipeline.refs import assign_split

    root, out = tmp_path / "in", str(tmp_path / "out")
    example_images.write_tree(str(root), per_class=4, broken=False)
    rc, _, err = _run("--input", root, "--output", out, *BASE)
    assert rc == 0, err
    first = _manifest(out)
    old = _records(out)
    new_keys = _add_delta(root)

    rc, summary, err = _run("--input", root, "--output", out, "--append")
    assert rc == 0, err
    m = _manifest(out)
    assert m["parameters"] == first["parameters"]
    assert m["parameters"]["image"]["max_side"] == MAX_SIDE and m["parameters"]["write_index"] is True
    records = _records(out)
    assert set(records) - set(old) == set(new_keys)
    for key in new_keys:
        split, height, width = records[key]
        assert max(height, width) == MAX_SIDE, (key, height, width)  # shrunk from 200x120, as the dataset's
        assert split == assign_split(tuple(SPLITS.items()), 0, key)  # the dataset's split hash
    # Every shard of the delta (the new version folder) has its index file, as the dataset's build wrote them.
    new_shards = [s for split in m["splits"].values() for s in split["shards"]
                  if s["filename"].startswith(m["version"] + "/")]
    assert new_shards and all(s.get("index_file") and os.path.isfile(os.path.join(out, s["index_file"]))
                              for s in new_shards), new_shards
    # The keys the dataset held are "already in the dataset", apart from the one true duplicate group.
    assert m["num_already_present"] == len(old) and m["num_duplicate_groups"] == 1, m
    assert f"{len(old)} already in the dataset" in summary, summary
    assert "duplicates" in summary and " 1 groups of identical files" in summary, summary
    with open(os.path.join(out, "duplicates.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    assert sum(len({mb["key"] for mb in r["members"]}) == 1 for r in rows) == len(old)  # the rows stay

    page = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "report", out, "--html", str(page)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert f'data-already-present="{len(old)}"' in html and 'data-duplicates="1"' in html


@pytest.mark.slow
@pytest.mark.parametrize("flag, value, named", [
    ("--max_side", 48, f"max_side 48 differs from the dataset's {MAX_SIDE}"),
    ("--splits", "train=0.5,validation=0.5", "splits"),
    ("--image_encoding", "png", "image_encoding"),
    ("--seed", 3, "seed 3 differs from the dataset's 0"),
])
def test_a_setting_given_with_another_value_is_refused_in_one_line(tmp_path, flag, value, named):
    root, out = tmp_path / "in", str(tmp_path / "out")
    example_images.write_tree(str(root), per_class=2, broken=False)
    assert _run("--input", root, "--output", out, *BASE)[0] == 0
    before = open(os.path.join(out, "manifest.json"), "rb").read()
    _add_delta(root)
    rc, _, err = _run("--input", root, "--output", out, "--append", flag, value)
    assert rc == 2, err
    assert err.strip().count("\n") == 0 and "--append refused" in err and named in err, err
    assert open(os.path.join(out, "manifest.json"), "rb").read() == before
    # The same setting given with the dataset's own value is no difference.
    rc, _, err = _run("--input", root, "--output", out, "--append", "--max_side", MAX_SIDE, "--write_index")
    assert rc == 0, err


@pytest.mark.slow
def test_the_library_appends_with_the_datasets_settings(tmp_path):
    import imagerecords

    root, out = tmp_path / "in", str(tmp_path / "out")
    example_images.write_tree(str(root), per_class=2, broken=False)
    imagerecords.build(str(root), out, max_side=MAX_SIDE, splits=SPLITS, write_index=True, num_shards=2)
    new_keys = _add_delta(root)
    with pytest.raises(imagerecords.Error) as caught:
        imagerecords.build(str(root), out, append=True, max_side=64)
    assert str(caught.value).count("\n") == 0 and "max_side 64 differs" in str(caught.value)
    manifest = imagerecords.build(str(root), out, append=True, max_side=None)  # None: not given
    assert manifest.parameters["image"]["max_side"] == MAX_SIDE
    records = _records(out)
    assert all(max(records[k][1:]) == MAX_SIDE for k in new_keys)
    delta = [s for split in manifest.splits for s in split.shards if s.filename.startswith(manifest.version + "/")]
    assert delta and all(s.index_file for s in delta)


def test_the_command_and_the_library_record_which_settings_were_given():
    from imagerecords.cli import flags
    from imagerecords.builder.options import BuildOptions

    given = flags.parse_args(["--input", "a", "--output", "b", "--append", "--max_side", "5"]).options.settings_given
    assert {"append", "max_side"} <= given and not given & {"splits", "write_index", "image_encoding", "seed"}
    given = BuildOptions.make("a", "b", append=True, quality=80, splits=None).settings_given
    assert given == {"append", "quality"}
    with pytest.raises(ValueError, match="settings_given"):
        BuildOptions(config=BuildOptions.make("a", "b").config, settings_given=3)


def test_rows_of_keys_already_present_are_counted_apart_from_duplicate_groups(tmp_path):
    from imagerecords.pipeline.refs import DuplicateGroup, LabelMap
    from imagerecords.pipeline.publish import results as results_lib

    present = DuplicateGroup("aa", (("k", "train", "v-1/images-train.tfrecord-00000-of-00001", "cat"),
                                    ("k", "train", "/in/cat/k.jpg", "cat")))
    twins = DuplicateGroup("bb", (("k1", "train", "/in/cat/k1.jpg", "cat"), ("k2", "test", "/in/dog/k2.jpg", "dog")))
    assert present.already_present and not twins.already_present
    results = results_lib.record_results([], [], LabelMap(("cat", "dog"), 0, False), [present, twins],
                                    output=str(tmp_path), find_duplicates=True,
                                    build=dict(build_id="b1", name="images", schema="tfds", seed=0, parameters={},
                                               versions={}, max_reject_fraction=0.0))
    assert (results.num_already_present, results.num_duplicate_groups, results.num_leaking_groups,
            results.num_label_conflicts) == (1, 1, 1, 1)
    manifest = results.manifest(created="t")
    assert manifest.num_already_present == 1 and manifest.num_duplicate_groups == 1
    assert manifest.to_json()["num_already_present"] == 1
    # A build with none present writes no such key: other builds' manifests keep their bytes.
    none = results_lib.record_results([], [], LabelMap(("cat",), 0, False), [twins], output=str(tmp_path / "o"),
                                 find_duplicates=True, build=dict(build_id="b2", name="images", schema="tfds", seed=0,
                                                                  parameters={}, versions={}, max_reject_fraction=0.0))
    assert "num_already_present" not in none.manifest(created="t").to_json()
