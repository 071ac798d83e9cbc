"""What a user sees when a build fails or is killed, and what is left on disk (real CLI processes).

The kill matrix stops a build with SIGKILL at each phase (test hook IMAGERECORDS_TEST_PAUSE makes
the build mark the phase and wait there), over a fresh folder and over a published dataset, then
checks what is left and that a rerun gives the bytes of a clean build.
"""

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from conftest import published_version, shard_files, skip_unless_ci
from imagerecords.format.manifest import LOCK, MANIFEST, STAGING
from imagerecords.cli import main as cli

ARGS = ["--splits", "train=0.7,validation=0.3", "--num_shards", "3", "--max_reject_fraction", "0.05",
        "--no_progress"]
PHASES = ("before_shards", "mid_shards", "before_commit", "in_commit")
# The local default is the local engine (threads for an input this small, worker processes with
# --local_workers); a Beam option puts the same build on DirectRunner.
ENGINES = {"local": [], "processes": ["--local_workers=2"], "DirectRunner": ["--direct_num_workers=1"]}
# Every phase on the local engine; worker processes and DirectRunner where shard writers run.
KILLS = [(phase, engine) for phase in PHASES for engine in ENGINES
         if engine == "local" or phase == "mid_shards" or (engine == "processes" and phase == "before_shards")]


def _env(**extra):
    env = dict(os.environ)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def cli_run(*args, env=None, timeout=300):
    """Runs `imagerecords ARGS` in a fresh process; returns (exit code, stdout, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "imagerecords", *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)
    return proc.returncode, proc.stdout, proc.stderr


def kill_at(phase, root, out, marker_dir, *extra, timeout=180):
    """Starts a build that waits at `phase`, waits until it is there, and kills its process group."""
    marker = os.path.join(marker_dir, phase)
    if os.path.exists(marker):
        os.remove(marker)
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out),
                             *ARGS, *extra], env=_env(IMAGERECORDS_TEST_PAUSE=phase,
                                                      IMAGERECORDS_TEST_PAUSE_DIR=marker_dir),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not os.path.exists(marker):
        if proc.poll() is not None:
            raise AssertionError(f"the build ended (exit {proc.returncode}) before reaching {phase}: "
                                 f"{proc.stderr.read().decode()[-2000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the build never reached phase {phase} within {timeout} s")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def snapshot(folder, masked=False):
    """{relative path: bytes} of every visible file, version folders included (what a user or a glob
    sees); staging and the lock are hidden. With `masked`, the published version folder's name
    (a build id) reads v-<build> in paths and bytes, so two builds of the same input compare equal."""
    version = published_version(folder).encode() if masked else b""
    out = {}
    for dirpath, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not (dirpath == str(folder) and d.startswith("."))]
        for n in names:
            if dirpath == str(folder) and n.startswith("."):
                continue
            path = os.path.join(dirpath, n)
            rel = os.path.relpath(path, folder)
            data = open(path, "rb").read()
            if version:
                rel = rel.replace(version.decode(), "v-<build>")
                data = data.replace(version, b"v-<build>")
            out[rel] = data
    return out


def without_created(manifest_bytes):
    """A manifest without what a rebuild over an older dataset changes beside its data: the time,
    and the earlier versions it keeps for readers."""
    m = json.loads(manifest_bytes)
    m.pop("created")
    m.pop("previous_versions", None)
    return m


def assert_same_dataset(got, want):
    """The dataset published in `got` is the one in `want` (old versions kept beside it aside)."""
    a, b = snapshot(got, masked=True), snapshot(want, masked=True)
    current = lambda snap: {k: v for k, v in snap.items() if not k.startswith("v-") or k.startswith("v-<build>")}
    a, b = current(a), current(b)
    assert sorted(a) == sorted(b)
    for name in a:
        if name == MANIFEST:
            assert without_created(a[name]) == without_created(b[name])
        else:
            assert a[name] == b[name], name


@pytest.fixture(scope="module")
def clean(image_tree, tmp_path_factory):
    """A clean build (the bytes every rerun must give) and an older dataset built with another seed."""
    root, _ = image_tree
    base = tmp_path_factory.mktemp("clean")
    code, _, err = cli_run("build", "--input", root, "--output", base / "clean", *ARGS)
    assert code == 0, err
    code, _, err = cli_run("build", "--input", root, "--output", base / "old", *ARGS, "--seed", "7", "--num_shards", "4")
    assert code == 0, err
    return root, base / "clean", base / "old"


@pytest.mark.slow
@pytest.mark.parametrize("phase,engine", KILLS)
@pytest.mark.parametrize("over", ["fresh", "published"])
def test_kill_matrix(clean, tmp_path, phase, engine, over):
    root, clean_out, old = clean
    out = tmp_path / "out"
    if over == "published":
        shutil.copytree(old, out)
    before = snapshot(out) if over == "published" else {}
    kill_at(phase, root, out, str(tmp_path), "--overwrite", *ENGINES[engine])
    assert (out / LOCK).exists()  # a killed build cannot clean up; its lock is stale (pid gone)
    if phase == "in_commit":
        # Inside the commit, before manifest.json switches: the old dataset is still the published
        # one, every file of it unchanged (the new version's folder is beside it); over a fresh
        # folder, readers refuse and point at `finish`.
        from imagerecords import reader

        if over == "published":
            now = snapshot(out)
            assert {k: now.get(k) for k in before} == before
            assert reader.load_info(str(out)).split("train").shards[0].path.startswith(
                str(out / json.loads(before[MANIFEST])["version"]))
            assert cli.verify(str(out)) == []
            import tensorflow_datasets as tfds

            assert tfds.builder_from_directory(str(out)).info.splits["train"].num_examples == \
                reader.load_info(str(out)).split("train").num_examples
        else:
            assert not (out / MANIFEST).exists()
            code, _, err = cli_run("inspect", out)
            assert code == 7 and err.count("\n") == 1 and "imagerecords finish" in err, err
            with pytest.raises(FileNotFoundError, match="unfinished build"):
                reader.load_info(str(out))
        # `finish` completes the commit from staging: the clean build's bytes.
        code, out_text, err = cli_run("finish", out)
        assert code == 0, err
        assert_same_dataset(out, clean_out)
        assert not (out / STAGING).exists() and not (out / LOCK).exists()
        return
    if over == "published":
        assert snapshot(out) == before  # byte-identical, nothing visible changed
        assert cli.verify(str(out)) == []
    else:
        assert not glob.glob(str(out / "*.tfrecord*")) and not (out / MANIFEST).exists()
    # The rerun takes over the stale lock, clears the staging area and gives the clean bytes.
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--overwrite", *ENGINES[engine])
    assert code == 0, err
    assert "took over the lock" in err
    assert_same_dataset(out, clean_out)
    assert not (out / STAGING).exists() and not (out / LOCK).exists()


# SIGTERM (and SIGHUP, SIGINT) to the launcher alone, as a scheduler or `timeout` sends it.
SIGNALLED = [(signal.SIGTERM, phase, engine) for phase, engine in [
    ("before_shards", "processes"), ("mid_shards", "processes"), ("mid_shards", "DirectRunner"),
    ("before_commit", "local"), ("in_commit", "local")]] + [
    (signum, phase, engine) for signum in (signal.SIGHUP, signal.SIGINT)
    for phase, engine in [("mid_shards", "processes"), ("in_commit", "local")]]


def _build_family(pid):
    import psutil

    return [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)


@pytest.mark.slow
@pytest.mark.parametrize("signum,phase,engine", SIGNALLED)
def test_a_signal_to_the_launcher_at_each_phase_leaves_no_process_and_the_old_dataset(clean, tmp_path, phase,
                                                                                      engine, signum):
    import psutil

    root, clean_out, old = clean
    out = tmp_path / "out"
    shutil.copytree(old, out)
    before = snapshot(out)
    marker = tmp_path / phase
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out),
                             *ARGS, "--overwrite", *ENGINES[engine]],
                            env=_env(IMAGERECORDS_TEST_PAUSE=phase, IMAGERECORDS_TEST_PAUSE_DIR=tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not marker.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the build never reached {phase}"
            time.sleep(0.05)
        family = _build_family(proc.pid)
        sent = time.monotonic()
        proc.send_signal(signum)  # the launcher alone, not its process group
        _, err = proc.communicate(timeout=60)
        _, alive = psutil.wait_procs(family, timeout=max(0.1, 5 - (time.monotonic() - sent)))
        assert not alive, f"alive 5 s after {signal.Signals(signum).name}: {alive}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    name = signal.Signals(signum).name
    assert proc.returncode == 128 + signum, err
    assert err.count("\n") == 1 and "Traceback" not in err and f"stopped by {name}" in err, err
    assert not (out / LOCK).exists()
    now = snapshot(out)
    if phase == "in_commit":
        # The old dataset is still the published one, byte for byte; `finish` publishes the new one.
        assert "during the commit" in err and f"imagerecords finish {out}" in err, err
        assert {k: now.get(k) for k in before} == before
        code, _, ferr = cli_run("finish", out)
        assert code == 0, ferr
        assert_same_dataset(out, clean_out)
        return
    assert "nothing was published" in err, err
    assert now == before and cli.verify(str(out)) == []
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--overwrite", *ENGINES[engine])
    assert code == 0, err
    assert cli.verify(str(out), records=True) == []
    assert_same_dataset(out, clean_out)


def test_failed_overwrite_over_budget_leaves_the_old_dataset_and_a_fresh_folder_globless(clean, tmp_path):
    root, _, old = clean
    out = tmp_path / "out"
    shutil.copytree(old, out)
    before = snapshot(out)
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--overwrite", "--max_reject_fraction", "0")
    assert code == 6 and err.count("\n") == 1 and "Traceback" not in err, err
    assert "1 of 41 inputs rejected" in err and "not published" in err
    assert snapshot(out) == before and cli.verify(str(out)) == []
    assert not (out / LOCK).exists()
    fresh = tmp_path / "fresh"
    code, _, err = cli_run("build", "--input", root, "--output", fresh, *ARGS, "--max_reject_fraction", "0")
    assert code == 6, err
    assert not glob.glob(str(fresh / "*.tfrecord*")) and not (fresh / MANIFEST).exists()
    [errors_file] = glob.glob(str(fresh / STAGING / "*" / "errors.jsonl"))  # in the build's own staging area
    rows = [json.loads(line) for line in open(errors_file)]
    assert [r["key"] for r in rows] == ["circle/truncated.jpg"]


def test_a_second_build_refuses_while_the_first_holds_the_lock(clean, tmp_path):
    root, _, _ = clean
    out = tmp_path / "out"
    marker_dir = str(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out),
                              *ARGS], env=_env(IMAGERECORDS_TEST_PAUSE="before_shards",
                                               IMAGERECORDS_TEST_PAUSE_DIR=marker_dir),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while not os.path.exists(os.path.join(marker_dir, "before_shards")):
            assert first.poll() is None, "the first build ended before taking the lock"
            assert time.monotonic() < deadline, "the first build never reached its shards"
            time.sleep(0.05)
        code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--overwrite")
        assert code == 5 and err.count("\n") == 1, err
        assert f"pid {first.pid}" in err and "--break_lock" in err
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()


def test_two_builds_started_together_exactly_one_succeeds(clean, tmp_path):
    root, clean_out, _ = clean
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "imagerecords", "build", "--input", str(root), "--output", str(out), *ARGS]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    # The loser either found the lock held (5) or, if the winner was already done, a non-empty folder (4).
    assert codes[0] == 0 and codes[1] in (4, 5), results
    loser = [err for code, err in results if code != 0][0]
    assert loser.count("\n") == 1 and "Traceback" not in loser
    assert_same_dataset(out, clean_out)


@pytest.mark.slow
def test_expected_failures_are_one_line_with_their_exit_code(clean, tmp_path):
    root, clean_out, _ = clean
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    flat = tmp_path / "flat"
    flat.mkdir()
    shutil.copy(glob.glob(str(root / "circle" / "*.png"))[0], flat / "one.png")
    cases = [
        (2, "did you mean --num_shards", ["--input", root, "--output", tmp_path / "o1", "--num-shards", "2"]),
        (3, "no such file", ["--input", tmp_path / "missing", "--output", tmp_path / "o2"]),
        (3, "manifest", ["--input", flat, "--output", tmp_path / "o3"]),
        (4, "is a file", ["--input", root, "--output", a_file]),
        (4, "inside", ["--input", root, "--output", root / "circle" / "out"]),
        (4, "--overwrite", ["--input", root, "--output", clean_out]),
    ]
    for code, text, args in cases:
        got, _, err = cli_run("build", *args, "--no_progress")
        assert got == code and err.count("\n") == 1 and text in err and "Traceback" not in err, (args, got, err)
    for command in ("verify", "inspect"):
        got, _, err = cli_run(command, tmp_path / "nothing_here")
        assert got == 3 and err.count("\n") == 1 and "no published imagerecords dataset" in err, err
        bad = tmp_path / "bad"
        bad.mkdir(exist_ok=True)
        (bad / MANIFEST).write_text("{not json")
        got, _, err = cli_run(command, bad)
        assert got == 3 and err.count("\n") == 1 and "not valid JSON" in err, err


def test_verify_and_inspect_report_what_is_wrong(clean, tmp_path):
    _, clean_out, _ = clean
    out = tmp_path / "out"
    shutil.copytree(clean_out, out)
    (out / "images-train.tfrecord-00009-of-00010").write_bytes(b"stray")
    (out / STAGING).mkdir()
    (out / STAGING / "x").write_bytes(b"")
    code, text, _ = cli_run("verify", out, "--records")
    assert code == 1
    assert f"{out}/images-train.tfrecord-00009-of-00010: not listed in manifest.json" in text
    assert f"note: {out}/{STAGING}: leftover staging area" in text
    victim = shard_files(out)[0]
    os.remove(victim)
    code, _, err = cli_run("inspect", out)
    assert code == 1 and f"{victim}: missing" in err


def test_no_space_left_is_one_line_and_leaves_nothing_published(clean, tmp_path):
    root, _, _ = clean
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True).returncode:
        skip_unless_ci("cannot mount a small tmpfs here (needs root in a container that allows mount)")
    try:
        code, _, err = cli_run("build", "--input", root, "--output", mount / "ds", *ARGS)
        assert code == 4 and err.count("\n") == 1 and "no space left" in err.lower() and "Traceback" not in err, err
        # the advice keeps the user's own settings (an --append stays one): --resume, never --overwrite
        assert "rerun the same command with --resume" in err and "--overwrite" not in err, err
        assert not glob.glob(str(mount / "ds" / "*.tfrecord*")) and not (mount / "ds" / MANIFEST).exists()
    finally:
        subprocess.run(["umount", str(mount)])


def test_progress_is_quiet_in_a_pipe_unless_asked_and_ends_with_the_totals(clean, tmp_path):
    root, _, _ = clean
    args = [a for a in ARGS if a != "--no_progress"]
    code, _, err = cli_run("build", "--input", root, "--output", tmp_path / "quiet", *args)
    assert code == 0 and err == "", err
    code, _, err = cli_run("build", "--input", root, "--output", tmp_path / "loud", *args, "--progress")
    lines = err.splitlines()
    assert code == 0 and lines[0].startswith("[imagerecords] ") and len(lines) >= 2, err
    assert lines[-1].startswith("[imagerecords] 41/41 images (100%)") and "1 rejected so far" in lines[-1], err


@pytest.mark.slow
def test_odd_inputs_are_rows_and_two_builds_give_identical_errors(clean, tmp_path):
    """A symlinked class folder is read; a dangling symlink, a FIFO, an oversize file, undecodable
    files and a README at the root each end as one errors.jsonl row; the build finishes."""
    root, _, _ = clean
    tree = tmp_path / "tree"
    shutil.copytree(root / "square", tree / "square")
    os.symlink(root / "circle", tree / "circle")  # a symlinked class folder
    os.symlink(tree / "nowhere.jpg", tree / "square" / "dangling.jpg")
    os.mkfifo(tree / "square" / "pipe.jpg")
    (tree / "square" / "big.jpg").write_bytes(b"\xff\xd8\xff" + os.urandom(2_100_000))
    (tree / "square" / "noise.jpg").write_bytes(os.urandom(5000))
    (tree / "square" / "text.png").write_text("not a png")
    (tree / "README.txt").write_text("about these images")
    outs = []
    for engine in ENGINES:  # one build per engine
        out = tmp_path / engine
        code, text, err = cli_run("build", "--input", tree, "--output", out, "--max_file_mb", "2",
                                  "--max_reject_fraction", "0.5", "--no_progress", *ENGINES[engine], timeout=300)
        assert code == 0, err
        outs.append(out)
    rows = [json.loads(line) for line in open(outs[0] / "errors.jsonl")]
    by_key = {r["key"]: r for r in rows}
    assert sorted(by_key) == ["README.txt", "circle/truncated.jpg", "square/big.jpg", "square/dangling.jpg",
                              "square/noise.jpg", "square/pipe.jpg", "square/text.png"]
    assert by_key["README.txt"]["skipped"] and sum(r["skipped"] for r in rows) == 1
    assert by_key["square/pipe.jpg"]["stage"] == "list" and "FIFO" in by_key["square/pipe.jpg"]["reason"]
    assert by_key["square/dangling.jpg"]["stage"] == "list" and "dangling" in by_key["square/dangling.jpg"]["reason"]
    assert by_key["square/big.jpg"]["stage"] == "read" and "not read" in by_key["square/big.jpg"]["reason"]
    assert {by_key[k]["stage"] for k in ("square/noise.jpg", "square/text.png", "circle/truncated.jpg")} == {"decode"}
    manifest = json.load(open(outs[0] / MANIFEST))
    assert manifest["num_rejected"] == 6 and manifest["num_skipped"] == 1
    assert sum(s["num_examples"] for s in manifest["splits"].values()) == 20  # 10 squares + 10 circles via the link
    for other in outs[1:]:
        assert open(outs[0] / "errors.jsonl", "rb").read() == open(other / "errors.jsonl", "rb").read()
        assert_same_dataset(outs[0], other)


def test_inspect_reads_json_without_tensorflow_or_beam(clean):
    _, clean_out, _ = clean
    code = ("import sys; from imagerecords.cli import main as cli; rc = cli.main(['inspect', sys.argv[1]]); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'apache_beam'})); sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code, str(clean_out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "[]" and lines[0].startswith("images: schema tfds, 4 labels")
    manifest = json.load(open(clean_out / MANIFEST))
    train = manifest["splits"]["train"]
    assert f"  train: {train['num_examples']} records in {len(train['shards'])} shards" in proc.stdout


# Each message of a failure a newcomer meets: one line, its exit code, the command that mends it.


def _one_line(err):
    return err.count("\n") == 1 and "Traceback" not in err


def test_a_lock_whose_pid_is_not_a_number_is_named_unreadable_and_broken_on_request(clean, tmp_path):
    root, clean_out, _ = clean
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"build_id": "b", "host": socket.gethostname(), "pid": "12x", "started": "t"}))
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS)
    assert code == 5 and _one_line(err), err
    assert err == (f"imagerecords build: error: the lock file {out / LOCK} is unreadable (its pid is \"12x\", not an "
                   f"integer); if no build is running into {out}, rerun with --break_lock\n")
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--break_lock")
    assert code == 0, err
    assert err == ("imagerecords build: note: broke the unreadable lock file (its pid is \"12x\", not an integer) at "
                   "your request (--break_lock)\n")
    assert_same_dataset(out, clean_out)


def test_a_lock_that_is_a_folder_says_so(clean, tmp_path):
    root, _, _ = clean
    out = tmp_path / "out"
    (out / LOCK).mkdir(parents=True)
    for extra in ([], ["--break_lock"]):
        code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, *extra)
        assert code == 4 and _one_line(err), err
        assert f"{out / LOCK} is a folder, not a lock file; remove it (rm -r {out / LOCK})" in err


def test_breaking_another_hosts_lock_says_it_was_broken_on_request_not_that_it_ended(clean, tmp_path):
    root, _, _ = clean
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(json.dumps({"build_id": "far", "host": "elsewhere", "pid": 4242, "started": "t"}))
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--break_lock")
    assert code == 0, err
    assert err == ("imagerecords build: note: broke the lock of build far (build, host elsewhere, pid 4242, started t) "
                   "at your request (--break_lock)\n")


def test_finish_prints_how_long_the_commit_took_and_no_image_rate(clean, tmp_path):
    root, clean_out, _ = clean
    out = tmp_path / "out"
    kill_at("before_commit", root, out, str(tmp_path))
    code, text, err = cli_run("finish", out)
    assert code == 0, err
    assert "images/s" not in text
    last = text.splitlines()[-1]
    seconds = float(last.split()[0])
    assert last == f"  {seconds:.1f} s to publish the staged build" and 0 <= seconds < 60, text
    assert "took over the lock of build" in err and "whose process is no longer running" in err
    assert_same_dataset(out, clean_out)


def test_a_budget_failure_says_how_to_retry_and_the_retry_names_what_is_left(clean, tmp_path):
    root, clean_out, _ = clean
    out = tmp_path / "new"
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--max_reject_fraction", "0")
    assert code == 6 and _one_line(err), err
    assert err.endswith("fix or remove those inputs (or raise --max_reject_fraction) and rerun the build with "
                        "--overwrite\n")
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS)
    assert code == 4 and _one_line(err), err
    assert err == (f"imagerecords build: error: {out} holds only the reject reasons of a build that failed its "
                   f"budget ({STAGING}/errors.jsonl; nothing was published); rerun with --overwrite to replace them\n")
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--overwrite")
    assert code == 0, err
    assert_same_dataset(out, clean_out)


def test_one_class_folder_as_the_input_is_refused_before_the_build(clean, tmp_path):
    root, _, _ = clean
    # A class folder of the example tree holds its images and one sub-folder, 'more'.
    assert sorted(p.name for p in (root / "circle").iterdir() if p.is_dir()) == ["more"]
    out = tmp_path / "out"
    code, _, err = cli_run("build", "--input", root / "circle", "--output", out, *ARGS)
    assert code == 3 and _one_line(err), err
    assert "looks like one class's folder" in err and "beside one sub-folder, 'more'" in err
    assert err.endswith(f"pass its parent {root} as --input\n")
    assert not out.exists()


@pytest.mark.slow
def test_a_mistyped_runner_is_one_line_and_leaves_no_output_folder(clean, tmp_path):
    root, _, _ = clean
    out = tmp_path / "a" / "out"
    code, _, err = cli_run("build", "--input", root, "--output", out, *ARGS, "--runner", "DirectRuner")
    assert code == 2 and _one_line(err), err
    assert err.startswith("imagerecords build: error: --runner DirectRuner: no such Beam runner (did you mean "
                          "DirectRunner?); known runners: DataflowRunner, ")
    assert not (tmp_path / "a").exists()


@pytest.mark.slow
def test_a_pre_flight_failure_after_the_output_check_leaves_no_output_folder(clean, tmp_path):
    root, _, _ = clean
    cases = [
        (2, "--label_map", ["--label_map", tmp_path / "missing.txt"]),
        (2, "--local_workers is for the local engine", ["--local_workers", "2", "--direct_num_workers", "1"]),
        (2, "--detached needs", ["--detached", "--runner", "DirectRunner"]),
    ]
    for code, text, extra in cases:
        got, _, err = cli_run("build", "--input", root, "--output", tmp_path / "a" / "out", *ARGS, *extra)
        assert got == code and _one_line(err) and text in err, (extra, got, err)
        assert sorted(os.listdir(tmp_path)) == [], (extra, os.listdir(tmp_path))
