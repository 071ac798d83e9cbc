"""A shard replaced by another build's longer or shorter shard: every reader entry point refuses it,
naming the shard and what to do, before it reads a record (the one size check where shards are opened).

The datasets are real builds of example_images trees of three sizes (so their shards differ in
records and bytes); one of the middle dataset's train shards is overwritten by a copy of the
largest or the smallest build's shard, as a half-synced folder or a stray copy would.
"""

import logging
import re
import shutil

import pytest

from conftest import build
from imagerecords.format.access import ShardSizeError
from imagerecords.format.manifest import Manifest

ARGS = ("--num_shards", 2, "--splits", "train=0.75,validation=0.25")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """{name: (folder, Manifest)}: "indexed" and "plain" (one tree, with and without --write_index),
    "larger" and "smaller" (trees of more and fewer images, so their train shard 0 holds other
    records and bytes)."""
    from imagerecords.pipeline import example_images

    base = tmp_path_factory.mktemp("swapped")
    out = {}
    for name, per_class, extra in (("indexed", 6, ["--write_index"]), ("plain", 6, []),
                                   ("larger", 12, []), ("smaller", 3, [])):
        tree = base / f"tree{per_class}"
        if not tree.exists():
            example_images.write_tree(str(tree), per_class=per_class)
        out[name] = (str(base / name), build(tree, base / name, *ARGS, *extra))
    return out


def _shard0(manifest: Manifest):
    return manifest.split("train").shards[0]


@pytest.fixture(params=["larger", "smaller"])
def swapped(request, builds, tmp_path):
    """Returns a function(kind) -> (copy of dataset `kind` whose train shard 0 is the other build's,
    that shard's path, its size on disk, the manifest's size)."""
    donor_path, donor = builds[request.param]

    def make(kind):
        path, manifest = builds[kind]
        copy = tmp_path / kind
        shutil.copytree(path, copy)
        victim = _shard0(manifest)
        target = copy / victim.filename
        shutil.copyfile(f"{donor_path}/{_shard0(donor).filename}", target)
        size = target.stat().st_size
        assert (size > victim.num_bytes) == (request.param == "larger") and size != victim.num_bytes
        return str(copy), str(target), size, victim.num_bytes

    return make


def _assert_names_the_shard(error, dataset, shard, size, listed):
    """The exception's first line names the shard, both sizes and what to do; it is no TensorFlow op error."""
    first = str(error).splitlines()[0]
    assert isinstance(error, ShardSizeError) and isinstance(error, ValueError), type(error)
    assert first.startswith(f"shard {shard} is {size} bytes, manifest.json lists {listed}: the file is "
                            f"{'larger' if size > listed else 'smaller'} than the one the manifest describes"), first
    assert f"`imagerecords verify {dataset}`" in first and "rebuild the dataset with --overwrite" in first, first
    assert "Traceback" not in str(error) and "[[" not in str(error)  # no op trace or graph node


@pytest.mark.parametrize("kind", ["indexed", "plain"])
@pytest.mark.parametrize("order", [dict(training=True, seed=0), dict(training=False),
                                   dict(training=True, seed=0, start_step=3), dict(training=False, cache=True)],
                         ids=["training", "eval", "training-resumed", "eval-cache"])
def test_make_dataset_refuses_a_swapped_shard_in_every_order(swapped, kind, order):
    from imagerecords import reader

    path, shard, size, listed = swapped(kind)
    order = dict(order)
    config = reader.ReadConfig(cache=order.pop("cache", False))
    with pytest.raises(ShardSizeError) as caught:
        reader.make_dataset(path, "train", batch_size=2, image_size=16, config=config, **order)
    _assert_names_the_shard(caught.value, path, shard, size, listed)


@pytest.mark.parametrize("kind", ["indexed", "plain"])
def test_as_dataset_refuses_a_swapped_shard(swapped, kind):
    from imagerecords import reader

    path, shard, size, listed = swapped(kind)
    with pytest.raises(ShardSizeError) as caught:
        reader.as_dataset(path, "train")
    _assert_names_the_shard(caught.value, path, shard, size, listed)


@pytest.mark.parametrize("kind", ["indexed", "plain"])
@pytest.mark.needs_extra("torch")
def test_the_torch_loader_refuses_a_swapped_shard(swapped, kind):
    from imagerecords import torch as irt

    path, shard, size, listed = swapped(kind)
    with pytest.raises(ShardSizeError) as caught:
        irt.Loader(irt.RecordDataset(path, "train", image_size=16, index="scan" if kind == "plain" else "require"),
                   batch_size=2)
    _assert_names_the_shard(caught.value, path, shard, size, listed)


@pytest.mark.parametrize("kind", ["indexed", "plain"])
def test_the_grain_source_refuses_a_swapped_shard(swapped, kind):
    pytest.importorskip("grain")
    from imagerecords.grain import RecordSource

    path, shard, size, listed = swapped(kind)
    with pytest.raises(ShardSizeError) as caught:
        RecordSource(path, "train", index="scan" if kind == "plain" else "require")
    _assert_names_the_shard(caught.value, path, shard, size, listed)


@pytest.mark.parametrize("kind", ["indexed", "plain"])
def test_verify_names_a_swapped_shard_in_one_line(swapped, kind, capsys):
    from imagerecords.cli import main as cli

    path, shard, size, listed = swapped(kind)
    assert cli.main(["verify", path]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [f"shard {shard} is {size} bytes, manifest.json lists {listed}: the file is "
                   f"{'larger' if size > listed else 'smaller'} than the one the manifest describes (another "
                   "build's shard copied over it, or a partial copy); restore the dataset's own file, or rebuild "
                   "the dataset with --overwrite", "1 problem(s)"], out


def test_a_missing_shard_is_named_by_the_torch_and_grain_readers(builds, tmp_path):
    """The same check names a shard that is not there at all, before anything is read."""
    pytest.importorskip("grain")
    from imagerecords.grain import RecordSource

    path, manifest = builds["indexed"]
    copy = tmp_path / "ds"
    shutil.copytree(path, copy)
    victim = copy / _shard0(manifest).filename
    victim.unlink()
    with pytest.raises(FileNotFoundError, match=rf"^1 of 2 shard\(s\) of {re.escape(str(copy))} listed in "
                                                rf"manifest.json are missing: {re.escape(str(victim))}$"):
        RecordSource(str(copy), "train")


@pytest.mark.parametrize("kind", ["indexed", "plain"])
def test_skip_reads_a_larger_shard_up_to_its_count_and_counts_the_rest(builds, kind, tmp_path, caplog):
    """corrupt_records='skip' keeps its documented meaning in the default order too: the manifest's
    count is read, the records past it are counted in ReadStats.extra, and one warning names the shard."""
    from imagerecords import reader
    from imagerecords.format import records

    path, manifest = builds[kind]
    copy = tmp_path / "ds"
    shutil.copytree(path, copy)
    victim = _shard0(manifest)
    target = copy / victim.filename
    extra = [*records.read_records(open(f"{builds['smaller'][0]}/{_shard0(builds['smaller'][1]).filename}", "rb"))]
    with open(target, "ab") as f:  # the shard's own records, then another build's
        f.write(b"".join(map(records.frame, extra)))
    stats = reader.ReadStats()
    config = reader.ReadConfig(corrupt_records="skip", repeat=1)
    with caplog.at_level(logging.WARNING, logger="imagerecords.reader"):
        ds = reader.make_dataset(str(copy), "train", batch_size=1, image_size=16, config=config, stats=stats)
    labels = [int(x) for _, batch in ds for x in batch]
    assert len(labels) == manifest.split("train").num_examples and -1 not in labels
    assert dict(stats.extra) == {str(target): len(extra)} and stats.total_skipped == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"shard {target} holds {victim.count + len(extra)} records, manifest.json says {victim.count}: "
                        f"read its first {victim.count}, {len(extra)} left out (counted in ReadStats.extra)"]
