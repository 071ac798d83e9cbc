"""No silent mix: a writer that outlives its launcher, a reader during rebuilds, resumed builds.

Real CLI builds into tmp_path; the phase observer of tests/support/phases.py holds a process at a phase
until the test releases it, so each race happens in one fixed order.
"""

import glob
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from conftest import published_version, shard_files, without_version
from imagerecords.format.manifest import LOCK, MANIFEST, STAGING
from imagerecords.cli import main as cli

pytestmark = pytest.mark.slow

ARGS = ["--num_shards", "4", "--max_reject_fraction", "0.05", "--no_progress"]


def _env(**extra):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _start(*args, **env):
    return subprocess.Popen([sys.executable, "-m", "imagerecords", *map(str, args)], env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for(path, proc, what, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert proc.poll() is None, (what, proc.communicate())
        assert time.monotonic() < deadline, f"{what} never happened within {timeout} s"
        time.sleep(0.02)


def _keys_in(output):
    """Every record's image/filename, shard by shard in manifest order (what a plain reader gets)."""
    import tensorflow as tf

    keys = []
    for path in shard_files(output):
        for raw in tf.data.TFRecordDataset(path):
            keys.append(tf.train.Example.FromString(raw.numpy()).features.feature["image/filename"]
                        .bytes_list.value[0].decode())
    return keys


@pytest.fixture(scope="module")
def tree(image_tree, tmp_path_factory):
    root, files = image_tree
    base = tmp_path_factory.mktemp("trust")
    clean = base / "clean"
    assert subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output",
                           str(clean), *ARGS], capture_output=True).returncode == 0
    return root, clean


ORPHAN = r"""
import json, os, sys
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import ImageRef
from imagerecords.pipeline.write import shard_writer
from imagerecords.pipeline.write import stream as write_stream

root, out, build_id = sys.argv[1:4]
labels = refs_lib.vocabulary(sorted(os.listdir(root)), "auto", 0)
refs = []
for label in sorted(os.listdir(root)):
    for name in sorted(os.listdir(os.path.join(root, label))):
        path = os.path.join(root, label, name)
        refs.append(ImageRef(f"{label}/{name}", path, label, "train", os.path.getsize(path), labels.label_id(label)))
options = codec.ImageOptions()
try:
    writer = shard_writer.ShardWriter(output=out, build_id=build_id, name="images", preset="tfds", options=options,
                                contents=False)
    writer.write(("train", 0, 4), refs, labels, read_bytes=write_stream.limited_reader(options))
except shard_writer.BuildAbandoned as e:
    print(e, file=sys.stderr)
    sys.exit(3)
"""


@pytest.mark.slow
@pytest.mark.parametrize("rerun", [["--overwrite"], ["--overwrite", "--resume"]])
def test_a_writer_that_outlived_its_launcher_never_reaches_the_next_build(tree, tmp_path, rerun):
    """The orphan race of a SIGTERM'd launcher, in a fixed order: build A's writer (its launcher
    dead, its lock stale) holds a finished shard of the same name as build B's before its final
    rename; B takes over the lock and stages; the orphan is released while B waits before its
    commit; B then publishes. The orphan must give up, and B's dataset is exactly its inputs."""
    root, clean = tree
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK).write_text(json.dumps({"build_id": "20261201T000000Z-orphan", "host": socket.gethostname(),
                                        "pid": int(dead.stdout), "started": "t", "command": "build"}))
    orphan_release, build_release = tmp_path / "release-orphan", tmp_path / "release-build"
    (tmp_path / "orphan").mkdir()
    orphan = subprocess.Popen([sys.executable, "-c", ORPHAN, str(root), str(out), "20261201T000000Z-orphan"],
                              env=_env(IMAGERECORDS_TEST_PAUSE="before_rename",
                                       IMAGERECORDS_TEST_PAUSE_DIR=tmp_path / "orphan",
                                       IMAGERECORDS_TEST_RELEASE=orphan_release),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for(tmp_path / "orphan" / "before_rename", orphan, "the orphan writer reaching its rename")
    (tmp_path / "build").mkdir()
    second = _start("build", "--input", root, "--output", out, *ARGS, *rerun,
                    IMAGERECORDS_TEST_PAUSE="before_commit", IMAGERECORDS_TEST_PAUSE_DIR=tmp_path / "build",
                    IMAGERECORDS_TEST_RELEASE=build_release)
    _wait_for(tmp_path / "build" / "before_commit", second, "the second build reaching its commit")
    orphan_release.write_text("")
    _, orphan_err = orphan.communicate(timeout=60)
    assert orphan.returncode == 3 and "no longer holds the lock" in orphan_err, orphan_err
    build_release.write_text("")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert "took over the lock of build 20261201T000000Z-orphan" in err
    assert cli.verify(str(out), records=True) == []
    assert sorted(_keys_in(out)) == sorted(_keys_in(clean)) and len(set(_keys_in(out))) == len(_keys_in(out))
    for a, b in zip(shard_files(out), shard_files(clean)):
        assert open(a, "rb").read() == open(b, "rb").read(), a
    assert not (out / STAGING).exists()


@pytest.mark.slow
def test_a_reader_during_ten_rebuilds_reads_one_build_or_fails(tree, tmp_path):
    """A trainer loads manifest.json and reads every shard it lists, pass after pass, while 10
    --overwrite rebuilds alternate two seeds: each pass reads exactly one build's records in that
    build's order, or raises (its files were removed by a later build); never a mix."""
    from imagerecords import reader

    root, _ = tree
    orders = {}
    for seed in (1, 2):
        ref = tmp_path / f"seed{seed}"
        assert subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(ref),
                               *ARGS, "--seed", str(seed)], capture_output=True).returncode == 0
        orders[seed] = _keys_in(ref)
    assert orders[1] != orders[2] and sorted(orders[1]) == sorted(orders[2])
    out = tmp_path / "out"
    assert subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out),
                           *ARGS, "--seed", "1"], capture_output=True).returncode == 0
    import tensorflow as tf

    outcomes = {"seed 1": 0, "seed 2": 0, "raised": 0}
    mixed = []
    done = threading.Event()

    def read_passes():
        while not done.is_set():
            try:
                info = reader.load_info(str(out))
                keys = []
                for shard in info.split("train").shards:
                    for raw in tf.data.TFRecordDataset(shard.path):
                        keys.append(tf.train.Example.FromString(raw.numpy()).features.feature["image/filename"]
                                    .bytes_list.value[0].decode())
            except (tf.errors.NotFoundError, FileNotFoundError, OSError):
                outcomes["raised"] += 1
                continue
            for seed, order in orders.items():
                if keys == order:
                    outcomes[f"seed {seed}"] += 1
                    break
            else:
                mixed.append(keys)

    thread = threading.Thread(target=read_passes)
    thread.start()
    try:
        for i in range(10):
            code = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output",
                                   str(out), *ARGS, "--overwrite", "--seed", str(2 - i % 2)], capture_output=True)
            assert code.returncode == 0, code.stderr
    finally:
        done.set()
        thread.join(120)
    print(f"reader passes during 10 rebuilds: {outcomes}, mixed: {len(mixed)}")
    assert not mixed, f"{len(mixed)} passes read a mix of two builds"
    assert outcomes["seed 1"] and outcomes["seed 2"], outcomes
    assert len([n for n in os.listdir(out) if n.startswith("v-")]) == 2  # --keep_versions 2


def _kill_at_half(root, out, tmp_path, *extra):
    """Starts a build of 4 shards that holds at its second staged shard (two shard writers: each
    stops after its first), waits there and kills its process group: 2 of 4 shards are staged."""
    marker = tmp_path / "mid_shards"
    if marker.exists():
        marker.unlink()
    proc = _start("build", "--input", root, "--output", out, *ARGS, *extra,
                  IMAGERECORDS_TEST_PAUSE="mid_shards", IMAGERECORDS_TEST_PAUSE_DIR=tmp_path)
    _wait_for(marker, proc, "a shard being staged")
    staged = lambda: glob.glob(str(out / STAGING / "*" / "*.staged.json"))
    deadline = time.monotonic() + 60
    while len(staged()) < 2 and time.monotonic() < deadline and "DirectRunner" not in " ".join(extra):
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return {json.load(open(p))["staged"]["result"]["filename"]: p[:-len(".staged.json")] for p in staged()}


@pytest.mark.slow
@pytest.mark.parametrize("engine", [["--local_workers", "0"], ["--runner", "DirectRunner",
                                                                "--direct_num_workers=1"]])
def test_resume_moves_the_complete_shards_and_gives_a_clean_builds_bytes(tree, tmp_path, engine):
    root, clean = tree
    out = tmp_path / "out"
    staged = _kill_at_half(root, out, tmp_path, *engine)
    assert 1 <= len(staged) < 4, staged
    inodes = {name: os.stat(path).st_ino for name, path in staged.items()}
    code = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out),
                           *ARGS, "--resume", *engine], capture_output=True, text=True)
    assert code.returncode == 0, code.stderr
    assert f"resumed: {len(staged)} of 4 shards reused" in code.stderr, code.stderr
    version = published_version(out)
    for name, inode in inodes.items():
        assert os.stat(out / version / name).st_ino == inode, f"{name} was rewritten, not moved"
    for a, b in zip(shard_files(out), shard_files(clean)):
        assert open(a, "rb").read() == open(b, "rb").read(), a
    for name in ("errors.jsonl", "duplicates.jsonl", "label.labels.txt"):
        assert (out / name).read_bytes() == (clean / name).read_bytes(), name
    assert without_version(json.load(open(out / MANIFEST))) == without_version(json.load(open(clean / MANIFEST)))
    assert not (out / STAGING).exists()


def test_resume_rewrites_exactly_the_shard_of_a_changed_input(tree, tmp_path):
    import shutil

    from PIL import Image

    root, clean = tree
    mine = tmp_path / "tree"
    shutil.copytree(root, mine)
    out = tmp_path / "out"
    staged = _kill_at_half(mine, out, tmp_path, "--local_workers", "0")
    assert len(staged) == 2, staged
    changed_shard = sorted(staged)[0]
    record = json.load(open(staged[changed_shard] + ".staged.json"))
    key = record["staged"]["contents"][0][1][0]
    victim = mine / key
    Image.new("RGB", (40, 30), (250, 10, 10)).save(victim, format="PNG")  # another size: another fingerprint
    kept = sorted(staged)[1]
    inode = os.stat(staged[kept]).st_ino
    code = subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(mine), "--output", str(out),
                           *ARGS, "--resume", "--local_workers", "0"], capture_output=True, text=True)
    assert code.returncode == 0, code.stderr
    assert "resumed: 1 of 4 shards reused" in code.stderr, code.stderr
    assert os.stat(out / published_version(out) / kept).st_ino == inode
    # The dataset is that of a clean build of the changed tree.
    fresh = tmp_path / "fresh"
    assert subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(mine), "--output",
                           str(fresh), *ARGS], capture_output=True).returncode == 0
    for a, b in zip(shard_files(out), shard_files(fresh)):
        assert open(a, "rb").read() == open(b, "rb").read(), a


@pytest.mark.slow
def test_a_reader_whose_version_was_removed_fails_naming_the_rebuild(tree, tmp_path):
    """make_dataset holds the manifest it loaded: after one rebuild it still reads its own version
    (kept); after a second, that version is gone and the read fails saying so, never reading the
    new build's files."""
    import tensorflow as tf

    from imagerecords import reader

    root, clean = tree
    out = tmp_path / "out"
    run = lambda *extra: subprocess.run([sys.executable, "-m", "imagerecords", "build", "--input", str(root),
                                         "--output", str(out), *ARGS, *extra], capture_output=True, text=True)
    assert run().returncode == 0
    ds = reader.make_dataset(str(out), "train", batch_size=8, image_size=16, training=False)
    first = sum(int(images.shape[0]) for images, _ in ds)
    assert run("--overwrite", "--seed", "5").returncode == 0
    assert sum(int(images.shape[0]) for images, _ in ds) == first  # its version is still there
    assert run("--overwrite", "--seed", "6").returncode == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"no longer exists: the dataset in .* was rebuilt "
                                                             r"after this reader loaded its manifest.json"):
        for _ in ds:
            pass
