"""Resumable reading (make_dataset's start_step / start_example): exact, elastic and cheap resumes.

Fixtures: imagerecords.pipeline.example_images draws 4 classes x 10 images; the real builder writes
them into 4 shards per split, with index files (--write_index) and, apart, without them. The
order's blocks and windows are made small (3 records, 7 positions) so a 30-record split has many.
"""

import numpy as np
import pytest

from conftest import build

from imagerecords import reader
from imagerecords.pipeline import example_images
from imagerecords.reader import ReadConfig, ReadStats
from imagerecords.reader import resume

SIZE = 16
SEED = 7
CONFIG = dict(with_filename=True, dtype="uint8", order_block=3, order_window=7, prefetch=0)


def _build(images, output, *extra):
    """A 4-shard build with a validation split, on DirectRunner (one worker)."""
    return build(images, output, "--splits", "train=0.75,validation=0.25", "--num_shards", "4", *extra, workers=1)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume_tree") / "images"
    example_images.write_tree(str(root), per_class=10)
    return root


@pytest.fixture(scope="module")
def indexed(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume_indexed") / "ds"
    _build(tree, out, "--write_index")
    info = reader.load_info(str(out))
    assert all(s.index_path for s in info.split("train").shards)  # the builder wrote index files
    return str(out)


@pytest.fixture(scope="module")
def plain(tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("resume_plain") / "ds"
    _build(tree, out)
    assert not any(s.index_path for s in reader.load_info(str(out)).split("train").shards)
    return str(out)


def _batches(path, n, batch_size, hosts=1, host=0, stats=None, **kwargs):
    config = ReadConfig(**{**CONFIG, **kwargs.pop("config", {})})
    ds = reader.make_dataset(path, "train", batch_size=batch_size, image_size=SIZE, training=True, seed=SEED,
                             num_hosts=hosts, host_index=host, config=config, stats=stats, **kwargs)
    out = []
    for images, labels, names in ds.take(n) if n else ds:
        out.append((images.numpy(), labels.numpy(), [x.decode() for x in names.numpy()]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("hosts,batch_size", [(1, 4), (3, 2)])
def test_start_step_yields_the_uninterrupted_batches(indexed, hosts, batch_size):
    total = reader.load_info(indexed).split("train").num_examples
    per_epoch = resume.per_host_records(total, 0, hosts, "drop")
    assert per_epoch % batch_size != 0 or hosts == 1  # some step straddles an epoch boundary
    boundary = per_epoch // batch_size  # the step in which epoch 1 begins
    third = 2 * per_epoch // batch_size + 2  # inside the third epoch
    steps = [2, boundary, boundary + 1, third]
    for host in range(hosts):
        whole = _batches(indexed, third + 3, batch_size, hosts, host, start_step=0)
        names = [n for _, _, batch in whole for n in batch]
        assert len(set(names[:per_epoch])) == per_epoch  # an epoch holds distinct records
        assert names[:per_epoch] != names[per_epoch:2 * per_epoch]  # and a new order the next epoch
        for k in steps:
            resumed = _batches(indexed, 3, batch_size, hosts, host, start_step=k)
            for (im, lab, fn), (im2, lab2, fn2) in zip(whole[k:k + 3], resumed):
                assert fn == fn2, (host, k)
                np.testing.assert_array_equal(lab, lab2)
                np.testing.assert_array_equal(im, im2)  # the same crops and flips


def test_epoch_order_does_not_depend_on_hosts_and_changes_per_epoch():
    counts = [8, 8, 7, 7]
    a = resume.epoch_order(counts, 1, 0, 3, 7, True)
    assert sorted(a.tolist()) == list(range(30))
    assert a.tolist() != resume.epoch_order(counts, 1, 1, 3, 7, True).tolist()
    assert a.tolist() != resume.epoch_order(counts, 2, 0, 3, 7, True).tolist()
    assert resume.epoch_order(counts, 1, 0, 3, 7, False).tolist() == list(range(30))
    for hosts in (1, 2, 3, 5):
        got = []
        for h in range(hosts):
            for ids, _ in resume.tasks(counts, 1, resume.Position(0, 0), 1, hosts, h, "pad", 3, 7, True):
                got.append((h, ids.tolist()))
        # Host h takes positions h, h + H, ...: interleaved back, they are the order itself.
        per_host = [sum((i for hh, i in got if hh == h), []) for h in range(hosts)]
        merged = [per_host[p % hosts][p // hosts] for p in range(30)]
        assert merged == a.tolist(), hosts


@pytest.mark.slow
@pytest.mark.parametrize("remainder", ["pad", "drop"])
def test_elastic_resume_on_other_host_counts(indexed, remainder):
    info = reader.load_info(indexed)
    total = info.split("train").num_examples
    steps, batch = 2, 2
    cfg = {"host_remainder": remainder, "repeat": 1}
    consumed = [n for h in range(3) for _, _, names in _batches(indexed, steps, batch, 3, h, start_step=0, config=cfg)
                for n in names]
    n = reader.examples_consumed(indexed, "train", steps, batch, training=True, num_hosts=3,
                                 config=ReadConfig(**CONFIG, **cfg))
    assert n == steps * batch * 3 == len(set(consumed))
    # One host, batch 1: the global order itself; the three hosts consumed exactly its first n.
    order = [(im, fn[0]) for im, _, fn in _batches(indexed, 0, 1, config=cfg, start_step=0)]
    assert len(order) == total
    assert set(consumed) == {fn for _, fn in order[:n]}
    images = {fn: im[0] for im, fn in order}
    left = [fn for _, fn in order[n:]]
    for hosts in (2, 5):
        seen, counts = [], []
        for h in range(hosts):
            got = _batches(indexed, 0, 1, hosts, h, start_example=n, config={**cfg, "drop_remainder": False})
            counts.append(len(got))
            for im, lab, (fn,) in got:
                if lab[0] == reader.PAD_LABEL:
                    assert fn == "" and remainder == "pad"
                    continue
                seen.append(fn)
                np.testing.assert_array_equal(im[0], images[fn])  # crops follow the position, not the host
        assert len(seen) == len(set(seen)) and not set(seen) & set(consumed)
        assert len(set(counts)) == 1, counts  # every host yields as many
        if remainder == "pad":
            assert sorted(seen) == sorted(left) and counts[0] == -(-len(left) // hosts)
        else:  # the few positions at the order's end that do not fill a round are left out
            assert seen and set(seen) == set(left[:len(left) // hosts * hosts]) and counts[0] == len(left) // hosts
        # Later epochs are a fresh run's on this host count.
        fresh = [_batches(indexed, 0, 1, hosts, h, start_example=total, config={**cfg, "repeat": 2})
                 for h in range(hosts)]
        again = [_batches(indexed, 0, 1, hosts, h, start_step=reader.steps_per_epoch(
            indexed, "train", 1, training=True, num_hosts=hosts, host_index=h, resumable=True,
            config=ReadConfig(**CONFIG, **cfg)), config={**cfg, "repeat": 2}) for h in range(hosts)]
        assert [[b[2] for b in f] for f in fresh] == [[b[2] for b in a] for a in again]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["indexed", "plain"])
def test_resume_reads_only_what_it_yields(request, which):
    path = request.getfixturevalue(which)
    info = reader.load_info(path)
    split = info.split("train")
    total = split.num_examples
    frames = {}  # filename -> frame bytes, read straight from the shards
    for shard in split.shards:
        for offset, length in resume.scan_headers(shard.path, shard.count):
            with open(shard.path, "rb") as f:
                f.seek(offset)
                record = f.read(length)[12:-4]
            import tensorflow as tf

            ex = tf.train.Example.FromString(record)
            frames[ex.features.feature["image/filename"].bytes_list.value[0].decode()] = length
    stats = ReadStats()
    start = total - 5  # deep in the epoch: 5 records left
    got = _batches(path, 0, 1, stats=stats, start_example=start, config={"repeat": 1, "drop_remainder": False})
    names = [fn[0] for _, _, fn in got]
    assert len(names) == 5
    # No record before the start was read: the counts are those of the 5 records yielded.
    assert stats.records_read == 5
    assert stats.bytes_read == sum(frames[n] for n in names)


def test_resume_arguments_are_checked(indexed):
    with pytest.raises(ValueError, match="start_step or start_example, not both"):
        reader.make_dataset(indexed, "train", batch_size=2, image_size=SIZE, training=True, seed=0,
                            start_step=1, start_example=2)
    with pytest.raises(ValueError, match="pass the seed of the run you resume"):
        reader.make_dataset(indexed, "train", batch_size=2, image_size=SIZE, training=True, start_step=1)
    with pytest.raises(ValueError, match="start_step must be an int >= 0"):
        reader.make_dataset(indexed, "train", batch_size=2, image_size=SIZE, training=True, seed=0, start_step=-1)


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_the_remainder_log_line_counts_the_resumable_order(indexed, remainder, caplog):
    import logging

    total = reader.load_info(indexed).split("train").num_examples
    hosts = next(h for h in range(3, total) if total % h)  # a host count that leaves a remainder
    per_host = total // hosts if remainder == "drop" else -(-total // hosts)
    caplog.set_level(logging.INFO, logger="imagerecords.reader")
    reader.make_dataset(indexed, "train", batch_size=2, image_size=SIZE, training=True, seed=SEED, num_hosts=hosts,
                        host_index=0, start_step=0, config=ReadConfig(**{**CONFIG, "host_remainder": remainder}))
    lines = [r.getMessage() for r in caplog.records if "records per host per epoch" in r.getMessage()]
    assert len(lines) == 1 and lines[0].split(": ", 1)[1].startswith(f"{per_host} records per host per epoch; "
                                                                       f"{abs(total - per_host * hosts)} ")


@pytest.mark.slow
def test_a_corrupt_record_fails_or_becomes_padding_in_place(indexed, tmp_path, caplog):
    """A record whose checksum fails: 'fail' names its shard; 'skip' keeps every other record at its
    position and puts one padding element (label -1) where it was, so the hosts stay in step."""
    import shutil

    import tensorflow as tf

    copy = tmp_path / "ds"
    shutil.copytree(indexed, copy)
    info = reader.load_info(str(copy))
    shard = info.split("train").shards[0]
    with open(shard.path, "rb") as f:
        data = bytearray(f.read())
    with open(shard.path, "rb") as f:
        from imagerecords.format.records import read_records

        records = list(read_records(f))
    start = 12 + len(records[0]) + 4  # the second frame
    victim = tf.train.Example.FromString(records[1]).features.feature["image/filename"].bytes_list.value[0].decode()
    data[start + 12 + len(records[1]) // 2] ^= 0x08
    with open(shard.path, "wb") as f:
        f.write(data)
    total = info.split("train").num_examples
    with pytest.raises(tf.errors.InvalidArgumentError, match=f"shard .*{shard.path.rsplit('/', 1)[-1]} is corrupt"):
        _batches(str(copy), 0, 4, start_step=0, config={"repeat": 1})
    # batch size 1: training drops a last partial batch, and every record must be seen
    clean = [n for _, _, names in _batches(indexed, 0, 1, start_step=0, config={"repeat": 1}) for n in names]
    stats = ReadStats()
    with caplog.at_level("WARNING", logger="imagerecords.reader"):
        got = _batches(str(copy), 0, 1, start_step=0, stats=stats, config={"repeat": 1, "corrupt_records": "skip"})
    warned = [r.getMessage() for r in caplog.records if "skipped a bad record" in r.getMessage()]
    assert len(warned) == 1 and shard.path in warned[0]  # skipped, but never silently
    names = [n for _, _, batch in got for n in batch]
    labels = [int(x) for _, batch, _ in got for x in batch]
    assert len(names) == len(clean) == total
    at = clean.index(victim)
    assert names[at] == "" and labels[at] == -1  # padding in the victim's place
    assert names[:at] + names[at + 1:] == clean[:at] + clean[at + 1:]
    assert sum(stats.skipped.values()) == 1
