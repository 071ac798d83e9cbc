"""Shard checks every reader entry point makes where it opens a shard (one check, one place each):
another build's shard of the same size, a manifest count the frames disagree with, an index whose
frames do not follow each other (or claim 2**62 bytes), and a shard that vanishes mid-read.

The datasets are two arrays builds of 40 fixed-size records in 4 shards (made once per module,
~0.2 s each): "mine" and "other" hold other pixels, so a shard of "other" is a same-size stranger
in "mine". Each test tampers with a copy, then reads it with make_dataset (the resumable order and
the cache's interleave order), as_dataset, Grain's RecordSource, the torch dataset (when torch is
installed) and `verify`, each of which must refuse it naming the file, in one line.
"""

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import build
from imagerecords.cli import inspection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, SHARDS = 40, 4


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{name: folder}: "mine" and "other" (indexed), "plain" (mine's input, no index files)."""
    base = tmp_path_factory.mktemp("shard-checks")
    out = {}
    for name, first, extra in (("mine", 0, ["--write_index"]), ("other", 100, ["--write_index"]), ("plain", 0, [])):
        images = np.zeros((N, 4, 4, 3), np.uint8)
        images[:, 0, 0, 0] = np.arange(N) + first  # one distinct pixel per record
        source = base / f"{name[0]}.npz"  # names of one length: keys, and so records, of one size
        np.savez(source, image=images, label=np.zeros(N, np.int64))
        out[name] = base / name
        build(source, out[name], "--num_shards", SHARDS, *extra)
    return out


def _copy(builds, name, tmp_path):
    """A copy of build `name`, its manifest as a dict, and a function that writes the dict back."""
    out = tmp_path / name
    shutil.copytree(builds[name], out)
    manifest = json.loads((out / "manifest.json").read_text())

    def save():
        (out / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))

    return out, manifest, save


def _shards(manifest):
    return manifest["splits"]["train"]["shards"]


# Every reader entry point, reading the whole split; each returns the records' first pixels.


def _make_dataset(out, **config):
    from imagerecords import reader

    ds = reader.make_dataset(str(out), "train", batch_size=4, image_size=4,
                             config=reader.ReadConfig(**config) if config else None)
    return [int(label) for _, labels in ds for label in labels.numpy()]  # its pixels are resized: count only


def _as_dataset(out):
    from imagerecords import reader

    return [int(e["image"].numpy()[0, 0, 0]) for e in reader.as_dataset(str(out), "train")]


def _grain(out):
    from imagerecords.grain import RecordSource

    source = RecordSource(str(out), "train")
    return [int(source[i]["image"][0, 0, 0]) for i in range(len(source))]


def _torch(out):
    irt = pytest.importorskip("imagerecords.torch", reason="torch is not installed")
    ds = irt.RecordDataset(str(out), "train")
    return [len(ds[i]) for i in range(len(ds))]


READERS = {"make_dataset": _make_dataset, "make_dataset-cache": lambda out: _make_dataset(out, cache=True),
           "as_dataset": _as_dataset, "grain": _grain, "torch": _torch}
INDEX_READERS = ("make_dataset", "grain", "torch")  # those that read records by their index-file offsets


def _refusal(read, out):
    """The one line a reader's refusal says: a Python exception's only line, or a TensorFlow op
    error's message (its graph context on the lines after)."""
    import tensorflow as tf

    try:
        got = read(out)
    except tf.errors.OpError as e:
        assert "Traceback" not in e.message
        return e.message
    except Exception as e:  # noqa: BLE001 - every reader's own error, named by the assert below
        assert len(str(e).splitlines()) == 1 and "Traceback" not in str(e), str(e)
        return str(e)
    pytest.fail(f"read {len(got)} records without an error")


def _verify(out):
    return inspection.verify(str(out))[0], inspection.verify(str(out), records=True)[0]


# 1. Another build's shard of the same size ---------------------------------------------------------


@pytest.mark.parametrize("reader", READERS)
def test_a_same_size_shard_of_another_build_is_refused_by_every_reader(builds, tmp_path, reader):
    out, manifest, _ = _copy(builds, "mine", tmp_path)
    other = _shards(json.loads((builds["other"] / "manifest.json").read_text()))
    victim = _shards(manifest)[0]
    donor = next(s for s in other if s["num_bytes"] == victim["num_bytes"])  # equal sizes: raw pixels, same keys
    shutil.copyfile(builds["other"] / donor["filename"], out / victim["filename"])
    said = _refusal(READERS[reader], out)
    assert re.search(rf"^shard {re.escape(str(out / victim['filename']))} is not the file manifest\.json lists: "
                     r"its first or last record's checksum differs from the one its build recorded", said, re.M), said
    assert f"`imagerecords verify {out}` names every such file" in said
    for problems in _verify(out):
        assert problems == [f"{out / victim['filename']}: sha256 differs from the manifest"]


def test_the_manifest_records_each_shards_first_and_last_checksums(builds, tmp_path):
    from imagerecords.format import records

    for shard in _shards(json.loads((builds["mine"] / "manifest.json").read_text())):
        data = (builds["mine"] / shard["filename"]).read_bytes()
        first = records.unpack_header(data[:12]) + 12
        assert shard["ends_crc"] == (data[first:first + 4] + data[-4:]).hex()
    # verify checks them too: a manifest whose ends_crc changed would make every reader refuse its shard
    out, manifest, save = _copy(builds, "mine", tmp_path)
    shard = _shards(manifest)[1]
    shard["ends_crc"] = shard["ends_crc"][8:] + shard["ends_crc"][:8]
    save()
    for problems in _verify(out):
        assert problems == [f"{out / shard['filename']}: its first or last record's checksum differs from "
                            "manifest.json's ends_crc (every reader refuses it)"]


# 2. A manifest count the frames disagree with ------------------------------------------------------


def _counted_phrases(held, listed, num_bytes):
    """What the readers say of a shard of `held` records that manifest.json counts as `listed`."""
    if listed < held:  # the frames run past the count: refused where the shard is opened
        return (rf"it lists {held} records, manifest\.json says {listed}|its first {listed} records end at byte \d+ of "
                rf"its {num_bytes}: it holds more records than the {listed} manifest\.json lists|its frames are "
                rf"{held} records over {num_bytes} bytes, manifest\.json says {listed}")
    # they fall short: refused where the shard is opened or where the file ends
    return (rf"it lists {held} records, manifest\.json says {listed}|{held} records read before the file ended or a "
            rf"frame failed its checks, manifest\.json says {listed}|the file ends before this record|its frames are "
            rf"{held} records over {num_bytes} bytes, manifest\.json says {listed}")


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("name", ["mine", "plain"], ids=["indexed", "unindexed"])
@pytest.mark.parametrize("change", ["zeroed", "raised"])
def test_a_count_the_frames_disagree_with_is_refused_by_every_reader(builds, tmp_path, reader, name, change):
    out, manifest, save = _copy(builds, name, tmp_path)
    shard = _shards(manifest)[0]
    held = shard["count"]
    shard["count"] = 0 if change == "zeroed" else held + 2  # 0 of 10 once read as empty
    save()
    if reader == "grain" and name == "plain":
        from imagerecords.grain import RecordSource

        read = lambda out: RecordSource(str(out), "train", index="scan")  # noqa: E731
    else:
        read = READERS[reader]
    said = _refusal(read, out)
    path = out / (shard["index_file"] if name == "mine" and reader in INDEX_READERS else shard["filename"])
    assert str(path) in said, said
    assert re.search(_counted_phrases(held, shard["count"], shard["num_bytes"]), said), said
    for problems in _verify(out):
        assert f"{out / shard['filename']}: {held} records, manifest says {shard['count']}" in problems


# 3 and 5. An index whose frames do not follow each other, or claim 2**62 bytes ----------------------


def _rewrite_index(out, manifest, save, line, entry):
    """Replaces line `line` (from 1) of train shard 0's index and records the new digest, as a writer
    that got it wrong would: the index's own sha256 holds, its frames do not."""
    shard = _shards(manifest)[0]
    path = out / shard["index_file"]
    lines = path.read_text().splitlines()
    lines[line - 1] = entry(*map(int, lines[line - 1].split()), *map(int, lines[line - 2].split()))
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(data)
    shard["index_sha256"] = hashlib.sha256(data).hexdigest()
    save()
    return path, shard


INDEX_FAULTS = {
    # record 0 read twice, record 1 never
    "overlap": (2, lambda o, n, o0, n0: f"{o0} {n0}",
                lambda s, o0, n0: rf"line 2 says offset 0, where the record before it ends at byte {n0} "),
    "2**62": (2, lambda o, n, o0, n0: f"{o} {2**62}",
              lambda s, o0, n0: rf"line 2 says a frame of {2**62} bytes at byte {n0}, past its shard's end at byte "
                                rf"{s['num_bytes']}"),
}


@pytest.mark.parametrize("reader", INDEX_READERS)
@pytest.mark.parametrize("fault", INDEX_FAULTS)
def test_an_index_whose_frames_do_not_follow_each_other_is_refused_by_every_index_reader(
        builds, tmp_path, reader, fault):
    out, manifest, save = _copy(builds, "mine", tmp_path)
    line, entry, phrase = INDEX_FAULTS[fault]
    first = [int(v) for v in (out / _shards(manifest)[0]["index_file"]).read_text().split()[:2]]
    path, shard = _rewrite_index(out, manifest, save, line, entry)
    said = _refusal(READERS[reader], out)
    assert re.search(rf"^index file {re.escape(str(path))}: {phrase(shard, *first)}", said, re.M), said
    for problems in _verify(out):  # plain verify too: no record needs reading to see it
        assert re.match(rf"{re.escape(str(path))}: {phrase(shard, *first)}", problems[0]), problems


def test_the_readers_of_whole_shards_read_them_in_full_beside_a_gapped_index(builds, tmp_path):
    # They never read an index file (test_format_owner pins that a stale one leaves its shard readable):
    # every record comes once, as the shard holds it.
    out, manifest, save = _copy(builds, "mine", tmp_path)
    _rewrite_index(out, manifest, save, *INDEX_FAULTS["overlap"][:2])
    assert sorted(_as_dataset(out)) == list(range(N))
    assert len(_make_dataset(out, cache=True)) == N


# 4. A shard that vanishes while as_dataset reads ----------------------------------------------------


@pytest.mark.slow
def test_as_dataset_raises_and_stops_when_a_shard_vanishes_mid_read(builds, tmp_path):
    """It spun a thread for ever (ignore_errors retrying the open) and the process never exited:
    in a child process with a timeout, it must name the shard and exit."""
    out, manifest, _ = _copy(builds, "mine", tmp_path)
    gone = out / _shards(manifest)[2]["filename"]
    script = textwrap.dedent(f"""
        import os, sys
        import tensorflow as tf
        from imagerecords import reader
        it = iter(reader.as_dataset({str(out)!r}, "train"))
        next(it)
        os.remove({str(gone)!r})
        try:
            for _ in it:
                pass
        except tf.errors.InvalidArgumentError as e:
            print(e.message.splitlines()[0])
            sys.exit(1)
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=REPO))
    except subprocess.TimeoutExpired:
        pytest.fail("as_dataset did not stop within 120 s after a shard vanished")
    assert done.returncode == 1, done.stderr[-2000:]
    assert f"shard {gone} no longer exists: the dataset in {out} was rebuilt" in done.stdout, done.stdout


def test_end_checksums_survive_a_columnar_split_and_a_malformed_one_is_refused():
    from imagerecords.format.errors import ManifestError
    from imagerecords.format.shards import Shard, ShardColumns

    shards = [Shard(i, f"ds-train.tfrecord-{i:05d}-of-00002", 3, 99, f"{i}" * 64, ends_crc=f"{i + 4:x}" * 16)
              for i in range(2)]
    columns = ShardColumns.encode("ds", "train", shards)
    assert columns.to_json()["ends_crc"] == "4" * 16 + "5" * 16
    assert list(ShardColumns.from_json("ds", "train", columns.to_json())) == shards
    row = dict(shards[0].to_json(), ends_crc="not hex")
    with pytest.raises(ManifestError, match=r"^shard 'ds-train\.tfrecord-00000-of-00002': ends_crc 'not hex' is not "
                                            r"16 lowercase hex digits$"):
        Shard.from_json(row)
