"""Values at the edges of what a feature holds, written by the test into a real build: a float too
small for float32 (stored as the nearest float32, zero), one too large, NaN and Inf in scalars and
lists, a 10 MB caption and a caption of control characters (kept exactly), and zero array rows."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import build

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = """features:
  score:   {dtype: float32}
  vec:     {dtype: float32, shape: [null]}
  caption: {dtype: string}
max_reject_fraction: 0.9
"""


@pytest.mark.slow
def test_float_edges_nan_inf_and_huge_captions_end_as_records_or_rejected_rows(tmp_path):
    import tensorflow as tf
    from imagerecords import reader

    folder = tmp_path / "in"
    folder.mkdir()
    rng = np.random.default_rng(5)
    good = {"score": 0.5, "vec": [1.0, 2.0], "caption": "a cat"}
    rows = {
        "tiny": dict(good, score=1e-50),                      # below float32's smallest subnormal
        "huge": dict(good, score=1e39),                       # above float32's largest finite
        "nan-scalar": dict(good, score=float("nan")),
        "inf-in-list": dict(good, vec=[1.0, float("-inf")]),
        "long-caption": dict(good, caption="x" * 10_000_000),
        "odd-caption": dict(good, caption="a\x00b\x1b[31m\u2028\u202ec\x7f"),
    }
    with open(folder / "m.jsonl", "w", encoding="utf-8") as f:
        for i, (key, row) in enumerate(rows.items()):
            Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).save(folder / f"{i}.png")
            f.write(json.dumps(dict(row, key=key, path=f"{i}.png", label="x")) + "\n")
    (folder / "f.yaml").write_text(CONFIG)
    out = tmp_path / "out"
    manifest = build(folder / "m.jsonl", out, "--config", folder / "f.yaml", "--num_shards", 1)

    with open(out / "errors.jsonl", encoding="utf-8") as f:
        reasons = {r["key"]: r["reason"] for r in map(json.loads, f)}
    assert reasons == {
        "huge": "feature 'score': 1e+39 is outside float32's range",
        "nan-scalar": "feature 'score': NaN is not finite; declare allow_nan: true to store it",
        "inf-in-list": "feature 'vec': [1.0, -Infinity] is not finite; declare allow_nan: true to store it",
    }
    assert manifest.num_rejected == 3 and manifest.num_examples == 3
    stored = {ex["image/filename"].numpy().decode(): ex for ex in reader.as_dataset(str(out), "train")}
    assert sorted(stored) == ["long-caption", "odd-caption", "tiny"]
    # 1e-50 rounds to float32's nearest value, +0.0, as tf.train.FloatList stores it.
    assert stored["tiny"]["score"].numpy() == np.float32(0.0) and stored["tiny"]["score"].dtype == tf.float32
    assert stored["long-caption"]["caption"].numpy() == b"x" * 10_000_000
    assert stored["odd-caption"]["caption"].numpy().decode() == rows["odd-caption"]["caption"]


def test_an_arrays_file_of_zero_rows_is_one_line_and_an_exit_code(tmp_path):
    np.savez(tmp_path / "empty.npz", image=np.zeros((0, 4, 4, 3), np.uint8), label=np.zeros((0,), np.int64))
    done = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(tmp_path / "empty.npz"),
                           "--output", str(tmp_path / "out"), "--no_progress"], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("imagerecords build: error: --input ") and "holds 0 rows" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_reader_that_closed_the_pipe_gets_no_traceback(tmp_path):
    # `imagerecords inspect OUT | head -3` once ended in a BrokenPipeError traceback. The read end is
    # closed before the command starts, so its first write fails, whatever the timing.
    np.savez(tmp_path / "a.npz", image=np.zeros((6, 4, 4, 3), np.uint8), label=np.arange(6) % 2)
    build(tmp_path / "a.npz", tmp_path / "out", "--num_shards", 2)
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "imagerecords", "inspect", str(tmp_path / "out")], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=REPO))
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (141, "")
