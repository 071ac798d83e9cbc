"""manifest.json read back by every loader: one larger than any manifest can be is refused by its size
before a byte is read, and one of a schema preset this version does not know is one line, never "ok"."""

import json
import os
import tracemalloc

import pytest

from conftest import build
from imagerecords.cli.main import main
from imagerecords.format import access
from imagerecords.format.manifest import MAX_MANIFEST_BYTES, ManifestError
from imagerecords.reader.info import load_info


@pytest.fixture
def dataset(tmp_path, image_tree):
    out = tmp_path / "out"
    build(image_tree[0], out, "--num_shards", "1", "--max_reject_fraction", "0.1")
    return image_tree[0], out


def _commands(root, out, html):
    """Every command that loads a published manifest: verify, inspect, the report and an append."""
    out = str(out)
    return (["verify", out], ["verify", out, "--records"], ["inspect", out], ["inspect", out, "--spec", "tf"],
            ["report", out, "--html", str(html)],
            ["build", "--input", str(root), "--output", out, "--append", "--no_progress"])


def _one_line_each(capsys, commands, said):
    for argv in commands:
        code = main(argv)
        err = capsys.readouterr().err
        expected = 4 if argv[0] == "build" else 3  # an output problem for --append, an input one to read
        assert code == expected and err.count("\n") == 1 and said in err, (argv, code, err)
        assert "Traceback" not in err


def test_a_manifest_larger_than_any_can_be_is_refused_by_its_size_before_a_byte_is_read(dataset, capsys, caplog,
                                                                                        tmp_path):
    root, out = dataset
    path = out / "manifest.json"
    with open(path, "wb") as f:  # sparse: 3 GiB by its size, one block on disk
        f.write(b"{")
        f.truncate(3 * 2**30)
    said = f"{path}: {3 * 2**30:,} bytes, larger than any manifest.json can be (at most {MAX_MANIFEST_BYTES:,})"
    tracemalloc.start()
    try:
        _one_line_each(capsys, _commands(root, out, tmp_path / "report.html"), said)
        for load in (load_info, access.load_manifest):  # tf.data's reader; the torch and Grain readers'
            with pytest.raises(ManifestError) as e:
                load(str(out))
            assert str(e.value).startswith(said)
        assert os.path.getsize(path) == 3 * 2**30  # the refused file is left as it was
        # --overwrite replaces it: the commit's look at the previous manifest refuses it unread too.
        assert main(["build", "--input", str(root), "--output", str(out), "--no_progress", "--num_shards", "1",
                     "--max_reject_fraction", "0.1", "--overwrite"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"{peak:,} bytes allocated refusing a 3 GiB manifest"
    assert said in caplog.text and os.path.getsize(path) < 1 << 20


def test_a_manifest_of_an_unknown_schema_is_one_line_wherever_it_is_loaded_and_never_ok(dataset, capsys, tmp_path):
    root, out = dataset
    path = out / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["schema"] = "tfds-v9"
    path.write_text(json.dumps(manifest))
    said = f"{path}: schema 'tfds-v9' is not one this imagerecords knows (tfds, tf-models)"
    _one_line_each(capsys, _commands(root, out, tmp_path / "report.html"), said)
    for load in (load_info, access.load_manifest):
        with pytest.raises(ManifestError, match="schema 'tfds-v9' is not one"):
            load(str(out))
