"""Every shard glob the README and docs/ show reads exactly one version's shards of one split, with
two versions on disk; `inspect --files/--glob` print the same shards."""

import glob
import json
import os
import re
import shlex

import pytest

from imagerecords.cli import main as cli
from imagerecords.format.manifest import MANIFEST

from test_arrays import _readme_blocks
from test_version_name import _tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
_GLOB_RE = re.compile(r"[\w./<>\-{}]*\*[\w./<>*\-{}]*")
NAMED = "2024-06"  # the --version_name the docs' named examples use
EXAMPLE_ID = "v-20261201T090000Z-1a2b3c"  # the build id the docs' examples show

# Every glob over shards in the docs, as written, and what it must do: "reads" (exactly the current
# version's shards of the split it names) or "nothing" (a counterexample the text says matches nothing).
DOCUMENTED = {
    "ds/{version}/images-train.tfrecord-*": "reads",
    "OUT/<version>/images-train.tfrecord-*": "reads",
    "OUT/images-train*": "nothing",
    "OUT/<version>/images-train*": "reads",
    "OUT/<version>/images-train.tfrecord*": "reads",
    "OUT/<version>/images-train*-of-*": "reads",
    f"OUT/{NAMED}/images-train*": "reads",
    f"OUT/{NAMED}/images-validation*": "reads",
    "OUT/NAME/images-train*": "reads",
    "OUT/<version>/images-validation.tfrecord-*": "reads",
    "images-train.tfrecord-*": "reads",  # recipes: os.path.join(OUT, version, ...)
    "images-validation.tfrecord-*": "reads",
    f"OUT/{EXAMPLE_ID}/images-train.tfrecord-*": "reads",
    f"OUT/{EXAMPLE_ID}/images-validation.tfrecord-*": "reads",
}
NOT_SHARD_GLOBS = {"test_without_an_image_*"}  # a test name pattern in docs/bad-inputs.md


def documented_globs():
    """{glob as written: [file:line, ...]} of every shard glob in README.md and docs/*.md."""
    found = {}
    for doc in DOCS:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for m in _GLOB_RE.finditer(line):
                    g = m.group(0)
                    if any(k in g for k in ("tfrecord", "train", "validation", "-of-")) and g not in NOT_SHARD_GLOBS:
                        found.setdefault(g, []).append(f"{doc}:{number}")
    return found


def test_every_documented_glob_is_in_the_table():
    found = documented_globs()
    assert set(found) == set(DOCUMENTED), {g: found.get(g, "not in the docs") for g in set(found) ^ set(DOCUMENTED)}


def _concrete(pattern, out, version, named):
    """The documented glob with its placeholders filled in for the dataset at `out`."""
    text = pattern.replace("ds/", "OUT/").replace("{version}", "<version>").replace(EXAMPLE_ID, "<version>")
    text = text.replace(f"/{NAMED}/", f"/{named}/").replace("/NAME/", f"/{named}/")
    if not text.startswith("OUT/"):
        text = f"OUT/<version>/{text}"  # written relative to the version folder
    return text.replace("<version>", version).replace("OUT", str(out), 1)


def _check_globs(out, expect_named):
    manifest = json.loads((out / MANIFEST).read_text())
    version = manifest["version"]
    assert len([p for p in out.iterdir() if p.is_dir()]) == 2  # the previous version is kept beside it
    checked = 0
    for pattern, what in DOCUMENTED.items():
        named_pattern = NAMED in pattern or "/NAME/" in pattern
        if named_pattern != expect_named and what == "reads":
            continue  # a named glob names the named build; the <version> ones follow any current build
        concrete = _concrete(pattern, out, version, version)
        files = sorted(glob.glob(concrete))
        if what == "nothing":
            assert files == [], pattern
            continue
        split = "validation" if "validation" in pattern else "train"
        listed = sorted(str(out / s["filename"]) for s in manifest["splits"][split]["shards"])
        assert files == listed, pattern
        import tensorflow as tf

        records = sum(1 for _ in tf.data.TFRecordDataset(files))
        assert records == manifest["splits"][split]["num_examples"] > 0, pattern
        checked += 1
    return checked


def _inspect(capsys, out, *args):
    capsys.readouterr()
    assert cli.main(["inspect", str(out), *args]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_documented_globs_after_two_rebuilds(tmp_path, capsys):
    root, out = _tree(tmp_path / "in"), tmp_path / "out"
    common = ["build", "--input", str(root), "--output", str(out), "--no_progress", "--num_shards", "2",
              "--splits", "train=0.5,validation=0.5"]
    assert cli.main(common) == 0
    for seed in (1, 2):  # two rebuilds, other orders: the default --keep_versions 2 keeps one of them
        assert cli.main([*common, "--overwrite", "--seed", str(seed)]) == 0
    assert _check_globs(out, expect_named=False) >= 9
    # The same after a named rebuild: the named globs read it, the previous v- version still on disk.
    assert cli.main([*common, "--overwrite", "--seed", "3", "--version_name", NAMED]) == 0
    assert _check_globs(out, expect_named=True) >= 3
    manifest = json.loads((out / MANIFEST).read_text())
    for split in ("train", "validation"):
        listed = [str(out / s["filename"]) for s in manifest["splits"][split]["shards"]]
        assert _inspect(capsys, out, "--files", split).splitlines() == listed
        printed = _inspect(capsys, out, "--glob", split).strip()
        assert printed == str(out / NAMED / f"images-{split}.tfrecord-*")
        assert sorted(glob.glob(printed)) == sorted(listed)


def test_inspect_files_and_glob_refuse_an_unknown_split(tmp_path, capsys):
    root, out = _tree(tmp_path / "in", per_class=1), tmp_path / "out"
    assert cli.main(["build", "--input", str(root), "--output", str(out), "--no_progress"]) == 0
    for flag in ("--files", "--glob"):
        capsys.readouterr()
        assert cli.main(["inspect", str(out), flag, "nope"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"imagerecords inspect: error: {out}: no split 'nope'; the splits are train"]
    capsys.readouterr()
    assert cli.main(["inspect", str(tmp_path / "missing"), "--glob", "train"]) == 3


@pytest.mark.slow
def test_readme_arrays_example_reads_one_version_after_rebuilds(tmp_path, monkeypatch):
    """The README's arrays example after two --overwrite rebuilds: 1,000 records, not 2,000."""
    (_, make), (_, command), (_, read) = _readme_blocks()
    monkeypatch.chdir(tmp_path)
    exec(make, {})
    argv = shlex.split(command.strip())
    for extra in ([], ["--overwrite"], ["--overwrite", "--seed", "1"]):
        assert cli.main([*argv[1:], "--no_progress", *extra]) == 0
    assert len([p for p in (tmp_path / "ds").iterdir() if p.is_dir()]) == 2
    got = {}
    exec(read, got)
    assert sum(1 for _ in got["dataset"]) == 1000
