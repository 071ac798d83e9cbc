"""The source seam: a new input kind is one class and one `sources.register` call, made here, in a
test module, without touching a file under imagerecords/. Rows come from a Python generator that
draws each picture in memory (no file anywhere); the local engine in one process and in two must write
the same bytes from them (DirectRunner too: tests/test_beam_fast.py), and every listed row must end as a
record or as a row of errors.jsonl."""

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

from conftest import build, read_examples
from test_golden import digests
from imagerecords.pipeline import sources
from imagerecords.pipeline.errors import InputError
from imagerecords.pipeline.refs import ImageRef, Rejected

SHAPES = ("circle", "square", "stripe")
BROKEN = 5  # drawn as bytes no decoder takes: rejected when its shard decodes it
SKIPPED = 7  # turned away by the generator itself while listing


def _pixels(i: int) -> np.ndarray:
    yy, xx = np.mgrid[0:16, 0:20]
    return np.stack([(xx * 12 + i * 7) % 256, (yy * 15 + i * 31) % 256, np.full_like(xx, i * 9 % 256)],
                    axis=-1).astype(np.uint8)


def _draw(uri: str) -> bytes:
    """The bytes of generated picture `uri` (counting://N/i): a PNG, or garbage for BROKEN."""
    i = int(uri.rsplit("/", 1)[1])
    if i == BROKEN:
        return b"this is not a picture"
    out = io.BytesIO()
    Image.fromarray(_pixels(i)).save(out, format="PNG")
    return out.getvalue()


class CountingSource(sources.Source):
    """`counting://N`: N pictures drawn by code, labelled by shape in turn."""

    kind = "counting"

    def claims(self, path):
        return path.startswith("counting://")

    def local(self, path):
        return True  # nothing to fetch: the local engine can list and read it

    def _count(self, path):
        try:
            n = int(path[len("counting://"):])
        except ValueError:
            n = 0
        if n < 1:
            raise InputError(f"--input {path}: counting:// needs a positive number of pictures")
        return n

    def check(self, config, *, ignore_split_column=False):
        self._count(config.input)
        return sources.InputInfo(self.kind)

    def parts(self, config, info, workers):
        n = self._count(config.input)
        return [(0, n // 2), (n // 2, n)]  # two tasks: the engines must keep their order

    def list_part(self, config, info, part):
        for i in range(*part):
            uri = f"{config.input}/{i}"
            if i == SKIPPED:
                yield Rejected(uri, "the generator skipped this picture", key=f"pic{i:03d}", stage="list")
            else:
                yield ImageRef(key=f"pic{i:03d}", uri=uri, label=SHAPES[i % 3], split="", size=len(_draw(uri)))

    def reader(self, options):
        return _draw


@pytest.fixture
def counting():
    source = sources.register(CountingSource())
    yield source
    sources.unregister(source)


ARGS = ["--splits", "train=0.75,validation=0.25", "--num_shards", 2, "--write_index", "--max_reject_fraction", 0.2,
        "--image_encoding", "png"]


def test_the_registered_source_is_chosen_for_its_inputs_and_no_other(counting, tmp_path):
    assert sources.of("counting://24") is counting
    assert sources.of(str(tmp_path)).kind == "folder"
    assert sources.of(str(tmp_path / "list.csv")).kind == "manifest"
    sources.unregister(counting)
    try:
        assert sources.of("counting://24").kind == "folder"  # gone: a folder URI again
    finally:
        sources.register(counting)


def test_a_generator_source_builds_on_the_local_engine(counting, tmp_path):
    out = tmp_path / "out"
    manifest = build("counting://24", out, *ARGS)
    assert manifest.num_examples == 22 and manifest.num_rejected == 2
    examples = read_examples(out)
    assert sorted(examples) == [f"pic{i:03d}" for i in range(24) if i not in (BROKEN, SKIPPED)]
    for key, ex in examples.items():
        i = int(key[3:])
        f = ex.features.feature
        assert f["label"].int64_list.value[0] == i % 3  # ids by sorted name: circle, square, stripe
        decoded = np.asarray(Image.open(io.BytesIO(f["image"].bytes_list.value[0])).convert("RGB"))
        assert np.array_equal(decoded, _pixels(i)), key
    with open(os.path.join(out, "errors.jsonl")) as f:
        rows = {r["key"]: r for r in map(json.loads, f)}
    assert sorted(rows) == [f"pic{BROKEN:03d}", f"pic{SKIPPED:03d}"]
    assert rows[f"pic{SKIPPED:03d}"]["stage"] == "list"
    assert rows[f"pic{BROKEN:03d}"]["stage"] == "decode"


def test_a_bad_generator_input_is_one_line_naming_it(counting, tmp_path, capsys):
    from imagerecords.cli import main as cli

    code = cli.main(["build", "--input", "counting://zero", "--output", str(tmp_path / "out"), "--no_progress"])
    err = capsys.readouterr().err.strip()
    assert code == 3 and err == ("imagerecords build: error: --input counting://zero: counting:// needs a positive number "
                                 "of pictures"), (code, err)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_generator_source_writes_the_same_bytes_in_worker_processes(counting, tmp_path):
    # DirectRunner's bytes, in memory and on two processes: tests/test_beam_fast.py.
    build("counting://24", tmp_path / "local", *ARGS)
    build("counting://24", tmp_path / "forked", *ARGS, "--local_workers", 2)  # listed and written in 2 processes
    local, forked = (digests(str(tmp_path / name), str(tmp_path)) for name in ("local", "forked"))
    assert any(name.endswith(".tfrecord-00000-of-00002") for name in local)
    assert forked == local


# The input kind travels on the ref -------------------------------------------------------------


def test_a_folder_file_named_like_an_array_row_is_an_image(tmp_path):
    # "#row=" in a file name once made the writer take it for an arrays row: int("1.jpg") failed the build.
    for i, name in enumerate(("x#row=1.jpg", "plain.jpg")):
        (tmp_path / "in" / "cats").mkdir(parents=True, exist_ok=True)
        Image.fromarray(_pixels(i)).save(tmp_path / "in" / "cats" / name, format="PNG")
    manifest = build(tmp_path / "in", tmp_path / "out", "--num_shards", 1, "--image_encoding", "png")
    assert manifest.num_examples == 2 and manifest.num_rejected == 0
    examples = read_examples(tmp_path / "out")
    assert sorted(examples) == ["cats/plain.jpg", "cats/x#row=1.jpg"]
    pixels = examples["cats/x#row=1.jpg"].features.feature["image"].bytes_list.value[0]
    assert np.array_equal(np.asarray(Image.open(io.BytesIO(pixels)).convert("RGB")), _pixels(0))


class IdentifiedSource(CountingSource):
    """CountingSource with the documented `identity()` hook: what --resume compares beyond the refs."""

    kind = "identified"

    def claims(self, path):
        return path.startswith("counting://")

    def identity(self, path):
        return f"generator v1 of {path}"


def test_a_registered_source_with_an_identity_builds(tmp_path):
    source = sources.register(IdentifiedSource())
    try:
        manifest = build("counting://24", tmp_path / "out", *ARGS)
    finally:
        sources.unregister(source)
    assert manifest.num_examples == 22 and manifest.num_rejected == 2
    assert sorted(read_examples(tmp_path / "out")) == [f"pic{i:03d}" for i in range(24) if i not in (BROKEN, SKIPPED)]
