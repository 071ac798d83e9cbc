"""On a file system with coarse times (1 s: ext4 with 128-byte inodes, HFS+, some NFS; FAT 2 s) a write
in its writer's tick changes no time, so a staged shard there has no identity: the commit and --resume
read its bytes instead of trusting that it was not written since."""

import pytest

from imagerecords.cli import inspection
from imagerecords.cli.main import main
from imagerecords.format.manifest import MANIFEST, Manifest
from imagerecords.pipeline import storage
from imagerecords.pipeline.publish import staged_check

# No tmpfs or ext4 is made coarse without root, so the times identity reads are cut to an emulated tick
# longer than the test: the late write lands in its writer's tick, as one within its second does on ext4.
TICK_NS = 10**18


def _coarse(st):
    return st.st_mtime_ns // TICK_NS * TICK_NS, st.st_ctime_ns // TICK_NS * TICK_NS


@pytest.mark.parametrize("then", ["commit", "killed before the commit"])
def test_a_staged_shard_rewritten_in_its_writers_tick_on_coarse_times_is_neither_published_nor_reused(
        tmp_path, monkeypatch, capsys, image_tree, then):
    monkeypatch.setattr(storage, "_times", _coarse)
    out = tmp_path / "out"
    argv = ["build", "--input", str(image_tree[0]), "--output", str(out), "--no_progress", "--num_shards", "3",
            "--max_reject_fraction", "0.1"]
    real_check, flipped = staged_check.check_staged, []

    def after_a_write_in_the_same_tick(output, manifest, staged, *args, **kwargs):
        path = sorted(p for p in staged.values() if ".tfrecord-" in p)[0]
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0x01
        with open(path, "r+b") as f:  # in place, the same size: inode, size and (coarse) times unchanged
            f.write(data)
        flipped.append(path)
        if then != "commit":
            raise KeyboardInterrupt  # as a launcher killed here: its staged shards wait for --resume
        return real_check(output, manifest, staged, *args, **kwargs)

    monkeypatch.setattr(staged_check, "check_staged", after_a_write_in_the_same_tick)
    code = main(argv)
    err = capsys.readouterr().err
    assert flipped and not (out / MANIFEST).exists()
    if then == "commit":
        assert code == 4 and err.count("\n") == 1, err
        assert f"refusing to publish {out}: {flipped[0]} is " in err and "but its writer reported" in err
    else:
        assert code == 130, err
    monkeypatch.setattr(staged_check, "check_staged", real_check)
    assert main(argv + ["--resume"]) == 0
    said = capsys.readouterr()
    shards = len(Manifest.loads((out / MANIFEST).read_bytes()).split("train").shards)
    assert f"resumed: {shards - 1} of {shards} shards reused" in said.out + said.err
    assert inspection.verify(str(out), records=True)[0] == []
