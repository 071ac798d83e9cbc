"""imagerecords.torch against real builds: global order, rank split, exact and elastic resume, gs://, no TensorFlow.

Ranks are simulated in one process: one Loader per rank with rank=r, world_size=W, iterated in
turn, which is what each process of a torch.distributed job runs.
"""

import io
import json
import os
import pickle
import shutil
import subprocess
import sys

import pytest

from conftest import build, missing_extra

# Skipped whole without torch, even in CI: its main stage collects this module without the extra; its
# extra stage has torch and fails on any skip.
if missing_extra("torch"):
    pytest.skip(missing_extra("torch"), allow_module_level=True)

import torch  # noqa: E402

# The optional torch extra's integration tests (DataLoader workers, resumes): CI's extra stage.
pytestmark = [pytest.mark.slow, pytest.mark.needs_extra("torch")]

from imagerecords import torch as irt  # noqa: E402
from imagerecords.format.records import CorruptRecordError, read_records  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = "train=0.7,validation=0.3"
SIZE = 16


@pytest.fixture(scope="module")
def built(image_tree, tmp_path_factory):
    """The same images built twice into 3 shards per split: with index files and without."""
    root, _ = image_tree
    base = tmp_path_factory.mktemp("torch")
    args = ("--splits", SPLITS, "--num_shards", 3, "--max_reject_fraction", 0.05)
    indexed = build(root, base / "indexed", *args, "--write_index")
    plain = build(root, base / "plain", *args)
    return {"indexed": (str(base / "indexed"), indexed), "plain": (str(base / "plain"), plain)}


def _dataset(path, **kwargs):
    kwargs.setdefault("image_size", SIZE)
    kwargs.setdefault("training", True)
    return irt.RecordDataset(path, "train", with_index=True, **kwargs)


def _run_ranks(path, world, batch, *, steps=None, state=None, workers=0, remainder="drop", seed=3):
    """Every rank's batches [(images, labels, indices)] (first `steps` of them, or the rest of the
    epoch) and every rank's state after them."""
    out, states = [], []
    for rank in range(world):
        loader = irt.Loader(_dataset(path), batch, seed=seed, rank=rank, world_size=world, remainder=remainder,
                            num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        batches = []
        for batch_ in loader:
            batches.append(batch_)
            if steps is not None and len(batches) == steps:
                break
        out.append(batches)
        states.append(loader.state_dict())
    return out, states


def _indices(per_rank):
    return [int(i) for batches in per_rank for _, _, idx in batches for i in idx]


def test_global_order_is_pinned():
    """The permutation is a format fact: a resumed run on another machine must draw the same one."""
    assert irt.permutation(10, 0, 0).tolist() == [4, 6, 2, 7, 3, 5, 9, 0, 8, 1]
    assert irt.permutation(10, 0, 1).tolist() == [9, 1, 3, 8, 7, 6, 0, 4, 2, 5]
    assert irt.permutation(10, 7, 0).tolist() == [8, 0, 7, 1, 3, 6, 2, 4, 5, 9]


def test_records_are_the_shards_records_in_order(built):
    path, manifest = built["indexed"]
    ds = irt.RecordDataset(path, "train")
    want = []
    for shard in manifest.split("train").shards:
        with open(os.path.join(path, shard.filename), "rb") as f:
            want += list(read_records(f))
    assert len(ds) == len(want) == manifest.split("train").num_examples == 32
    assert [ds.record(i) for i in range(len(ds))] == want
    labels = sorted(ds[i][1] for i in range(len(ds)))
    assert labels == sorted(label for s in manifest.split("train").shards for label, n in s.labels for _ in range(n))
    image, _ = ds[0]
    assert image.dtype == torch.uint8 and image.ndim == 3 and image.shape[0] == 3  # CHW, whole image
    hwc = irt.RecordDataset(path, "train", layout="hwc")[0][0]
    assert torch.equal(hwc.permute(2, 0, 1), image)


def test_two_ranks_split_disjoint_and_complete(built):
    path, _ = built["indexed"]
    order = irt.permutation(32, 3, 0).tolist()
    per_rank, _ = _run_ranks(path, 2, 4, remainder="pad")
    assert [len(b) for b in per_rank] == [4, 4]
    assert sorted(_indices(per_rank)) == list(range(32))  # 32 = 4 steps x 4 x 2: nothing padded
    # Step k of rank r is positions 8k + 4r .. 8k + 4r + 3 of the epoch's permutation.
    for rank, batches in enumerate(per_rank):
        for step, (_, _, idx) in enumerate(batches):
            assert idx.tolist() == order[8 * step + 4 * rank:8 * step + 4 * rank + 4]
    # 5 x 2 does not divide 32: "drop" leaves the last 2 positions out, "pad" fills the last step.
    dropped, _ = _run_ranks(path, 2, 5, remainder="drop")
    assert [len(b) for b in dropped] == [3, 3] and sorted(_indices(dropped)) == sorted(order[:30])
    padded, _ = _run_ranks(path, 2, 5, remainder="pad")
    assert [len(b) for b in padded] == [4, 4]
    real = [i for i in _indices(padded) if i >= 0]
    assert sorted(real) == list(range(32)) and _indices(padded).count(-1) == 8
    for batches in padded:
        for images, labels, idx in batches:
            pad = idx < 0
            assert (labels[pad] == irt.PAD_LABEL).all() and images[pad].sum() == 0 and (labels[~pad] >= 0).all()


@pytest.mark.parametrize("workers", [0, 2])
def test_exact_resume_gives_the_same_remaining_batches(built, workers):
    path, _ = built["indexed"]
    whole, end_states = _run_ranks(path, 3, 2, workers=workers)  # 32 // 6 = 5 steps per rank
    assert [len(b) for b in whole] == [5, 5, 5]
    assert end_states[0] == {"seed": 3, "epoch": 1, "consumed": 0, "num_examples": 32, "dataset": _dataset(path).digest}
    first, states = _run_ranks(path, 3, 2, steps=2, workers=workers)
    assert states == [states[0]] * 3 and states[0]["consumed"] == 12  # 2 steps x 2 x 3 ranks
    rest, after = _run_ranks(path, 3, 2, state=states[0], workers=workers)
    for rank in range(3):
        assert len(rest[rank]) == 3
        for got, want in zip(first[rank] + rest[rank], whole[rank]):
            for g, w in zip(got, want):  # images (crops and flips included), labels, indices
                assert torch.equal(g, w)
    assert after[0] == end_states[0]
    # The crops depend on (seed, epoch, position): the next epoch crops the same record differently.
    ds = _dataset(path)
    first_record = irt.Ticket(5, 3, 0, 0)
    assert torch.equal(ds[first_record][0], ds[first_record][0])
    assert not torch.equal(ds[first_record][0], ds[first_record._replace(epoch=1)][0])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("new_world", [2, 5])
def test_elastic_resume_reads_each_unconsumed_example_once(built, workers, new_world):
    path, _ = built["indexed"]
    first, states = _run_ranks(path, 3, 2, steps=2, workers=workers)
    consumed = _indices(first)
    order = irt.permutation(32, 3, 0).tolist()
    assert sorted(consumed) == sorted(order[:12])
    rest, after = _run_ranks(path, new_world, 2, state=states[0], workers=workers, remainder="pad")
    counts = {len(b) for b in rest}
    assert len(counts) == 1  # every rank the same number of batches
    read = [i for i in _indices(rest) if i >= 0]
    assert sorted(read) == sorted(order[12:]) and not set(read) & set(consumed)
    assert after[0]["epoch"] == 1 and after[0]["consumed"] == 0
    # "drop": what is read is unconsumed and read once; less than one global batch is left out.
    kept, _ = _run_ranks(path, new_world, 2, state=states[0], workers=workers, remainder="drop")
    kept = _indices(kept)
    assert len(kept) == len(set(kept)) and set(kept) <= set(order[12:]) and 20 - len(kept) < 2 * new_world


def test_state_dict_is_under_one_kilobyte(built):
    path, _ = built["indexed"]
    loader = irt.Loader(_dataset(path), 2, seed=2**31 - 1, rank=0, world_size=3)
    next(iter(loader))
    state = loader.state_dict()
    assert state == {"seed": 2**31 - 1, "epoch": 0, "consumed": 6, "num_examples": 32, "dataset": _dataset(path).digest}
    assert len(pickle.dumps(state)) < 1024 and len(json.dumps(state)) < 1024
    saved, empty = io.BytesIO(), io.BytesIO()
    torch.save(state, saved)
    torch.save({}, empty)  # torch.save's zip container costs ~1.2 KB around any object
    assert len(saved.getvalue()) - len(empty.getvalue()) < 1024
    with pytest.raises(ValueError, match="split of 31 records; this one has 32"):
        loader.load_state_dict({**state, "num_examples": 31})


_TORCHVISION = """
import sys
import torch
from torchvision import transforms
import imagerecords.torch as irt

path, size = sys.argv[1], int(sys.argv[2])
crop = transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                           transforms.PILToTensor()])
ds = irt.RecordDataset(path, "train", transform=crop)
ticket = irt.Ticket(7, 0, 0, 3)
torch.manual_seed(99)
before = torch.rand(1)
torch.manual_seed(99)
a = ds[ticket][0]
assert torch.equal(torch.rand(1), before)  # the caller's generator is left as it was
assert a.shape == (3, size, size) and torch.equal(ds[ticket][0], a)
assert any(not torch.equal(ds[ticket._replace(position=p)][0], a) for p in range(4, 8))
print("ok")
"""


@pytest.mark.needs_extra("torchvision")
def test_torchvision_transforms_are_seeded_per_element(built):
    """In its own process: importing torchvision (torch._dynamo, triton) where TensorFlow is already
    loaded aborts the interpreter, and the suite's process has loaded TensorFlow."""
    path, _ = built["indexed"]
    proc = subprocess.run([sys.executable, "-c", _TORCHVISION, path, str(SIZE)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]


def test_without_index_files_one_clear_error_or_one_scan(built):
    path, _ = built["plain"]
    with pytest.raises(irt.MissingIndexError) as error:
        irt.RecordDataset(path, "train")
    message = str(error.value)
    assert "3 of the 3 shards of split 'train' have no index file" in message
    assert "--write_index" in message and "index='scan'" in message and "\n" not in message
    scanned = irt.RecordDataset(path, "train", index="scan")
    indexed = irt.RecordDataset(built["indexed"][0], "train")
    assert scanned.offsets.tolist() == indexed.offsets.tolist()  # the same shard bytes either way
    assert scanned.lengths.tolist() == indexed.lengths.tolist()


def test_corrupt_record_names_its_shard_and_offset(built, tmp_path):
    path, manifest = built["indexed"]
    copy = tmp_path / "ds"
    shutil.copytree(path, copy)
    ds = irt.RecordDataset(str(copy), "train")
    shard = copy / manifest.split("train").shards[0].filename
    data = bytearray(shard.read_bytes())
    offset, length = int(ds.offsets[1]), int(ds.lengths[1])
    data[offset + length // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert ds[0][1] >= 0  # the record before it still reads
    with pytest.raises(CorruptRecordError, match=f"{shard}: record at byte {offset}: bad data checksum"):
        ds[1]


def test_arguments_are_checked_together(built):
    path, _ = built["indexed"]
    with pytest.raises(ValueError, match="layout must be one of .*; index must be one of .*; pass image_size or"):
        irt.RecordDataset(path, "train", layout="nchw", index="maybe", image_size=8, transform=lambda x: x)
    with pytest.raises(ValueError, match="no split 'test'"):
        irt.RecordDataset(path, "test")
    ds = irt.RecordDataset(path, "train")
    with pytest.raises(ValueError, match="Loader sets batch_sampler, drop_last itself"):
        irt.Loader(ds, 2, drop_last=True, batch_sampler=None)
    with pytest.raises(ValueError, match="32 records do not fill one global batch of 8 x 5 ranks"):
        irt.Loader(ds, 8, rank=0, world_size=5)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        irt.Loader(ds, 2, rank=2, world_size=2)
    with pytest.raises(FileNotFoundError, match="no manifest.json"):
        irt.RecordDataset(os.path.dirname(path), "train")


_NO_TENSORFLOW = """
import json, sys
import imagerecords.torch as irt
ds = irt.RecordDataset(sys.argv[1], "train", image_size=16, training=True, with_index=True)
loader = irt.Loader(ds, 4, seed=0, num_workers=2)
rows = [[int(i), int(l), int(x.sum())] for images, labels, idx in loader for x, l, i in zip(images, labels, idx)]
assert "tensorflow" not in sys.modules, "imagerecords.torch imported TensorFlow"
assert "apache_beam" not in sys.modules, "imagerecords.torch imported Apache Beam"
print(json.dumps({"rows": rows, "state": loader.state_dict()}))
"""


def test_the_package_never_imports_tensorflow(built):
    path, _ = built["indexed"]
    proc = subprocess.run([sys.executable, "-c", _NO_TENSORFLOW, path], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert sorted(i for i, _, _ in result["rows"]) == list(range(32))
    assert result["state"] == {"seed": 0, "epoch": 1, "consumed": 0, "num_examples": 32, "dataset": _dataset(path).digest}


@pytest.mark.gcs
def test_gs_shards_are_read_with_ranged_reads(built, fake_gcs_server):
    from support import gcs

    path, manifest = built["indexed"]
    local = json.loads(subprocess.run([sys.executable, "-c", _NO_TENSORFLOW, path], capture_output=True, text=True,
                                      timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT}).stdout
                       .splitlines()[-1])
    emulator = gcs.GcsEmulator(binary=fake_gcs_server, tensorflow=False).start()
    try:
        emulator.create_bucket("torchbucket")
        emulator.upload_tree(path, "gs://torchbucket/ds")
        proc = subprocess.run([sys.executable, "-c", _NO_TENSORFLOW, "gs://torchbucket/ds"], capture_output=True,
                              text=True, timeout=300, cwd=ROOT, env={**os.environ, **emulator.env(), "PYTHONPATH": ROOT})
        missing = subprocess.run([sys.executable, "-c", _NO_TENSORFLOW, "gs://torchbucket/nothing"],
                                 capture_output=True, text=True, timeout=300, cwd=ROOT,
                                 env={**os.environ, **emulator.env(), "PYTHONPATH": ROOT})
    finally:
        emulator.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    remote = json.loads(proc.stdout.splitlines()[-1])
    assert remote == local  # the same records, crops and order as from the local folder
    assert len(remote["rows"]) == manifest.split("train").num_examples
    assert missing.returncode != 0 and "gs://torchbucket/nothing holds no published imagerecords dataset" in missing.stderr


_RECIPE = """
import json, sys
from test_recipes import recipes
scope = {"OUT": sys.argv[1]}
exec(compile(recipes()["torch-reader"], "docs/recipes.md[torch-reader]", "exec"), scope)
cont = [labels.tolist() for _, labels in scope["loader"]]  # the first loader, carried on past its break
again = [labels.tolist() for _, labels in scope["resumed"]]
val = [int(x) for _, labels in scope["validation"] for x in labels]
assert "tensorflow" not in sys.modules
print(json.dumps({"state": scope["state"], "cont": cont, "again": again, "val": val}))
"""


def test_torch_reader_recipe_resumes_where_it_stopped(built):
    path, manifest = built["indexed"]
    proc = subprocess.run([sys.executable, "-c", _RECIPE, path], capture_output=True, text=True, timeout=300,
                          cwd=os.path.join(ROOT, "tests"), env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["state"] == {"seed": 0, "epoch": 0, "consumed": 16, "num_examples": 32, "dataset": _dataset(path).digest}
    assert result["again"] == result["cont"] and len(result["again"]) == 2  # 32 // 8 = 4 batches, 2 taken
    want = sorted(label for s in manifest.split("validation").shards for label, n in s.labels for _ in range(n))
    assert sorted(v for v in result["val"] if v != irt.PAD_LABEL) == want


@pytest.mark.needs_extra("torchvision")  # ImageFolder, a peer; the tfrecord package is in [test]
def test_benchmark_reports_every_loader_and_ratio(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-W", "ignore", "-m", "benchmarks.bench_torch", "--images", "12", "--shards",
                           "2", "--batch", "4", "--size", "32", "--repeats", "1", "--cache", str(tmp_path / "cache"),
                           "--json", str(out)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert sorted(result["figures"]) == ["imagefolder", "records", "records_tv", "tfrecord"]
    for name, fig in result["figures"].items():
        assert fig["img_s"] > 0 and fig["images"] == (12 if name == "imagefolder" else result["figures"]["records"]
                                                      ["images"]), name
    for name, r in result["ratios"].items():
        peer = name[len("records_vs_"):]
        assert r["ratio"] == pytest.approx(result["figures"]["records"]["img_s"] / result["figures"][peer]["img_s"])


def test_declared_features_come_back_decoded(tmp_path):
    """A declared-features build read through RecordDataset(features=...) and a DataLoader: every
    value as the manifest row gave it (boxes, class ids, score, caption, the mask's ids, 16 bits)."""
    import numpy as np
    from PIL import Image

    from tests.support.detection import CONFIG, write_rows

    rows = write_rows(tmp_path)
    with open(tmp_path / "m.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (tmp_path / "f.yaml").write_text(CONFIG)
    manifest = build(tmp_path / "m.jsonl", tmp_path / "out", "--config", tmp_path / "f.yaml", "--num_shards", 2,
                     "--write_index")
    names = manifest.features["tags"]["names"]
    wanted = ["boxes", "tags", "score", "caption", "mask", "depth"]
    ds = irt.RecordDataset(str(tmp_path / "out"), "train", image_size=SIZE, features=wanted)
    by_caption = {r["caption"]: r for r in rows}
    loader = torch.utils.data.DataLoader(ds, batch_size=5, collate_fn=list)
    seen = 0
    for batch in loader:
        for image, label, values in batch:
            row = by_caption[values["caption"]]
            assert image.shape == (3, SIZE, SIZE) and label == ["cat", "dog"].index(row["label"])
            assert values["boxes"].dtype == torch.float32
            assert np.array_equal(values["boxes"].numpy(), np.array(row["boxes"], np.float32).reshape(-1, 4))
            assert [names[i] for i in values["tags"].tolist()] == row["tags"]
            assert values["score"].item() == np.float32(row["score"])
            assert np.array_equal(values["mask"][..., 0].numpy(), np.asarray(Image.open(tmp_path / row["mask"])))
            assert values["depth"].dtype == torch.uint16
            assert np.array_equal(values["depth"][..., 0].numpy(), np.asarray(Image.open(tmp_path / row["depth"])))
            seen += 1
    assert seen == len(rows)
    with pytest.raises(ValueError, match="no feature\\(s\\) ghost; its records hold boxes, caption"):
        irt.RecordDataset(str(tmp_path / "out"), "train", features=["ghost"])
