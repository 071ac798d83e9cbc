"""make_dataset has one order: a run started without start_step resumes with start_step=k in a new process."""

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import pytest

from imagerecords import reader
from imagerecords.cli import main as cli
from imagerecords.reader import ReadConfig

from test_version_name import _tree

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS, K = 11, 6  # 12 images in batches of 3: 4 steps an epoch, so the resumed part crosses epochs


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one_order")
    root, out = _tree(tmp / "in"), tmp / "out"
    assert cli.main(["build", "--input", str(root), "--output", str(out), "--no_progress", "--num_shards", "3"]) == 0
    return str(out)


def _batches(path, steps, **kwargs):
    """[(filenames, labels, sha256 of the pixels)] of the first `steps` batches."""
    ds = reader.make_dataset(path, "train", batch_size=3, image_size=8, training=True, seed=5,
                             config=ReadConfig(with_filename=True, dtype="uint8"), **kwargs)
    out = []
    for images, labels, names in ds.take(steps):
        out.append(([n.decode() for n in names.numpy()], labels.numpy().tolist(),
                    hashlib.sha256(images.numpy().tobytes()).hexdigest()))
    return out


@pytest.mark.slow
def test_a_run_without_start_step_resumes_in_a_new_process(dataset):
    uninterrupted = _batches(dataset, STEPS)
    assert len(uninterrupted) == STEPS
    assert uninterrupted == _batches(dataset, STEPS, start_step=0)  # no start given is step 0 of the one order
    script = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        from test_one_order import _batches
        print(json.dumps(_batches({dataset!r}, {STEPS - K}, start_step={K})))
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    resumed = [tuple(b) for b in json.loads(done.stdout.strip().splitlines()[-1])]
    assert resumed == uninterrupted[K:]
    # The pixels differ between epochs (fresh crops), so the comparison above is about more than names.
    assert uninterrupted[0][2] != uninterrupted[4][2]


def test_steps_per_epoch_counts_the_one_order(dataset):
    ds = reader.make_dataset(dataset, "train", batch_size=5, image_size=8, config=ReadConfig(repeat=1))
    assert sum(1 for _ in ds) == reader.steps_per_epoch(dataset, "train", 5) == 3
    cached = ReadConfig(repeat=1, cache=True)
    ds = reader.make_dataset(dataset, "train", batch_size=5, image_size=8, config=cached)
    assert sum(1 for _ in ds) == reader.steps_per_epoch(dataset, "train", 5, config=cached)
