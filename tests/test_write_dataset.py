"""WriteDataset: a user's own pipeline (beam.Create of dict rows with JPEG bytes, string labels and a
[null, 4] box feature) published by a plain p.run(), in a subprocess where a test kills it and in this
process (in memory, one worker) where none does; killed mid-write the old dataset stays; bad rows are
rejected rows with their reason. That it publishes the command's bytes for the same rows as files is
in tests/test_beam_fast.py. The images are made by Pillow in the test (seeded noise)."""

import glob
import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from PIL import Image

from conftest import build, published_version, shard_files
from imagerecords.format.manifest import LOCK, STAGING

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEATURES = {"box": {"dtype": "float32", "shape": [None, 4]}}
N = 200

# The user's program: rows come from a JSON file the test wrote (bytes as hex), the options as JSON.
SCRIPT = r"""
import json, sys
import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from imagerecords.transforms import WriteDataset

rows_file, out, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
rows = []
for r in json.load(open(rows_file)):
    if isinstance(r, dict) and "image_hex" in r:
        r["image"] = bytes.fromhex(r.pop("image_hex"))
    rows.append(r)
p = beam.Pipeline(options=PipelineOptions(sys.argv[4:]))
_ = p | beam.Create(rows, reshuffle=False) | WriteDataset(out, **options)
p.run().wait_until_finish()
"""


def _rows(n=N):
    rng = np.random.default_rng(23)
    rows = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (16 + i % 7, 20, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
        boxes = [[0.125 * j, 0.25, 0.5 + j, 1 / 3] for j in range(i % 4)]
        rows.append({"key": f"img{i:03d}", "image": buf.getvalue(), "label": ["cat", "dog", "owl"][i % 3],
                     "box": boxes})
    return rows


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.update(extra)
    return env


def _start(tmp_path, rows, out, options, beam_args=(), **env):
    rows_file = tmp_path / f"rows-{len(os.listdir(tmp_path))}.json"
    rows_file.write_text(json.dumps([dict({k: v for k, v in r.items() if k != "image"}, image_hex=r["image"].hex())
                                     if isinstance(r, dict) and isinstance(r.get("image"), bytes) else r
                                     for r in rows]))
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(rows_file), str(out), json.dumps(options), *beam_args],
                            env=_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            text=True)


def _run(tmp_path, rows, out, options, beam_args=(), timeout=600):
    proc = _start(tmp_path, rows, out, options, beam_args)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return proc.returncode, err


DIRECT = ["--runner=DirectRunner", "--direct_num_workers=1", "--direct_running_mode=in_memory"]
OPTIONS = {"features": FEATURES, "name": "pets"}


def run_here(rows, out, options):
    """SCRIPT's pipeline in this process, in memory on one worker (a second in all, against about ten
    for a subprocess that imports Beam): (0, "") when it published, else (1, the error's text)."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from conftest import _direct_as
    from imagerecords.transforms import WriteDataset

    p = beam.Pipeline(options=PipelineOptions(_direct_as(DIRECT)))
    _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), **options)
    try:
        p.run().wait_until_finish()
    except Exception as error:  # the pipeline's failure, as a subprocess's stderr would end with it
        return 1, f"{type(error).__name__}: {error}"
    return 0, ""


AR_SHARDS = "*.array_record-*"


def _digests(out, pattern=None):
    paths = sorted(glob.glob(os.path.join(str(out), published_version(out), pattern))) if pattern else shard_files(out)
    return {os.path.basename(p): hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths}


def _read_back(out):
    from imagerecords import reader

    return {ex["image/filename"].decode(): ex for ex in reader.as_dataset(str(out), "train").as_numpy_iterator()}


def _stored_images(out):
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "image/filename": tf.io.FixedLenFeature([], tf.string)}
    parsed = (tf.io.parse_single_example(raw, spec) for raw in tf.data.TFRecordDataset(shard_files(out)))
    return {ex["image/filename"].numpy().decode(): ex["image"].numpy() for ex in parsed}


def _check_every_value(out, rows):
    import tensorflow as tf

    got = _read_back(out)
    assert sorted(got) == sorted(r["key"] for r in rows)
    stored = _stored_images(out)
    names = ["cat", "dog", "owl"]
    for r in rows:
        ex = got[r["key"]]
        assert stored[r["key"]] == r["image"]  # a baseline JPEG is stored as the row's bytes
        assert np.array_equal(ex["image"], tf.io.decode_jpeg(r["image"], dct_method="INTEGER_ACCURATE").numpy())
        assert ex["label"] == names.index(r["label"])
        assert ex["box"].dtype == np.float32
        assert np.array_equal(ex["box"], np.array(r["box"], np.float32).reshape(-1, 4))


@pytest.fixture(scope="module")
def rows():
    return _rows()


@pytest.fixture(scope="module")
def cli_build(rows, tmp_path_factory):
    return command_build(rows, tmp_path_factory.mktemp("files"))


def command_build(rows, folder):
    """The same rows as files: the images and a JSONL manifest with the box column, built by the command."""
    with open(folder / "m.jsonl", "w") as f:
        for r in rows:
            (folder / f"{r['key']}.jpg").write_bytes(r["image"])
            row = {"path": f"{r['key']}.jpg", "key": r["key"], "label": r["label"], "box": r["box"]}
            f.write(json.dumps(row) + "\n")
    (folder / "f.yaml").write_text("features:\n  box: {dtype: float32, shape: [null, 4]}\n")
    out = folder / "out"
    build(folder / "m.jsonl", out, "--config", folder / "f.yaml", "--name", "pets")
    return out


def test_prism_publishes_the_same_bytes(rows, cli_build, tmp_path, prism_binary):
    out = tmp_path / "ds"
    code, err = _run(tmp_path, rows, out, OPTIONS,
                     ["--runner=PrismRunner", f"--prism_location={prism_binary}"])
    assert code == 0, err[-3000:]
    _check_every_value(out, rows)
    assert _digests(out) == _digests(cli_build)


@pytest.mark.slow
def test_array_record_is_the_commands_direct_runner_bytes(rows, cli_build, tmp_path):
    """WriteDataset(record_format="array_record") writes the ArrayRecord shards the command's DirectRunner
    build of the same rows as files writes."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    from imagerecords.transforms import WriteDataset

    folder, rows = cli_build.parent, rows[:40]  # the command's input (<key>.jpg); 40 rows keep it quick
    with open(tmp_path / "m.jsonl", "w") as f:
        f.writelines(json.dumps({"path": str(folder / f"{r['key']}.jpg"), **{k: r[k] for k in ("key", "label", "box")}})
                     + "\n" for r in rows)
    command = build(tmp_path / "m.jsonl", tmp_path / "cli", "--config", folder / "f.yaml", "--name", "pets",
                    "--num_shards", 4, "--record_format", "array_record", workers=1)
    out = tmp_path / "ds"  # in this process: the subprocess tests above prove a plain p.run() publishes
    with beam.Pipeline(options=PipelineOptions(DIRECT)) as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), num_shards=4, record_format="array_record",
                                                                   **OPTIONS)
    assert command.record_format == json.loads((out / "manifest.json").read_text())["record_format"] == "array_record"
    got, want = _digests(out, AR_SHARDS), _digests(tmp_path / "cli", AR_SHARDS)
    assert got == want and len(got) == 4


@pytest.mark.slow
def test_killed_mid_write_keeps_the_old_dataset_and_a_rerun_publishes(rows, tmp_path):
    out = tmp_path / "ds"
    first = rows[:60]
    code, err = _run(tmp_path, first, out, OPTIONS, DIRECT)
    assert code == 0, err[-3000:]
    before = {p: open(os.path.join(dp, p), "rb").read() for dp, _, fs in os.walk(out) for p in fs}
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = _start(tmp_path, rows, out, dict(OPTIONS, overwrite=True), DIRECT, IMAGERECORDS_TEST_PAUSE="mid_shards",
                  IMAGERECORDS_TEST_PAUSE_DIR=str(markers))
    _kill_when(proc, markers / "mid_shards")
    staged = [f for _, _, fs in os.walk(out / STAGING) for f in fs if ".tfrecord-" in f and not f.endswith(".json")]
    assert staged, "the kill came before any shard was staged"
    after = {p: open(os.path.join(dp, p), "rb").read() for dp, _, fs in os.walk(out) for p in fs
             if STAGING not in dp and p != LOCK}
    assert after == before  # the published dataset is untouched, byte for byte
    killed = os.listdir(out / STAGING)
    code, err = _run(tmp_path, rows, out, dict(OPTIONS, overwrite=True), DIRECT)
    assert code == 0, err[-3000:]
    _check_every_value(out, rows)
    # The rerun's commit removes its own staging only: the killed job's could be another pipeline's,
    # writing now. Untouched for ABANDONED_STAGING_S, a later pipeline's commit removes it.
    assert os.listdir(out / STAGING) == killed


@pytest.mark.slow
def test_finish_mends_a_commit_cut_short(rows, tmp_path):
    out = tmp_path / "ds"
    markers = tmp_path / "markers"
    markers.mkdir()
    proc = _start(tmp_path, rows[:40], out, OPTIONS, DIRECT, IMAGERECORDS_TEST_PAUSE="in_commit",
                  IMAGERECORDS_TEST_PAUSE_DIR=str(markers))
    _kill_when(proc, markers / "in_commit")
    assert not (out / "manifest.json").exists()
    done = subprocess.run([sys.executable, "-m", "imagerecords", "finish", str(out)], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    _check_every_value(out, rows[:40])


def _kill_when(proc, marker, timeout=300):
    deadline = time.monotonic() + timeout
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the pipeline ended (exit {proc.returncode}) before {marker.name}: "
                                 f"{proc.stderr.read()[-3000:]}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the pipeline never reached {marker.name}")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_bad_rows_are_rejected_rows_with_their_reasons(rows, tmp_path):
    good = rows[:30]
    bad = [
        "not a dict",                                                   # wrong type: the row itself
        {"key": "float-label", "image": rows[0]["image"], "label": 2.5, "box": []},      # wrong type: label
        {"key": "text-box", "image": rows[1]["image"], "label": "cat", "box": [[1, 2, "x", 4]]},  # wrong type: value
        {"key": "bool-in-box", "image": rows[2]["image"], "label": "cat", "box": [[1, True, 3, 4]]},
        {"key": "line-break", "image": rows[3]["image"], "label": "cat\u2028dog", "box": []},  # text hazard
        {"key": "neither", "label": "cat", "box": []},
        {"key": "too-big", "image": b"\xff\xd8" + bytes(3 << 20), "label": "cat", "box": []},  # size
    ]
    out = tmp_path / "ds"
    code, err = run_here(good + bad, out, dict(OPTIONS, max_reject_fraction=0.5, max_file_mb=2))
    assert code == 0, err[-3000:]
    reasons = {(r["key"] or r["uri"]): r["reason"] for r in map(json.loads, open(out / "errors.jsonl"))}
    assert reasons["<str>"] == "a row must be a dict with 'image' or 'path' and 'label', got a str"
    assert reasons["float-label"].startswith("label 2.5 is a float, not a class label")
    assert reasons["text-box"].startswith("feature 'box': ")
    assert reasons["bool-in-box"].startswith("feature 'box': ")
    assert "U+2028" in reasons["line-break"]
    assert reasons["neither"] == "a row needs 'image' (bytes) or 'path' (a path)"
    assert reasons["too-big"] == ("file too large: 3145730 bytes is over the limit of 2000000 bytes (max_file_mb=2); "
                                  "it was not decoded")
    assert len(reasons) == len(bad)
    assert sorted(_read_back(out)) == sorted(r["key"] for r in good)


def test_options_are_checked_when_the_transform_is_made(tmp_path):
    from imagerecords.transforms import WriteDataset

    with pytest.raises(ValueError, match=r"WriteDataset: .*num_shards must be within 1\.\.99,999 \(shards of one split\), got 0"):
        WriteDataset(str(tmp_path / "o"), num_shards=0)
    with pytest.raises(ValueError, match="unknown setting.*colour"):
        WriteDataset(str(tmp_path / "o"), colour="red")
    with pytest.raises(ValueError, match="output must be a folder"):
        WriteDataset("")
    (tmp_path / "published").mkdir()
    (tmp_path / "published" / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="holds a published dataset; pass overwrite=True"):
        WriteDataset(str(tmp_path / "published"))
    WriteDataset(str(tmp_path / "published"), overwrite=True)


@pytest.mark.parametrize("setting,value", [("seed", 1.0), ("seed", "1"), ("seed", 1.5), ("num_shards", True),
                                           ("num_shards", 2.0), ("num_shards", "2"), ("write_index", 1)])
def test_an_option_of_the_wrong_type_is_refused_when_the_transform_is_made(tmp_path, setting, value):
    # seed=1.0 once wrote other shards than seed=1 while the manifest said 1; num_shards=True rejected every row.
    from imagerecords.transforms import WriteDataset

    with pytest.raises(ValueError, match=f"^WriteDataset: {setting} must be (int|bool), got {value!r}$"):
        WriteDataset(str(tmp_path / "o"), **{setting: value})


def test_numpy_integers_are_the_integers_they_hold(tmp_path):
    from imagerecords.transforms import WriteDataset
    from imagerecords.transforms.write_dataset import row_to_ref

    made = WriteDataset(str(tmp_path / "o"), num_shards=np.int64(2), seed=np.int32(7))
    assert (made._config.shards.num_shards, made._config.split.seed) == (2, 7) and type(made._config.split.seed) is int
    ref, _ = row_to_ref({"image": b"\xff\xd8x", "label": np.int64(3)}, str(tmp_path), made._config.manifest_columns())
    assert ref.label == "3"


def test_an_existing_file_as_output_is_refused_when_the_transform_is_made(tmp_path):
    from imagerecords.transforms import WriteDataset

    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="^WriteDataset: output .*f is a file, not a folder$"):
        WriteDataset(str(tmp_path / "f"))


def test_a_negative_integer_label_is_a_rejected_row_and_every_other_id_is_kept(rows, tmp_path):
    # One -1 ('unknown') among integer labels once turned them all into class names: 0->1, 10->3.
    picked = [dict(rows[i], label=label, box=[]) for i, label in enumerate([0, 10, -1, 3, 10])]
    out = tmp_path / "ds"
    code, err = run_here(picked, out, dict(OPTIONS, max_reject_fraction=0.5))
    assert code == 0, err[-3000:]
    reasons = {r["key"]: r["reason"] for r in map(json.loads, open(out / "errors.jsonl"))}
    assert list(reasons) == [picked[2]["key"]] and reasons[picked[2]["key"]].startswith(
        "label -1 is a negative class id: integer labels are ids from 0")
    assert (out / "label.labels.txt").read_text() == "".join(f"{i}\n" for i in range(11))
    assert {k: int(ex["label"]) for k, ex in _read_back(out).items()} == {
        r["key"]: r["label"] for r in picked if r["label"] >= 0}


def test_a_repeated_key_is_a_duplicate_row(rows, tmp_path):
    out = tmp_path / "ds"
    twice = rows[:20] + [dict(rows[5], image=rows[6]["image"])]
    code, err = run_here(twice, out, dict(OPTIONS, max_reject_fraction=0.5))
    assert code == 0, err[-3000:]
    found = [json.loads(line) for line in open(out / "errors.jsonl")]
    assert [(r["key"], r["stage"]) for r in found] == [("img005", "duplicate")]
    assert len(_read_back(out)) == 20


def test_another_builds_lock_stops_the_pipeline_and_nothing_is_published(rows, tmp_path):
    from imagerecords.pipeline import lock as output_lock

    out = tmp_path / "ds"
    out.mkdir()
    with output_lock.OutputLock(str(out), "another-build"):  # held by this live process, as a running build does
        code, err = run_here(rows[:10], out, OPTIONS)
    # The shard writers stage nothing into an output another build holds; the commit never runs.
    assert code != 0 and "was not staged" in err
    assert not (out / "manifest.json").exists()


def test_the_default_key_is_the_bytes_digest_or_the_path_as_given(rows):
    from imagerecords.pipeline.refs import ManifestColumns
    from imagerecords.transforms.write_dataset import row_to_ref

    data = rows[0]["image"]
    ref, carried = row_to_ref({"image": data, "label": "cat"}, "/base", ManifestColumns())
    assert ref.key == hashlib.sha256(data).hexdigest()[:32] and ref.uri == "bytes:" + ref.key
    assert carried == data and ref.size == len(data)
    ref, carried = row_to_ref({"path": "a/b.jpg", "label": 3, "size": 10}, "/base", ManifestColumns())
    assert (ref.key, ref.uri, ref.label, carried) == ("a/b.jpg", "/base/a/b.jpg", "3", None)


def test_over_the_reject_budget_nothing_is_published_and_the_reasons_stay(rows, tmp_path):
    out = tmp_path / "ds"
    code, err = run_here(rows[:10] + [{"key": f"bad{i}", "label": "cat"} for i in range(3)], out, OPTIONS)
    assert code != 0 and "3 of 13 inputs rejected" in err and "over the budget of 1%" in err
    assert not (out / "manifest.json").exists()
    staged = {f: os.path.join(dp, f) for dp, _, fs in os.walk(out / STAGING) for f in fs}
    assert sorted(staged) == ["duplicates.jsonl", "errors.jsonl"]  # the shards went; the reasons stay
    assert len(open(staged["errors.jsonl"]).readlines()) == 3


@pytest.mark.slow
def test_three_pipelines_into_one_folder_each_publish_in_turn(rows, tmp_path):
    """Three user pipelines ending in WriteDataset(overwrite=True) into one OUT, held until all three
    have staged, then let go at once: each commit waits for the one before, none loses its shards
    (the first commit used to delete the others' staging: 'neither staged nor in place')."""
    out = tmp_path / "ds"
    release = tmp_path / "release"
    jobs = []
    for i in range(3):
        pause = tmp_path / f"pause-{i}"
        pause.mkdir()
        job_rows = [dict(r, key=f"job{i}-{r['key']}") for r in rows[:20 + 10 * i]]
        jobs.append((pause, len(job_rows), _start(tmp_path, job_rows, out, dict(OPTIONS, overwrite=True), DIRECT,
                                                  IMAGERECORDS_TEST_PAUSE="before_commit",
                                                  IMAGERECORDS_TEST_PAUSE_DIR=str(pause),
                                                  IMAGERECORDS_TEST_RELEASE=str(release))))
    deadline = time.monotonic() + 300
    while not all((pause / "before_commit").exists() for pause, _, _ in jobs):
        assert time.monotonic() < deadline, "not every pipeline staged its shards and reached its commit"
        assert all(proc.poll() is None for _, _, proc in jobs), [proc.communicate()[1][-2000:] for _, _, proc in jobs
                                                                 if proc.poll() is not None]
        time.sleep(0.1)
    assert len(os.listdir(out / STAGING)) == 3  # three builds staged side by side
    release.touch()
    for _, _, proc in jobs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["num_examples"] in {n for _, n, _ in jobs}  # one job's dataset, whole
    assert not (out / STAGING).exists() and not (out / LOCK).exists()
    done = subprocess.run([sys.executable, "-m", "imagerecords", "verify", str(out)], env=_env(), capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr
