"""The manifest contract, the output lock and the commit, on real local folders (no pipeline)."""

import json
import os
import socket
import subprocess
import sys

import pytest

from imagerecords import errors, metadata, publish
from imagerecords.manifest import LOCK, MANIFEST, STAGING, Manifest, ManifestError, Shard, Split
from imagerecords.metadata import ShardResult


def _results(name="images", shards=(("train", 0, b"new0"), ("train", 1, b"new1")), rejected=0, budget=0.5):
    import hashlib

    results = [ShardResult(split, Shard(i, f"{name}-{split}.tfrecord-{i:05d}-of-{len(shards):05d}", 1, len(data),
                                        hashlib.sha256(data).hexdigest(), ((0, 1),))) for split, i, data in shards]
    return publish.BuildResults(build_id="b1", name=name, schema="tfds", seed=0, parameters={"num_shards": 2},
                                versions={"imagerecords": "x"}, max_reject_fraction=budget,
                                labels={"names": ["a"], "offset": 0, "integer": False}, shards=tuple(results),
                                num_rejected=rejected, num_skipped=0)


def _stage(out, results, contents):
    staging = out / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    for r, data in zip(results.shards, contents):
        (staging / r.filename).write_bytes(data)
    (staging / "errors.jsonl").write_text('{"uri": "x"}\n')
    (staging / publish.RESULTS).write_bytes(publish.dumps(results.to_json()))


def _publish_old(out):
    """A published dataset of 3 shards (an earlier build with more shards)."""
    old = _results(shards=[("train", i, b"old%d" % i) for i in range(3)])
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


def test_commit_over_a_published_dataset_replaces_it_whole(tmp_path):
    out = tmp_path / "out"
    _publish_old(out)
    (out / "notes.txt").write_text("not ours")
    new = _results()
    _stage(out, new, [b"new0", b"new1"])
    manifest = publish.commit(str(out), new)
    names = sorted(os.listdir(out))
    assert names == ["dataset_info.json", "errors.jsonl", "features.json", "images-train.tfrecord-00000-of-00002",
                     "images-train.tfrecord-00001-of-00002", "label.labels.txt", "manifest.json", "notes.txt"]
    assert (out / "images-train.tfrecord-00001-of-00002").read_bytes() == b"new1"
    assert Manifest.loads((out / MANIFEST).read_bytes()) == manifest
    assert manifest.split("train").num_examples == 2 and manifest.num_rejected == 0


def test_a_commit_cut_short_is_finished_from_its_record(tmp_path):
    out = tmp_path / "out"
    _publish_old(out)
    new = _results()
    _stage(out, new, [b"new0", b"new1"])
    staging = out / STAGING
    # What a crash after the first rename leaves: the record, no manifest, one shard moved.
    manifest = new.manifest(created="t")
    previous = publish._previous_files(str(out), "images")
    (staging / publish.COMMIT).write_bytes(publish.dumps({"manifest": manifest.to_json(), "previous": previous}))
    for name in metadata.PUBLICATION_MARKS:
        (out / name).unlink()
    os.rename(staging / new.shards[0].filename, out / new.shards[0].filename)
    finished = publish.commit(str(out))
    assert finished == manifest
    assert not staging.exists()
    assert sorted(p for p in os.listdir(out) if ".tfrecord" in p) == [s.filename for s in new.shards]
    assert (out / "images-train.tfrecord-00000-of-00002").read_bytes() == b"new0"


def test_finish_refuses_an_incomplete_staging_area_and_enforces_the_budget(tmp_path):
    out = tmp_path / "out"
    (out / STAGING).mkdir(parents=True)
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
    first = publish.OutputLock(str(out), "build-one").acquire()
    with pytest.raises(errors.LockHeld, match=rf"build build-one \(build, host {socket.gethostname()}, pid {os.getpid()}"):
        publish.OutputLock(str(out), "build-two").acquire()
    first.release()
    assert not (out / LOCK).exists()
    # A lock whose process is gone on this host (a killed build) is taken over.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK).write_text(json.dumps({"build_id": "killed", "host": socket.gethostname(), "pid": int(dead.stdout),
                                        "started": "t", "command": "build"}))
    lock = publish.OutputLock(str(out), "build-three").acquire()
    assert lock.took_over.build_id == "killed"
    assert json.loads((out / LOCK).read_text())["build_id"] == "build-three"
    lock.release()
    # Another host's lock is not judged from here: it blocks until --break_lock.
    (out / LOCK).write_text(json.dumps({"build_id": "far", "host": "elsewhere", "pid": 1, "started": "t"}))
    with pytest.raises(errors.LockHeld, match="--break_lock"):
        publish.OutputLock(str(out), "b4").acquire()
    broken = publish.OutputLock(str(out), "b5", break_lock=True).acquire()
    assert broken.took_over.host == "elsewhere"
    broken.release()


def _lock_text(**fields):
    holder = {"build_id": "b0", "host": socket.gethostname(), "pid": os.getpid(), "started": "t"}
    holder.update(fields)
    return json.dumps({k: v for k, v in holder.items() if v is not ...})


@pytest.mark.parametrize("text,reason", [
    (_lock_text(pid="abc"), 'its pid is "abc", not an integer'),
    (_lock_text(pid=True), "its pid is true, not an integer"),
    (_lock_text(pid=None), "its pid is null, not an integer"),
    (_lock_text(pid=...), "it has no pid"),
    (_lock_text(owner="me"), "unknown field 'owner'"),
    ("[1, 2]", "not a JSON object"),
    ("{half", "not JSON"),
])
def test_an_unreadable_lock_blocks_naming_the_file_until_broken(tmp_path, text, reason):
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK).write_text(text)
    with pytest.raises(errors.LockHeld) as e:
        publish.OutputLock(str(out), "b1").acquire()
    assert str(e.value) == (f"the lock file {out / LOCK} is unreadable ({reason}); if no build is running into "
                            f"{out}, rerun with --break_lock")
    lock = publish.OutputLock(str(out), "b2", break_lock=True).acquire()
    assert lock.take_over_note() == f"broke the unreadable lock file ({reason}) at your request (--break_lock)"
    assert json.loads((out / LOCK).read_text())["build_id"] == "b2"
    lock.release()


def test_a_lock_that_is_a_folder_is_named_as_one(tmp_path):
    out = tmp_path / "out"
    (out / LOCK).mkdir(parents=True)
    for break_lock in (False, True):  # --break_lock cannot mend it either: it says what does
        with pytest.raises(errors.OutputError) as e:
            publish.OutputLock(str(out), "b1", break_lock=break_lock).acquire()
        assert str(e.value) == f"{out / LOCK} is a folder, not a lock file; remove it (rm -r {out / LOCK}) and rerun"
        assert e.value.exit_code == 4
    assert (out / LOCK).is_dir()


def test_the_take_over_note_says_why_the_lock_was_taken(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    assert publish.OutputLock(str(out), "b0").acquire().take_over_note() is None
    (out / LOCK).unlink()
    (out / LOCK).write_text(_lock_text(build_id="far", host="elsewhere", pid=1))
    note = publish.OutputLock(str(out), "b1", break_lock=True).acquire().take_over_note()
    # Another host's process cannot be looked at from here: the note says whose lock and why, no more.
    assert note == "broke the lock of build far (build, host elsewhere, pid 1, started t) at your request (--break_lock)"
    (out / LOCK).unlink()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK).write_text(_lock_text(build_id="killed", pid=int(dead.stdout)))
    note = publish.OutputLock(str(out), "b2", break_lock=True).acquire().take_over_note()
    assert note == (f"took over the lock of build killed (build, host {socket.gethostname()}, pid {int(dead.stdout)}, "
                    "started t), whose process is no longer running")


def test_holds_only_reasons_tells_a_budget_failure_from_a_killed_build(tmp_path):
    out = tmp_path / "out"
    (out / STAGING).mkdir(parents=True)
    (out / STAGING / "errors.jsonl").write_text("{}\n")
    assert publish.holds_only_reasons(str(out))
    (out / STAGING / "duplicates.jsonl").write_text("")
    assert publish.holds_only_reasons(str(out))
    (out / STAGING / "images-train.tfrecord-00000-of-00001").write_bytes(b"x")
    assert not publish.holds_only_reasons(str(out))


def test_write_bytes_leaves_no_temporary_file_when_the_write_fails(tmp_path):
    target = tmp_path / "features.json"
    target.mkdir()  # the final rename cannot replace a folder
    with pytest.raises(Exception):
        publish.write_bytes(str(target), b"{}")
    assert sorted(os.listdir(tmp_path)) == ["features.json"]
