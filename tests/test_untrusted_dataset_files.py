"""What a dataset folder holds is checked before it sizes any work: its files are regular files (a
FIFO, /dev/zero or a folder in a shard's, an index's or the manifest's place is refused by name, never
read: a FIFO hung every reader and `verify`, /dev/zero was read until memory ran out), and the
manifest's numbers are possible ones (a count no file of its size can hold is refused)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import imagerecords
from conftest import build
from imagerecords.format.access import load_manifest
from imagerecords.format.errors import NotRegularFile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def dataset(tmp_path):
    np.savez(tmp_path / "a.npz", image=np.zeros((6, 4, 4, 3), np.uint8), label=np.arange(6) % 2)
    out = tmp_path / "out"
    build(tmp_path / "a.npz", out, "--num_shards", 2, "--write_index")
    shard = next(iter(load_manifest(str(out)).splits)).shards[0]
    return out, shard


def _verify(out):
    # A hang is what this guards against: the timeout turns one into a failure naming the command.
    return subprocess.run([sys.executable, "-m", "imagerecords", "verify", str(out)], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, PYTHONPATH=REPO))


def _replace_with_fifo(path):
    os.remove(path)
    os.mkfifo(path)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["shard", "index"])
def test_a_fifo_in_a_shards_or_index_files_place_is_named_by_verify_and_the_readers(dataset, which):
    from imagerecords import reader
    from imagerecords.format.files import Files

    out, shard = dataset
    path = os.path.join(out, shard.filename if which == "shard" else shard.index_file)
    _replace_with_fifo(path)
    done = _verify(out)
    assert done.returncode != 0 and f"{path} is a named pipe (FIFO), not a regular file" in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    with pytest.raises(NotRegularFile, match="named pipe"):  # a shard at the call, an index file when read
        next(iter(reader.make_dataset(str(out), "train", batch_size=1, image_size=4)))
    with pytest.raises(imagerecords.Error, match="named pipe"):  # the torch and Grain readers' file access
        Files().read_range(path, 0, 16)


@pytest.mark.parametrize("which", ["shard", "index"])
def test_a_link_in_a_shards_or_index_files_place_is_refused_though_its_target_holds_the_same_bytes(
        dataset, which, tmp_path):
    """Shards and index files are regular files inside the dataset's folder: a symbolic link to a copy
    outside is refused by name (every reader followed it, and `verify` said ok); links above the
    dataset's own files (the folder itself linked elsewhere) are fine."""
    from imagerecords import reader
    from imagerecords.format.files import Files

    out, shard = dataset
    path = os.path.join(out, shard.filename if which == "shard" else shard.index_file)
    copy = tmp_path / "outside"
    os.rename(path, copy)
    os.symlink(copy, path)
    said = f"{path} is a symbolic link to {copy}, not a regular file"
    done = _verify(out)
    assert done.returncode != 0 and said in done.stdout + done.stderr and "Traceback" not in done.stderr
    with pytest.raises(NotRegularFile, match="symbolic link"):  # a shard at the call, an index file when read
        next(iter(reader.make_dataset(str(out), "train", batch_size=1, image_size=4)))
    with pytest.raises(imagerecords.Error, match="symbolic link"):  # the torch and Grain readers' file access
        Files().read_range(path, 0, 16)
    os.remove(path)
    os.rename(copy, path)
    linked = tmp_path / "linked-dataset"  # the dataset's folder reached through a link: read as ever
    os.symlink(out, linked)
    assert _verify(linked).returncode == 0


@pytest.mark.parametrize("target", ["/dev/zero", "folder"])
def test_a_manifest_that_is_not_a_regular_file_is_one_line_not_a_read_without_end(dataset, target):
    from imagerecords import reader

    out, _ = dataset
    manifest = os.path.join(out, "manifest.json")
    os.remove(manifest)
    if target == "folder":
        os.mkdir(manifest)
    else:
        os.symlink(target, manifest)
    done = _verify(out)
    kind = "a symbolic link to /dev/zero" if target == "/dev/zero" else "a folder"
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert f"{manifest} is {kind}, not a regular file" in done.stderr
    with pytest.raises(NotRegularFile, match=kind):
        reader.load_info(str(out))


def test_a_manifest_count_no_file_of_its_size_can_hold_is_refused_before_any_read(dataset):
    # 2**29 records listed for a shard of a few hundred bytes once made make_dataset touch 6.7 GB.
    from imagerecords import reader

    out, shard = dataset
    path = os.path.join(out, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    split = m["splits"]["train"]
    split["shards"][0]["count"] = 2**29
    with open(path, "w") as f:
        json.dump(m, f)
    done = _verify(out)
    assert done.returncode == 3 and done.stderr.count("\n") == 1, done.stderr
    assert f"{2**29} records cannot fit in {shard.num_bytes} bytes" in done.stderr
    with pytest.raises(imagerecords.Error, match="cannot fit"):
        reader.make_dataset(str(out), "train", batch_size=1, image_size=4)


@pytest.mark.parametrize("spec,says", [
    ({"dtype": "float99", "shape": []}, "dtype 'float99' is not one of"),
    ({"dtype": "float32", "shape": [1000000000]}, "is more than a record can hold"),  # once a SIGSEGV in as_dataset
], ids=["unknown-dtype", "huge-shape"])
def test_a_feature_spec_no_reader_can_follow_is_refused_where_the_manifest_is_loaded(dataset, spec, says):
    from imagerecords import reader

    out, _ = dataset
    path = os.path.join(out, "manifest.json")
    with open(path) as f:
        m = json.load(f)
    m["features"]["label"] = spec
    with open(path, "w") as f:
        json.dump(m, f)
    for command in (["verify", str(out)], ["verify", str(out), "--records"], ["inspect", str(out)]):
        done = subprocess.run([sys.executable, "-m", "imagerecords", *command], capture_output=True, text=True,
                              timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
        assert done.returncode == 3 and done.stderr.count("\n") == 1, (command, done.stderr)
        assert "its feature spec cannot be read" in done.stderr and says in done.stderr, done.stderr
    with pytest.raises(imagerecords.Error, match=says):
        reader.as_dataset(str(out), "train")


def test_a_frame_header_claiming_a_terabyte_ends_verify_records_at_the_files_end(dataset):
    # A header of 2**40 bytes with a valid length checksum was an OverflowError/MemoryError traceback.
    import struct

    from imagerecords.format import records

    out, shard = dataset
    path = os.path.join(out, shard.filename)
    with open(path, "r+b") as f:
        length = struct.pack("<Q", 2**40)
        f.write(length + struct.pack("<I", records.masked_crc32c(length)))
    done = subprocess.run([sys.executable, "-m", "imagerecords", "verify", str(out), "--records"], capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
    assert f"{path}: truncated record at byte 0 (its header says 1,099,511,627,776 bytes" in done.stdout + done.stderr


@pytest.mark.slow  # a reader in a process of its own (a crash must not take the tests down): ~4.5 s each
@pytest.mark.parametrize("policy", ["fail", "skip"])
def test_a_crafted_frame_length_behind_a_valid_header_checksum_is_an_error_not_a_crash(dataset, policy):
    """A shard's first header rewritten to say 2**40 bytes, its length checksum made to match, the
    file's size kept: TensorFlow's record reader crashed the process (SIGSEGV) in as_dataset. It is
    handed only the frames that fit in the file now; 'fail' names the shard, 'skip' reads the rest."""
    import struct

    from imagerecords.format.records import masked_crc32c

    out, shard = dataset
    path = os.path.join(out, shard.filename)
    with open(path, "r+b") as f:
        header = struct.pack("<Q", 2**40)
        f.write(header + struct.pack("<I", masked_crc32c(header)))
    code = (f"from imagerecords import reader\n"
            f"print('read', sum(1 for _ in reader.as_dataset({str(out)!r}, 'train', corrupt_records={policy!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode in (0, 1), f"the reader's process died: {done.returncode}\n{done.stderr[-2000:]}"
    if policy == "fail":
        assert done.returncode == 1 and f"shard {path} is corrupt, truncated or unreadable" in done.stderr
    else:
        assert done.returncode == 0, done.stderr[-2000:]
        total = sum(s.count for s in next(iter(load_manifest(str(out)).splits)).shards)
        assert f"read {total - 1}\n" in done.stdout  # the crafted frame skipped, every other record read
