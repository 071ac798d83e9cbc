"""The manifest contract, the output lock and the commit, on real local folders (no pipeline)."""

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from imagerecords.cli.exit_codes import exit_code
from imagerecords.format.manifest import DUPLICATES, LOCK, MANIFEST, STAGING, Manifest, ManifestError, Shard, Split
from imagerecords.pipeline import staging
from imagerecords.pipeline import errors, storage
from imagerecords.pipeline.naming import flag_names
from imagerecords.pipeline.publish import staged_check
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import lifecycle
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline.write import dataset_files
from imagerecords.pipeline.write.dataset_files import ShardResult


@pytest.fixture(autouse=True)
def command_line_names():
    """These checks run for the command and the library alike; here they are pinned in the command's
    words (--input). test_library.py pins a Python caller's (input='...')."""
    with flag_names():
        yield


def _results(name="images", shards=(("train", 0, b"new0"), ("train", 1, b"new1")), rejected=0, budget=0.5,
             build_id="20261201T000002Z-bbbbbb"):
    import hashlib

    results = [ShardResult(split, Shard(i, f"{name}-{split}.tfrecord-{i:05d}-of-{len(shards):05d}", 1, len(data),
                                        hashlib.sha256(data).hexdigest(), ((0, 1),))) for split, i, data in shards]
    return publish.BuildResults(build_id=build_id, name=name, schema="tfds", seed=0, parameters={"num_shards": 2},
                                versions={"imagerecords": "x"}, max_reject_fraction=budget,
                                labels={"names": ["a"], "offset": 0, "integer": False}, shards=tuple(results),
                                num_rejected=rejected, num_skipped=0)


def _stage(out, results, contents):
    staging = out / STAGING / results.build_id
    staging.mkdir(parents=True, exist_ok=True)
    for r, data in zip(results.shards, contents):
        (staging / r.filename).write_bytes(data)
    (staging / "errors.jsonl").write_text('{"uri": "x"}\n')
    (staging / publish.RESULTS).write_bytes(publish.dumps(results.to_json()))


def _publish_old(out, build_id="20261201T000001Z-aaaaaa"):
    """A published dataset of 3 shards (an earlier build with more shards)."""
    old = _results(shards=[("train", i, b"old%d" % i) for i in range(3)], build_id=build_id)
    _stage(out, old, [b"old0", b"old1", b"old2"])
    return publish.commit(str(out), old)


def test_manifest_round_trip_and_errors(tmp_path):
    m = Manifest(name="images", schema="tfds", label_names=("a", "b"), label_offset=0, integer_labels=False, seed=3,
                 parameters={"num_shards": 2}, splits=(Split("train", (Shard(0, "f0", 2, 10, "ab", ((0, 1), (1, 1)),
                                                                            1, "f0.index"),)),),
                 num_rejected=1, num_skipped=2, versions={"imagerecords": "0"}, created="t")
    assert Manifest.loads(m.dumps()) == m
    assert m.split("train").num_examples == 2 and m.shard_files() == ("f0", "f0.index")
    with pytest.raises(ManifestError, match=r"x/manifest.json: not valid JSON"):
        Manifest.loads(b"{", "x/manifest.json")
    with pytest.raises(ManifestError, match="format_version 9"):
        Manifest.from_json(dict(m.to_json(), format_version=9))
    broken = m.to_json()
    del broken["label_names"]
    with pytest.raises(ManifestError, match="missing field 'label_names'"):
        Manifest.from_json(broken)


def test_label_conflicts_are_recorded_and_older_files_without_them_load():
    results = dataclasses.replace(_results(), num_duplicate_groups=3, num_leaking_groups=1, num_label_conflicts=2)
    m = results.manifest(created="t")
    assert m.num_label_conflicts == 2 and m.to_json()["num_label_conflicts"] == 2
    assert Manifest.loads(m.dumps()) == m
    older = m.to_json()
    del older["num_label_conflicts"]
    assert Manifest.from_json(older).num_label_conflicts == 0
    record = results.to_json()
    del record["num_label_conflicts"]  # a results.json staged before the count existed
    assert publish.BuildResults.from_json(record).manifest(created="t").num_label_conflicts == 0



def test_a_commit_publishes_a_new_version_folder_and_keeps_the_previous_one(tmp_path):
    out = tmp_path / "out"
    old = _publish_old(out)
    (out / "notes.txt").write_text("not ours")
    new = _results()
    _stage(out, new, [b"new0", b"new1"])
    manifest = publish.commit(str(out), new)
    assert manifest.version == "v-20261201T000002Z-bbbbbb" and old.version == "v-20261201T000001Z-aaaaaa"
    names = sorted(os.listdir(out))
    assert names == ["dataset_info.json", "errors.jsonl", "features.json", "label.labels.txt", "manifest.json",
                     "notes.txt", old.version, manifest.version]
    # The previous version's files are untouched: a reader holding its manifest still reads them.
    assert [(out / f).read_bytes() for f in old.shard_files()] == [b"old0", b"old1", b"old2"]
    assert [(out / f).read_bytes() for f in manifest.shard_files()] == [b"new0", b"new1"]
    assert manifest.shard_files()[1] == f"{manifest.version}/images-train.tfrecord-00001-of-00002"
    assert Manifest.loads((out / MANIFEST).read_bytes()) == manifest
    info = json.loads((out / dataset_files.DATASET_INFO).read_text())
    assert info["splits"][0]["filepathTemplate"] == f"{manifest.version}/{dataset_files.FILEPATH_TEMPLATE}"
    # A third build removes the oldest version (keep_versions=2: this one and the one before).
    third = _results(shards=[("train", 0, b"third")], build_id="20261201T000003Z-cccccc")
    _stage(out, third, [b"third"])
    publish.commit(str(out), third)
    assert sorted(n for n in os.listdir(out) if n.startswith("v-")) == [manifest.version, "v-20261201T000003Z-cccccc"]
    assert not (out / STAGING).exists()


def test_keep_versions_one_removes_the_previous_version_and_a_flat_dataset(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    # A dataset written before versions had folders: shards directly in the folder.
    (out / "images-train.tfrecord-00000-of-00001").write_bytes(b"flat")
    flat = _results(shards=[("train", 0, b"flat")]).manifest(created="t")
    flat = Manifest.from_json({k: v for k, v in Manifest.from_json(json.loads(publish.dumps(flat.to_json()))
                                                                   ).to_json().items() if k != "version"})
    flat_json = flat.to_json()
    for shard in flat_json["splits"]["train"]["shards"]:
        shard["filename"] = shard["filename"].split("/", 1)[1]
    (out / MANIFEST).write_bytes(publish.dumps(flat_json))
    new = _results()
    _stage(out, new, [b"new0", b"new1"])
    publish.commit(str(out), new, keep_versions=2)
    assert (out / "images-train.tfrecord-00000-of-00001").exists()  # within the retention
    newer = _results(build_id="20261201T000009Z-dddddd")
    _stage(out, newer, [b"new0", b"new1"])
    manifest = publish.commit(str(out), newer, keep_versions=1)
    assert sorted(os.listdir(out)) == ["dataset_info.json", "errors.jsonl", "features.json", "label.labels.txt",
                                       "manifest.json", manifest.version]


def test_a_staged_shard_that_differs_from_its_writers_report_is_never_published(tmp_path):
    out = tmp_path / "out"
    old = _publish_old(out)
    before = {n: (out / n).read_bytes() for n in (MANIFEST, *old.shard_files())}
    new = _results()
    _stage(out, new, [b"new0", b"LATE WRITER"])  # another process replaced shard 1 after its writer reported it
    with pytest.raises(errors.OutputError, match=r"refusing to publish .*images-train.tfrecord-00001-of-00002 is "
                                                 r"11 bytes with sha256 .*, but its writer reported 4 bytes"):
        publish.commit(str(out), new)
    assert {n: (out / n).read_bytes() for n in before} == before
    assert not (out / new.manifest().version).exists()


def test_a_commit_cut_short_is_finished_from_its_record(tmp_path):
    out = tmp_path / "out"
    old = _publish_old(out)
    new = _results()
    _stage(out, new, [b"new0", b"new1"])
    staging = out / STAGING / new.build_id
    # What a crash after the first move leaves: the record, the old manifest, one shard moved.
    manifest = new.manifest(created="t")
    (staging / publish.COMMIT).write_bytes(publish.dumps({"manifest": manifest.to_json(),
                                                          "build_id": new.build_id}))
    (out / manifest.version).mkdir()
    os.rename(staging / new.shards[0].filename, out / manifest.shard_files()[0])
    assert Manifest.loads((out / MANIFEST).read_bytes()) == old  # still the old dataset, whole
    finished = publish.commit(str(out))
    assert finished == manifest
    assert not (out / STAGING).exists()
    assert [(out / f).read_bytes() for f in finished.shard_files()] == [b"new0", b"new1"]


def test_finish_refuses_an_incomplete_staging_area_and_enforces_the_budget(tmp_path):
    out = tmp_path / "out"
    (out / STAGING / "20261201T000002Z-bbbbbb").mkdir(parents=True)
    with pytest.raises(errors.UnfinishedBuild, match="pipeline did not finish"):
        publish.commit(str(out))
    over = _results(rejected=5, budget=0.1)
    _stage(out, over, [b"new0", b"new1"])
    with pytest.raises(errors.BudgetExceeded, match="5 of 7 inputs rejected"):
        publish.commit(str(out))
    assert not (out / MANIFEST).exists()


def test_lock_is_exclusive_names_its_holder_and_clears_when_the_holder_is_dead(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    first = output_lock.OutputLock(str(out), "build-one").acquire()
    with pytest.raises(errors.LockHeld, match=rf"build build-one \(build, host {socket.gethostname()}, pid {os.getpid()}"):
        output_lock.OutputLock(str(out), "build-two").acquire()
    first.release()
    assert not (out / LOCK).exists()
    # A lock whose process is gone on this host (a killed build) is taken over.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK).write_text(json.dumps({"build_id": "killed", "host": socket.gethostname(), "pid": int(dead.stdout),
                                        "started": "t", "command": "build"}))
    lock = output_lock.OutputLock(str(out), "build-three").acquire()
    assert lock.took_over.build_id == "killed"
    assert json.loads((out / LOCK).read_text())["build_id"] == "build-three"
    lock.release()
    # Another host's lock is not judged from here: it blocks until --break_lock.
    (out / LOCK).write_text(json.dumps({"build_id": "far", "host": "elsewhere", "pid": 1, "started": "t"}))
    with pytest.raises(errors.LockHeld, match="--break_lock"):
        output_lock.OutputLock(str(out), "b4").acquire()
    broken = output_lock.OutputLock(str(out), "b5", break_lock=True).acquire()
    assert broken.took_over.host == "elsewhere"
    broken.release()


def _lock_text(**fields):
    holder = {"build_id": "b0", "host": socket.gethostname(), "pid": os.getpid(), "started": "t"}
    holder.update(fields)
    return json.dumps({k: v for k, v in holder.items() if v is not ...})


# Ids of their own: the default ones would hold os.getpid(), which differs between pytest-xdist's
# workers, and every worker must collect the same tests.
@pytest.mark.parametrize("text,reason", [
    (_lock_text(pid="abc"), 'its pid is "abc", not an integer'),
    (_lock_text(pid=True), "its pid is true, not an integer"),
    (_lock_text(pid=None), "its pid is null, not an integer"),
    (_lock_text(pid=...), "it has no pid"),
    (_lock_text(owner="me"), "unknown field 'owner'"),
    ("[1, 2]", "not a JSON object"),
    ("{half", "not JSON"),
], ids=["pid-a-string", "pid-true", "pid-null", "no-pid", "unknown-field", "not-an-object", "not-json"])
def test_an_unreadable_lock_blocks_naming_the_file_until_broken(tmp_path, text, reason):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(text)
    with pytest.raises(errors.LockHeld) as e:
        output_lock.OutputLock(str(out), "b1").acquire()
    assert str(e.value) == (f"the lock file {out / LOCK} is unreadable ({reason}); if no build is running into "
                            f"{out}, rerun with --break_lock")
    lock = output_lock.OutputLock(str(out), "b2", break_lock=True).acquire()
    assert lock.take_over_note() == f"broke the unreadable lock file ({reason}) at your request (--break_lock)"
    assert json.loads((out / LOCK).read_text())["build_id"] == "b2"
    lock.release()


def test_a_lock_that_is_a_folder_is_named_as_one(tmp_path):
    out = tmp_path / "out"
    (out / LOCK).mkdir(parents=True)
    for break_lock in (False, True):  # --break_lock cannot mend it either: it says what does
        with pytest.raises(errors.OutputError) as e:
            output_lock.OutputLock(str(out), "b1", break_lock=break_lock).acquire()
        assert str(e.value) == f"{out / LOCK} is a folder, not a lock file; remove it (rm -r {out / LOCK}) and rerun"
        assert exit_code(e.value) == 4
    assert (out / LOCK).is_dir()


def test_the_take_over_note_says_why_the_lock_was_taken(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert output_lock.OutputLock(str(out), "b0").acquire().take_over_note() is None
    (out / LOCK).unlink()
    (out / LOCK).write_text(_lock_text(build_id="far", host="elsewhere", pid=1))
    note = output_lock.OutputLock(str(out), "b1", break_lock=True).acquire().take_over_note()
    # Another host's process cannot be looked at from here: the note says whose lock and why, no more.
    assert note == "broke the lock of build far (build, host elsewhere, pid 1, started t) at your request (--break_lock)"
    (out / LOCK).unlink()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK).write_text(_lock_text(build_id="killed", pid=int(dead.stdout)))
    note = output_lock.OutputLock(str(out), "b2", break_lock=True).acquire().take_over_note()
    assert note == (f"took over the lock of build killed (build, host {socket.gethostname()}, pid {int(dead.stdout)}, "
                    "started t), whose process is no longer running")


def test_holds_only_reasons_tells_a_budget_failure_from_a_killed_build(tmp_path):
    out = tmp_path / "out"
    staging = out / STAGING / "20261201T000002Z-bbbbbb"
    staging.mkdir(parents=True)
    (staging / "errors.jsonl").write_text("{}\n")
    assert publish.holds_only_reasons(str(out))
    (staging / "duplicates.jsonl").write_text("")
    assert publish.holds_only_reasons(str(out))
    (staging / "images-train.tfrecord-00000-of-00001").write_bytes(b"x")
    assert not publish.holds_only_reasons(str(out))


def test_write_bytes_leaves_no_temporary_file_when_the_write_fails(tmp_path):
    target = tmp_path / "features.json"
    target.mkdir()  # the final rename cannot replace a folder
    with pytest.raises(Exception):
        storage.write_bytes(str(target), b"{}")
    assert sorted(os.listdir(tmp_path)) == ["features.json"]


def test_retention_follows_the_order_of_publication_not_of_names_or_clocks(tmp_path):
    """Build ids start with the time, but clocks differ between hosts and two builds can start
    within one tick: the versions kept are those the manifests published last, in that order."""
    out = tmp_path / "out"
    ids = ["20261201T000009Z-zzzzzz", "20261201T000001Z-aaaaaa", "20261201T000005Z-mmmmmm"]
    published = []
    for build_id in ids:
        results = _results(shards=[("train", 0, build_id.encode())], build_id=build_id)
        _stage(out, results, [build_id.encode()])
        published.append(publish.commit(str(out), results).version)
    manifest = Manifest.loads((out / MANIFEST).read_bytes())
    assert manifest.version == published[2] and manifest.previous_versions == (published[1],)
    assert sorted(n for n in os.listdir(out) if n.startswith("v-")) == sorted(published[1:])


@pytest.mark.parametrize("change", ["none", "the same bytes written again", "one byte flipped"])
def test_a_local_commit_reads_back_only_the_staged_files_written_since_their_writer_saw_them(
        tmp_path, monkeypatch, image_tree, change):
    """Each writer reports its file's identity (inode, size, modification and change times) once it is
    in place; the commit reads back and hashes only a file whose identity changed since."""
    from conftest import build, shard_files

    reads, real_read, real_check = [], staging.sha256_and_size, staged_check.check_staged

    def counted(path):
        reads.append(path)
        return real_read(path)

    def after_a_late_write(output, manifest, staged, *args, **kwargs):
        path = sorted(p for p in staged.values() if ".tfrecord-" in p)[0]
        data = bytearray(open(path, "rb").read())
        if change == "one byte flipped":
            data[len(data) // 2] ^= 0x01
        if change != "none":
            with open(path, "wb") as f:  # another process writes into the staged file
                f.write(data)
        return real_check(output, manifest, staged, *args, **kwargs)

    monkeypatch.setattr(staging, "sha256_and_size", counted)
    monkeypatch.setattr(staged_check, "check_staged", after_a_late_write)
    out, root = tmp_path / "out", image_tree[0]
    if change == "one byte flipped":
        with pytest.raises(errors.OutputError, match=r"refusing to publish .*tfrecord-00000-of-.* but its writer "
                                                     r"reported \d+ bytes with sha256"):
            build(root, out, "--num_shards", "3", "--max_reject_fraction", "0.1")
        assert not (out / MANIFEST).exists()
        assert len(reads) == 1
        return
    build(root, out, "--num_shards", "3", "--max_reject_fraction", "0.1")
    assert len(shard_files(out)) == 3
    assert len(reads) == (0 if change == "none" else 1)


@pytest.mark.slow
@pytest.mark.parametrize("window", ["between close and rename", "while its index is written"])
def test_a_byte_flipped_after_the_writer_closed_its_shard_is_never_published(tmp_path, monkeypatch, image_tree,
                                                                           window):
    """The writer's identity of its shard is taken only once its bytes are checked against what it
    wrote: another process writing into the staged file before that is refused by the commit."""
    from conftest import build

    flipped = []

    def flip(path):
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x01
        with open(path, "r+b") as f:
            f.write(data)
        flipped.append(path)

    real_rename, real_write = storage.rename, storage.write_bytes

    def rename(src, dst):
        if window == "between close and rename" and src.endswith(".tmp") and ".tfrecord-" in src and not flipped:
            flip(src)
        return real_rename(src, dst)

    def write_bytes(path, data):
        if window == "while its index is written" and path.endswith(".idx") and not flipped:
            flip(path.replace(os.sep + "index" + os.sep, os.sep)[:-len(".idx")])
        return real_write(path, data)

    monkeypatch.setattr(storage, "rename", rename)
    monkeypatch.setattr(storage, "write_bytes", write_bytes)
    out = tmp_path / "out"
    with pytest.raises(errors.OutputError, match=r"refusing to publish .*tfrecord-.* but its writer reported"):
        build(image_tree[0], out, "--num_shards", "2", "--max_reject_fraction", "0.1", "--write_index")
    assert flipped  # one or more (the writers run on threads)
    assert not (out / MANIFEST).exists()
    # --resume does not reuse the flipped shard unread: it is written again, and the dataset is whole.
    monkeypatch.undo()
    build(image_tree[0], out, "--num_shards", "2", "--max_reject_fraction", "0.1", "--write_index", "--resume")
    from imagerecords.cli import inspection

    assert inspection.verify(str(out), records=True)[0] == []


@pytest.mark.parametrize("entry", [["not", "a", "map"], {"v/x.tfrecord": 5}])
def test_a_commit_record_whose_identity_entry_is_not_a_map_of_texts_is_refused(tmp_path, entry):
    out = tmp_path / "out"
    old = _publish_old(out)
    new = _results()
    _stage(out, new, [b"new0", b"new1"])
    manifest = new.manifest(created="t")
    record = tmp_path / "out" / STAGING / new.build_id / publish.COMMIT
    record.write_bytes(publish.dumps({"manifest": manifest.to_json(), "build_id": new.build_id, "identity": entry}))
    with pytest.raises(errors.OutputError, match=r"refusing to publish .*commit.* is unreadable \(its identity entry "
                                                 r"is not a map of file names to texts\)"):
        publish.commit(str(out))
    assert Manifest.loads((out / MANIFEST).read_bytes()) == old


def test_a_pipelines_commit_leaves_the_staging_of_other_pipelines_writing_into_the_same_folder(tmp_path):
    """Three WriteDataset jobs into one OUT each stage, then commit in turn: each commit removes its own
    staging only (it removed every build's, and the later commits found their shards gone)."""
    out = tmp_path / "out"
    builds = [_results(shards=[("train", 0, b"job%d-0" % i), ("train", 1, b"job%d-1" % i)],
                       build_id=f"20261201T00000{i}Z-{i:06d}") for i in range(3)]
    for i, results in enumerate(builds):
        _stage(out, results, [b"job%d-0" % i, b"job%d-1" % i])
    for i, results in enumerate(builds):
        manifest = lifecycle.conclude(str(out), results, lifecycle.PIPELINE, overwrite=True)
        assert manifest.version == staging.version_folder(results.build_id)
        left = sorted(os.listdir(out / STAGING)) if (out / STAGING).exists() else []
        assert left == [b.build_id for b in builds[i + 1:]]  # the later jobs' staging, whole
    assert not (out / STAGING).exists() and not (out / LOCK).exists()
    shards = Manifest.loads((out / MANIFEST).read_bytes()).split("train").shards
    assert [(out / s.filename).read_bytes() for s in shards] == [b"job2-0", b"job2-1"]


def test_a_pipelines_commit_waits_while_another_pipelines_commit_holds_the_lock(tmp_path):
    import threading

    out = tmp_path / "out"
    out.mkdir()
    held = output_lock.OutputLock(str(out), "first-job", command=output_lock.COMMIT).acquire()
    got = []
    waiter = threading.Thread(target=lambda: got.append(
        output_lock.OutputLock(str(out), "second-job", command=output_lock.COMMIT, wait_for_commits_s=60).acquire()))
    waiter.start()
    seen = output_lock.read_lock(str(out))
    assert seen.build_id == "first-job" and not got  # the second waits: no LockHeld, no take-over
    held.release()
    waiter.join(timeout=60)
    assert got and output_lock.read_lock(str(out)).build_id == "second-job", "the waiting commit never took the lock"
    got[0].release()
    # A command build's lock is not a commit's: no wait, one line as before.
    with output_lock.OutputLock(str(out), "a-build"):
        with pytest.raises(errors.LockHeld, match="is locked by build"):
            output_lock.OutputLock(str(out), "third-job", command=output_lock.COMMIT, wait_for_commits_s=60).acquire()


def test_a_pipelines_writers_go_on_while_another_pipeline_commits_but_not_under_a_build(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    with output_lock.OutputLock(str(out), "other-job", command=output_lock.COMMIT):
        assert staging.owns_output(str(out), "my-job")  # it touches its own staging only
    with output_lock.OutputLock(str(out), "a-build"):
        assert not staging.owns_output(str(out), "my-job")  # a build owns the whole folder


def test_a_pipelines_commit_removes_a_staging_area_untouched_for_hours_and_keeps_a_recent_one(tmp_path):
    out = tmp_path / "out"
    killed, recent, mine = (_results(build_id=f"20261201T00000{i}Z-{i:06d}") for i in (1, 2, 3))
    for results in (killed, recent, mine):
        _stage(out, results, [b"new0", b"new1"])
    old = time.time() - publish.ABANDONED_STAGING_S - 60
    for folder, _, names in os.walk(out / STAGING / killed.build_id):
        for name in names:
            os.utime(os.path.join(folder, name), (old, old))
    odd = out / STAGING / "not\\a-build"  # a name no build id has: left alone, never a failed commit
    odd.mkdir()
    (odd / "notes.txt").write_text("mine")
    os.utime(odd / "notes.txt", (old, old))
    lifecycle.conclude(str(out), mine, lifecycle.PIPELINE)
    assert sorted(os.listdir(out / STAGING)) == sorted([recent.build_id, odd.name])  # the killed job's went


def test_the_verdict_holds_dead_links_to_their_own_budget_and_an_append_to_the_dataset(tmp_path):
    twenty = _results(shards=[("train", i, b"r%d" % i) for i in range(20)], budget=0.01)  # 20 records written

    def verdict(results, **counts):
        dataclasses.replace(results, **counts).verdict(str(tmp_path / "out"))

    verdict(twenty, num_rejected=2, num_download_failures=2)  # 2 dead links of 22 inputs: within 10%
    with pytest.raises(errors.BudgetExceeded, match=r"^3 of 23 inputs could not be downloaded \(13\.04%\), over the "
                                                   r"budget of 10% \(--max_download_failures\).* with --overwrite$"):
        verdict(twenty, num_rejected=3, num_download_failures=3)
    with pytest.raises(errors.BudgetExceeded, match=r"^1 of 22 inputs rejected \(4\.55%\), over the budget of 1% "
                                                   r"\(--max_reject_fraction\)"):
        verdict(twenty, num_rejected=2, num_download_failures=1)  # any other reject: still 1%
    verdict(twenty, num_rejected=3, num_download_failures=3, max_reject_fraction=0.2)  # the larger budget holds
    # An append of 3 URLs, all still dead, to a dataset of 40 records: 3 of 43.
    old = _results(shards=[("train", i, b"o%d" % i) for i in range(40)], build_id="20261201T000001Z-aaaaaa")
    retry = _results(shards=(), budget=0.01, build_id="20261201T000003Z-cccccc")
    base = old.manifest().to_json()
    verdict(retry, num_rejected=3, num_download_failures=3, base=base)
    with pytest.raises(errors.BudgetExceeded, match=r"^5 of 45 inputs \(with the dataset's 40 records\) could not be "
                                                   r"downloaded .* and rerun the build with --append$"):
        verdict(retry, num_rejected=5, num_download_failures=5, base=base)


def test_finish_prints_the_failed_hosts_and_the_near_duplicate_groups_it_published(tmp_path, capsys):
    # A build whose launcher did not commit (a detached job's): its results name the failed hosts and
    # count a near-duplicate group across splits (the one its duplicates.jsonl holds); `imagerecords finish` says both.
    from imagerecords.cli import main as cli

    out = tmp_path / "out"
    results = dataclasses.replace(_results(), failed_hosts=(("dead.example:80", 3, (("HTTP 404", 2), ("Timeout", 1))),),
                                  near_groups=(1, 1))
    _stage(out, results, [b"new0", b"new1"])
    near = {"conflict": False, "distance": 3, "kind": "near", "labels": ["a"], "leak": True, "members": [],
            "splits": ["train", "validation"]}
    (out / STAGING / results.build_id / DUPLICATES).write_text(json.dumps(near) + "\n" + json.dumps({"leak": True}) + "\n")
    assert cli.main(["finish", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "hosts with the most failed or opted-out URLs" in printed
    assert "dead.example:80" in printed and "(HTTP 404 2, Timeout 1)" in printed
    assert "near-duplicates      1 groups of resized, recompressed or cropped copies, 1 across splits" in printed
