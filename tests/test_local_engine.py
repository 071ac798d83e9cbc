"""The local engine (the local default) against Beam's DirectRunner: the same bytes, without Beam."""

import json
import glob
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from conftest import (build, identical_rows, manifest_without_time, published_version, shard_files,
                      tree_with_twins)
from imagerecords.format.manifest import LOCK, MANIFEST, STAGING
from imagerecords.cli import main as cli
from imagerecords.builder.engines import uses_local_engine
from imagerecords.pipeline.sources import manifests

SPLITS = "train=0.7,validation=0.3"


def files_of(out):
    """{relative path: bytes} of everything in a dataset folder but manifest.json (it holds the time)."""
    found = {}
    version = published_version(out)
    for dirpath, _, names in os.walk(out):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, out)
            if version and rel.startswith(version + os.sep):
                rel = "v-<build>" + rel[len(version):]
            if rel not in (MANIFEST, "dataset_info.json"):  # both name the version folder
                found[rel] = open(path, "rb").read()
    return found


def assert_engines_agree(inp, tmp_path, *args):
    """Builds `inp` on the local engine (with threads, and with 2 worker processes) and on
    DirectRunner, asserts byte-identical datasets, and returns the local build's manifest."""
    ours = build(inp, tmp_path / "local", *args, "--local_workers", 0)
    build(inp, tmp_path / "processes", *args, "--local_workers", 2)
    theirs = build(inp, tmp_path / "direct", *args, workers=2)
    want = files_of(tmp_path / "direct")
    for engine in ("local", "processes"):
        got = files_of(tmp_path / engine)
        assert sorted(got) == sorted(want), engine
        for name in got:
            assert got[name] == want[name], (engine, name)
        assert manifest_without_time(tmp_path / engine) == manifest_without_time(tmp_path / "direct")
    assert ours.num_examples == theirs.num_examples
    return ours


@pytest.mark.slow
def test_folder_build_with_splits_index_reencode_and_duplicates(image_tree, tmp_path, capsys):
    tree, circle = tree_with_twins(image_tree, tmp_path)
    (tree / "README.txt").write_text("a root-level file: a skipped row")
    manifest = assert_engines_agree(tree, tmp_path, "--splits", SPLITS, "--num_shards", 3, "--write_index",
                                    "--reencode", "--max_side", 32, "--max_reject_fraction", 0.05)
    assert manifest.num_examples == 42 and manifest.num_rejected == 1 and manifest.num_skipped == 1
    assert manifest.num_duplicate_groups == 2 and manifest.num_label_conflicts == 1
    assert json.load(open(tmp_path / "direct" / MANIFEST))["num_label_conflicts"] == 1
    rows = identical_rows(tmp_path / "local")
    conflict = [r for r in rows if r["conflict"]]
    assert [[(m["key"], m["label"]) for m in r["members"]] for r in conflict] == [
        [(f"circle/{circle}", "circle"), ("square/copy_of_a_circle.jpg", "square")]]
    assert conflict[0]["labels"] == ["circle", "square"]
    plain = [r for r in rows if not r["conflict"]]
    assert [r["labels"] for r in plain] == [["square"]] and len(plain[0]["members"]) == 2
    summary = capsys.readouterr().out
    line = "  label conflicts      1 groups of identical files with different labels (see duplicates.jsonl)"
    assert summary.splitlines().count(line) == 3, summary  # one per build: threads, processes, DirectRunner
    assert len(os.listdir(tmp_path / "local" / published_version(tmp_path / "local") / "index")) == 6
    assert cli.verify(str(tmp_path / "local"), records=True) == []


@pytest.mark.slow
def test_csv_manifest_with_split_column_sizes_bad_rows_and_repeated_keys(image_tree, tmp_path):
    root, files = image_tree
    man = tmp_path / "list.csv"
    rows = ["path,label,split,key,size"]
    for cls, rels in sorted(files.items()):
        for i, rel in enumerate(rels):
            path = root / cls / rel
            size = os.path.getsize(path) if i % 2 else ""  # half the rows give their size
            rows.append(f"{path},{cls},{'validation' if i % 3 == 0 else 'train'},{cls}/{rel},{size}")
    rows.append(f"{root / 'circle' / files['circle'][0]},circle,validation,circle/{files['circle'][0]},")  # repeated key
    rows.append(f"{tmp_path / 'missing.jpg'},circle,train,missing,")  # no such file
    rows.append(f"{root / 'circle' / files['circle'][1]},circle,bad-split,weird,")  # bad split name
    rows.append("")  # a blank line is not a row
    man.write_text("\r\n".join(rows) + "\r\n")  # Windows line ends
    manifest = assert_engines_agree(man, tmp_path, "--num_shards", 2, "--max_reject_fraction", 0.2)
    errors = [json.loads(line) for line in open(tmp_path / "local" / "errors.jsonl")]
    assert sorted((r["key"], r["stage"]) for r in errors) == [
        (f"circle/{files['circle'][0]}", "duplicate"), ("missing", "list"), ("weird", "label")]
    assert {s.name for s in manifest.splits} == {"train", "validation"}


@pytest.mark.slow
def test_jsonl_manifest_with_a_label_map_and_skip_stat(image_tree, tmp_path):
    root, files = image_tree
    man = tmp_path / "list.jsonl"
    labels = tmp_path / "labels.txt"
    labels.write_text("square\ncircle\n")  # stripes and triangle are not in the map: rejected rows
    with open(man, "w") as f:
        for cls, rels in sorted(files.items()):
            for rel in rels:
                f.write(json.dumps({"path": str(root / cls / rel), "label": cls, "key": f"{cls}/{rel}"}) + "\n")
        f.write("{not json\n")
    with open(man, "ab") as f:
        f.write(b'{"path": "x.jpg", "label": "circle", "key": "caf\xe9"}\n')  # Latin-1, not UTF-8: a rejected row
    with open(man, "a") as f:
        f.write(json.dumps({"path": str(tmp_path / "gone.jpg"), "label": "circle", "key": "gone"}))  # no final newline
    manifest = assert_engines_agree(man, tmp_path, "--num_shards", 2, "--label_map", labels, "--skip_stat",
                                    "--max_reject_fraction", 0.9)
    assert list(manifest.label_names) == ["square", "circle"]
    # 10 squares + 10 circles; rejected: 20 stripes and triangles, the two bad lines and the missing file
    assert manifest.num_examples == 20 and manifest.num_rejected == 23
    errors = [json.loads(line) for line in (tmp_path / "local" / "errors.jsonl").read_text().splitlines()]
    assert [e["reason"] for e in errors if e["error"] == "UnicodeDecodeError"] == [
        f"{man}: bad manifest line: not UTF-8 (invalid continuation byte at byte 48)"]


@pytest.mark.slow
def test_one_file_under_many_keys_is_one_duplicate_group_on_every_engine(image_tree, tmp_path):
    root, files = image_tree
    circle, square = root / "circle" / files["circle"][0], root / "square" / files["square"][0]
    man = tmp_path / "list.csv"
    rows = ["path,label,key"] + [f"{circle},circle,placeholder-{i}" for i in range(7)]
    rows += [f"{square},square,sq-{i}" for i in range(3)]
    rows += [f"{root / 'circle' / rel},circle,own-{rel}" for rel in files["circle"][1:]]  # no twin: no group
    man.write_text("\n".join(rows) + "\n")
    manifest = assert_engines_agree(man, tmp_path, "--num_shards", 3, "--splits", SPLITS)
    groups = identical_rows(tmp_path / "local")
    assert sorted([m["key"] for m in g["members"]] for g in groups) == [
        [f"placeholder-{i}" for i in range(7)], [f"sq-{i}" for i in range(3)]]
    assert manifest.num_duplicate_groups == 2 and manifest.num_examples == len(rows) - 1


@pytest.mark.slow
def test_one_file_listed_under_two_labels_is_a_label_conflict_on_every_engine(image_tree, tmp_path, capsys):
    root, files = image_tree
    circle, square = root / "circle" / files["circle"][0], root / "square" / files["square"][0]
    man = tmp_path / "list.jsonl"
    rows = [{"path": str(root / cls / rel), "label": label, "key": f"{cls[0]}-{i}"}
            for cls, label in (("circle", "0"), ("square", "1")) for i, rel in enumerate(files[cls])]
    rows.append({"path": str(circle), "label": "1", "key": "circle-as-1"})  # the same file under the other label
    rows.append({"path": str(square), "label": "01", "key": "square-as-01"})  # "01" is class 1: no conflict
    man.write_text("".join(json.dumps(r) + "\n" for r in rows))
    manifest = assert_engines_agree(man, tmp_path, "--num_shards", 2, "--splits", SPLITS)
    assert manifest.integer_labels and manifest.num_examples == len(rows)
    assert (manifest.num_duplicate_groups, manifest.num_label_conflicts) == (2, 1)
    groups = {tuple(m["key"] for m in g["members"]): g for g in identical_rows(tmp_path / "direct")}
    assert sorted(groups) == [("c-0", "circle-as-1"), ("s-0", "square-as-01")]
    conflict, plain = groups[("c-0", "circle-as-1")], groups[("s-0", "square-as-01")]
    assert (conflict["conflict"], conflict["labels"]) == (True, ["0", "1"])
    assert [m["label"] for m in conflict["members"]] == ["0", "1"]
    assert (plain["conflict"], plain["labels"], [m["label"] for m in plain["members"]]) == (False, ["1"], ["1", "1"])
    assert {m["uri"] for m in conflict["members"]} == {str(circle)}
    summary = capsys.readouterr().out.splitlines()
    assert summary.count("  label conflicts      1 groups of identical files with different labels "
                         "(see duplicates.jsonl)") == 3


def test_the_content_index_groups_each_digest_once_whatever_the_order():
    from imagerecords.builder.engines.local import _Contents

    index = _Contents()
    members = [(b"a" * 16, ("a1", "train", "/a", "cat")), (b"b" * 16, ("b1", "train", "/b", "cat")),
               (b"a" * 16, ("a2", "validation", "/a2", "cat")), (b"c" * 16, ("c1", "train", "/c", "dog")),
               (b"a" * 16, ("a0", "train", "/a0", "dog")), (b"b" * 16, ("b1", "train", "/b", "cat"))]
    for digest, member in members:
        index.add(digest, member)
    groups = index.groups()
    # b's two entries are one key (a repeat, not a duplicate): no group; a's three keys are one.
    assert [(g.content, [m[0] for m in g.members]) for g in groups] == [((b"a" * 16).hex(), ["a0", "a1", "a2"])]
    assert groups[0].leaks and groups[0].conflicts and groups[0].labels == ("cat", "dog")


def test_the_engine_is_chosen_by_what_the_build_needs():
    from imagerecords.pipeline.config import make_config

    from imagerecords.cli.flags import runner_of

    local = make_config({}, {"input": "in", "output": "out"})
    assert uses_local_engine(local, None)
    assert not uses_local_engine(local, "DirectRunner")
    assert not uses_local_engine(local, None, detached=True)
    assert not uses_local_engine(make_config({}, {"input": "in", "output": "out", "writer": "beam"}), None)
    assert not uses_local_engine(make_config({}, {"input": "gs://b/in", "output": "out"}), None)
    assert not uses_local_engine(make_config({}, {"input": "in", "output": "gs://b/out"}), None)
    # The command names the runner for Beam options that name none: any Beam option chooses Beam.
    assert runner_of([]) is None
    assert runner_of(["--direct_num_workers=2"]) == "DirectRunner"
    assert runner_of(["--runner", "FlinkRunner", "--runner=PrismRunner"]) == "PrismRunner"


@pytest.mark.parametrize("workers,engine", [("0", "local engine, in-process"), ("2", "local engine, 2 worker processes")])
def test_a_local_build_never_imports_beam(image_tree, tmp_path, workers, engine):
    """What start-up saves: Beam (about 1.6 s of imports) stays out of a local build's processes.
    The build is called from code without a `__main__` guard (python -c), which worker processes
    must not run again."""
    root, _ = image_tree
    code = ("import sys; from imagerecords.cli import main as cli; "
            f"rc = cli.main(['build', '--input', {str(root)!r}, '--output', {str(tmp_path / 'ds')!r}, "
            f"'--max_reject_fraction', '0.05', '--no_progress', '--local_workers', {workers!r}]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'apache_beam')); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]", proc.stdout
    assert f"({engine})" in proc.stdout
    assert proc.stdout.count("imagerecords: wrote") == 1  # once: no worker ran the script again
    assert len(shard_files(tmp_path / "ds")) == 8


def _noise_tree(root, classes=2, per_class=200, side=384):
    """Photo-sized JPEGs of noise: slow enough to decode and re-encode that a build takes seconds."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in range(classes):
        os.makedirs(root / f"class{c}")
        for i in range(per_class):
            pixels = rng.integers(0, 256, (side, side, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / f"class{c}" / f"{i:04d}.jpg", quality=90)


@pytest.fixture(scope="module")
def noise_tree(tmp_path_factory):
    tree = tmp_path_factory.mktemp("noise") / "tree"
    _noise_tree(tree)
    return tree


def _wait_for_a_shard_being_written(proc, out, timeout=60):
    """Polls until the build `proc` has a shard's temporary file in its staging area; returns that
    staging folder (the build's own, inside OUT/.imagerecords-staging). Fails naming what never came."""
    deadline = time.monotonic() + timeout
    while True:
        found = glob.glob(str(out / STAGING / "*" / ".*.tmp"))
        if found:
            return pathlib.Path(found[0]).parent
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the build never started writing a shard"
        time.sleep(0.01)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("workers", ["2", "0"])
def test_a_signal_to_the_launcher_stops_the_build_and_leaves_no_process(noise_tree, tmp_path, workers, signum):
    """SIGINT, SIGTERM or SIGHUP to the launcher alone, mid-shard (worker processes, or threads):
    within 5 s no process of the build is alive; exit 128 + the signal's number, one line, nothing
    published, the lock released; running shard writers stop at their next image and remove their
    temporary files."""
    import psutil

    out = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(noise_tree), "--output",
                             str(out), "--reencode", "--num_shards", "2", "--no_progress", "--local_workers", workers],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    staging = _wait_for_a_shard_being_written(proc, out)
    family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    assert len(family) == (3 if workers == "2" else 1), family
    sent = time.monotonic()
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in family):
        assert time.monotonic() - sent < 5, f"processes of the build still alive 5 s after {signum!r}"
        time.sleep(0.05)
    name = signal.Signals(signum).name
    assert err.count("\n") == 1 and f"stopped by {name}; nothing was published" in err, err
    assert "Traceback" not in err, err
    assert not shard_files(out) and not (out / MANIFEST).exists() and not (out / LOCK).exists()
    # Writers removed their temporary files; a folder the build created and left empty goes too.
    assert not staging.exists() or not [n for n in os.listdir(staging) if n.endswith(".tmp")]


@pytest.mark.slow
def test_workers_die_with_a_launcher_killed_without_a_handler(noise_tree, tmp_path):
    """SIGKILL to the launcher alone (no handler runs): its worker processes end too (the kernel's
    parent-death signal), so none goes on writing into the output."""
    import psutil

    out = tmp_path / "ds"
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(noise_tree), "--output",
                             str(out), "--reencode", "--num_shards", "2", "--no_progress", "--local_workers", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_a_shard_being_written(proc, out)
    workers = psutil.Process(proc.pid).children(recursive=True)
    assert len(workers) == 2, workers
    proc.kill()
    proc.communicate(timeout=60)
    gone, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive, f"worker processes alive 5 s after their launcher was killed: {alive}"


@pytest.mark.slow
def test_a_killed_worker_process_fails_the_build_in_one_line_and_a_rerun_publishes(noise_tree, tmp_path):
    """A worker SIGKILLed mid-shard (what the kernel's out-of-memory killer does): the build ends
    with one line saying so and exit 1, publishes nothing, releases the lock; a rerun builds."""
    import psutil

    out = tmp_path / "ds"
    cmd = [sys.executable, "-m", "imagerecords", "build", "--input", str(noise_tree), "--output", str(out),
           "--reencode", "--num_shards", "2", "--no_progress", "--local_workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_a_shard_being_written(proc, out)
    workers = psutil.Process(proc.pid).children()
    assert len(workers) == 2, workers
    workers[0].kill()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "a worker process of the local engine ended abruptly" in err and "nothing was published" in err, err
    assert f"worker {workers[0].pid} killed by SIGKILL" in err, err  # which worker, and how it ended
    assert not shard_files(out) and not (out / MANIFEST).exists() and not (out / LOCK).exists()
    left = [f for _, _, files in os.walk(out / STAGING) for f in files]
    plain = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if left:  # the killed worker's temporary file, or a complete shard: not replaced without asking
        assert plain.returncode != 0 and "failed or was stopped before its shards were all written" in plain.stderr
        assert "--resume" in plain.stderr and "--overwrite" in plain.stderr, plain.stderr
        assert "finish" not in plain.stderr, plain.stderr
    else:  # every writer cleaned up after itself: nothing to lose, so the rerun just builds
        assert plain.returncode == 0, plain.stderr
    again = subprocess.run(cmd + ["--overwrite"], capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert len(shard_files(out)) == 2 and (out / MANIFEST).exists()


@pytest.mark.parametrize("csv", [True, False])
@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b""])
def test_manifest_parts_hold_every_line_once_in_order(tmp_path, csv, ending):
    """Worker processes list a manifest in byte ranges; together the ranges give exactly the lines
    of one serial read, whatever the cut points hit (line ends, CRLF, blank lines, no final newline)."""
    lines = [f"row{i},{'x' * (i % 7)}".encode() for i in range(40)]
    lines[5] = lines[17] = b""  # blank lines
    body = (b"path,label\n" if csv else b"") + b"\n".join(line + (b"\r" if ending == b"\r\n" else b"")
                                                       for line in lines) + ending
    path = tmp_path / ("m.csv" if csv else "m.jsonl")
    path.write_bytes(body)
    serial = list(manifests._manifest_lines(str(path), csv))
    assert len(serial) == 40 and serial[0] == b"row0,"
    for parts in (1, 2, 3, 7, 40, 500):
        ranges = manifests._line_ranges(str(path), csv, parts)
        assert 1 <= len(ranges) <= parts
        assert [line for r in ranges for line in manifests._manifest_lines(str(path), csv, *r)] == serial, parts


# Both run in a fresh interpreter: in a long test process, a thread of an earlier test can sit inside
# a collection (a destructor that waits), and no gc.collect() of this process then collects anything.
_GC_SCRIPT = r"""
import gc, os, sys, threading
from imagerecords.builder.engines import local

class Garbage:
    # In a reference cycle; its destructor notes the pid it ran in (a tf.data iterator left in a
    # cycle by the caller: its destructor waits for TensorFlow threads that fork does not copy).
    def __init__(self, marker):
        self.marker, self.me = marker, self
    def __del__(self):
        with open(self.marker, "a") as f:
            f.write(f"{os.getpid()}\n")

class Blocker:
    # In a reference cycle; its destructor holds up the collection that runs it until released.
    def __init__(self, inside, release):
        self.inside, self.release, self.me = inside, release, self
    def __del__(self):
        self.inside.set()
        self.release.wait(60)

marker = sys.argv[2]
if sys.argv[1] == "skipped":
    # Automatic collections off first: one in this thread would run the Blocker's destructor here,
    # and wait in it, instead of in the other thread's collection.
    gc.disable()
    inside, release = threading.Event(), threading.Event()
    Blocker(inside, release)
    other = threading.Thread(target=gc.collect)
    other.start()
    assert inside.wait(60), "the other thread's collection never reached the destructor"
    Garbage(marker)

    def waiting(seconds):  # the retry's pause: let the other collection finish, then go on
        release.set()
        other.join(60)

    assert gc.collect() == 0 and not os.path.exists(marker), "gc.collect() ran during another collection"
    local._collect_fully(pause=waiting)
    gc.enable()
else:
    local._Writer = lambda *args: None  # no shard is written here
    Garbage(marker)  # garbage now, freed only by a collection
    pool, cancel = local._fork_workers(2, None, None)
    try:
        collected = [pool.submit(gc.collect) for _ in range(4)]
        frozen = [pool.submit(gc.get_freeze_count).result(timeout=60) for _ in range(4)]
        for future in collected:
            future.result(timeout=60)
    finally:
        local.end_workers(pool)
    assert min(frozen) > 0, "a worker collects what it inherited"
print(os.getpid())
"""


def _gc_script(case, marker):
    """Runs _GC_SCRIPT's `case`; returns the pid it ran in."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _GC_SCRIPT, case, str(marker)], capture_output=True, text=True,
                          timeout=300, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()[-1]


def test_the_collection_before_the_fork_is_not_skipped_while_another_thread_collects(tmp_path):
    """gc.collect() collects nothing while another thread's collection runs: the garbage it missed
    would be frozen into the workers (a CI run failed so). local._collect_fully waits it out."""
    marker = tmp_path / "deleted"
    pid = _gc_script("skipped", marker)
    assert marker.read_text().split() == [pid]


@pytest.mark.slow
def test_forked_workers_never_run_the_destructors_of_what_they_inherit(tmp_path):
    from imagerecords.pipeline import processes

    if not processes.fork_available():
        pytest.skip("workers are forked only on Linux")
    marker = tmp_path / "deleted"
    pid = _gc_script("forked", marker)
    # Collected once, in the launcher, before the fork; the workers' collections never saw it.
    assert marker.read_text().split() == [pid]


@pytest.mark.slow
def test_the_worker_count_follows_the_input_size_unless_asked(image_tree, tmp_path, capsys, monkeypatch):
    """Below PROCESS_MIN_IMAGES images the shards are written by threads in this process (forked
    workers would cost more than they save); --local_workers N asks for processes whatever the size."""
    from imagerecords.builder.engines import local

    root = image_tree[0]
    build(root, tmp_path / "small", "--max_reject_fraction", 0.1)
    assert "(local engine, in-process)" in capsys.readouterr().out
    build(root, tmp_path / "asked", "--max_reject_fraction", 0.1, "--local_workers", 2)
    assert "(local engine, 2 worker processes)" in capsys.readouterr().out
    if local._auto_workers():  # more than one core, and fork: a big enough input gets processes
        monkeypatch.setattr(local, "PROCESS_MIN_IMAGES", 10)
        build(root, tmp_path / "big", "--max_reject_fraction", 0.1)
        assert f"(local engine, {local._auto_workers()} worker processes)" in capsys.readouterr().out
    assert files_of(tmp_path / "small") == files_of(tmp_path / "asked")
