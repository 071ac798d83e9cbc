"""Near-duplicates: edited copies of training images (resized, recompressed, cropped) found in
validation by their perceptual hashes, on both engines and across an append.

The corpus is made by code (tests/support/near_corpus.py): 40 distinct photo-like pictures in
train, and in validation 20 copies of some of them, 5 per edit (0.5x, 0.8x, quality 60, 2-4% crop),
the first of them under another label.
"""

import base64
import contextlib
import glob
import io
import itertools
import json
import os
import random
from html.parser import HTMLParser

import pytest
from PIL import Image

from conftest import build
from support import near_corpus
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode.perceptual import distance, phash
from imagerecords.pipeline.plan import near


def _near_rows(output):
    with open(os.path.join(output, "duplicates.jsonl"), encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return [r for r in rows if r.get("kind") == "near"]


def _pairs(rows):
    """Every pair of keys that shares a near group."""
    return {tuple(sorted(p)) for r in rows for p in itertools.combinations([m["key"] for m in r["members"]], 2)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return near_corpus.write(str(tmp_path_factory.mktemp("near")))


@pytest.fixture(scope="module")
def local_build(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("near_local") / "out"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        build(corpus["csv"], out, "--num_shards", 2)
    (out.parent / "summary.txt").write_text(printed.getvalue())  # the command's summary, for the count test
    return out


def test_the_report_finds_edited_copies_and_no_distinct_pair(corpus, local_build):
    rows = _near_rows(local_build)
    found, planted = _pairs(rows), {tuple(sorted(p)) for p in corpus["pairs"]}
    recall = len(found & planted) / len(planted)
    precision = len(found & planted) / len(found)
    assert recall >= 0.95, f"found {sorted(found & planted)} of {sorted(planted)}"
    assert precision >= 0.98, f"pairs of distinct pictures reported: {sorted(found - planted)}"
    # Every planted pair crosses train/validation: each group found is flagged as a leak.
    assert all(r["leak"] and r["splits"] == ["train", "validation"] for r in rows)
    # The first copy carries another label than its original: that group, and only it, conflicts.
    conflicting = [r for r in rows if r["conflict"]]
    assert [tuple(sorted(m["key"] for m in r["members"])) for r in conflicting] == [tuple(sorted(corpus["pairs"][0]))]
    assert conflicting[0]["labels"] == ["lake", "road"]
    assert all(r["distance"] <= near.THRESHOLD for r in rows)
    # What the summary counts (the identical files' rows are not near groups)
    summary = (local_build.parent / "summary.txt").read_text()
    assert (f"near-duplicates {len(rows):>6} groups of resized, recompressed or cropped copies, {len(rows)} across "
            "splits") in summary, summary


def test_hashes_files_lie_beside_the_keys_files(local_build):
    manifest = json.loads((local_build / "manifest.json").read_text())
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            folder, _, name = shard["filename"].rpartition("/")
            data = (local_build / folder / "hashes" / f"{name}.txt").read_bytes()
            hashes = near.parse_hashes(data, shard["keys_sha256"], shard["count"])
            assert hashes is not None and all(h is not None for h in hashes), shard["filename"]


def test_off_writes_no_hashes_and_no_near_rows(corpus, tmp_path):
    build(corpus["csv"], tmp_path / "out", "--num_shards", 2, "--near_duplicates", "off")
    version = json.loads((tmp_path / "out" / "manifest.json").read_text())["version"]
    assert not (tmp_path / "out" / version / "hashes").exists()
    assert _near_rows(tmp_path / "out") == []


def test_a_pass_through_jpeg_is_hashed_from_its_draft():
    # The hash the writer keeps is the one of the 1/8-scale draft it decodes anyway, and it stays
    # within a few bits of the full decode's (no second decode needed for a good hash).
    data = near_corpus.jpeg(near_corpus.picture(7, (640, 480)))
    prepared = codec.prepare_image(data, codec.ImageOptions(), perceptual=True)
    assert prepared.passthrough and prepared.data == data
    draft = Image.open(io.BytesIO(data))
    draft.draft("RGB", (80, 60))
    assert draft.size == (80, 60)
    assert prepared.phash == phash(draft)
    assert distance(prepared.phash, phash(Image.open(io.BytesIO(data)))) <= 4


def test_the_banded_index_finds_every_pair_brute_force_finds():
    rng = random.Random(41)
    hashes = [rng.getrandbits(64) for _ in range(300)]
    for i in range(120):  # planted neighbours 0..10 bits away from an existing hash
        base, bits = hashes[i], rng.sample(range(64), i % 11)
        hashes.append(base ^ sum(1 << b for b in bits))
    items = [(h, f"{n:032x}", (f"k{n:04d}", "train", f"u{n}", ""), False) for n, h in enumerate(hashes)]
    want = {(a[2], b[2]) for a, b in itertools.combinations(items, 2) if distance(a[0], b[0]) <= near.THRESHOLD}
    got = {(a[2], b[2]) for a, b in near.find_pairs(items)}
    assert got == want and len(want) >= 90
    # The Beam path's buckets give the same pairs.
    buckets = {}
    for item in items:
        for key, entry in near.keyed(item):
            buckets.setdefault(key, []).append(entry)
    assert {(a[2], b[2]) for entries in buckets.values() for a, b in near.bucket_pairs(entries)} == want


def _train_then_append_a_copy(corpus, tmp_path, workers=None, before_append=lambda out: None):
    """Builds the corpus's train images, then appends a 0.8x copy of train/road/o5.jpg to validation
    (under another label); returns the near rows after the append."""
    out = tmp_path / "out"
    first = tmp_path / "first.csv"
    lines = open(corpus["csv"]).read().splitlines()
    first.write_text("\n".join([lines[0]] + [line for line in lines[1:] if ",train," in line]) + "\n")
    build(first, out, "--num_shards", 2)
    assert _near_rows(out) == []
    before_append(out)
    copy, quality = near_corpus.edited(near_corpus.picture(1005), "fourfifths")
    path = tmp_path / "new.jpg"
    path.write_bytes(near_corpus.jpeg(copy, quality))
    second = tmp_path / "second.csv"
    second.write_text(f"{lines[0]}\n{path},wall,validation,validation/wall/new.jpg\n")
    build(second, out, "--append", workers=workers)
    return _near_rows(out)


@pytest.mark.parametrize("workers", [None, pytest.param(2, marks=pytest.mark.slow)], ids=["local", "direct"])
def test_an_append_finds_a_new_image_near_an_old_record(corpus, tmp_path, workers):
    rows = _train_then_append_a_copy(corpus, tmp_path, workers)
    assert [[(m["key"], m["split"]) for m in r["members"]] for r in rows] == [
        [("train/road/o5.jpg", "train"), ("validation/wall/new.jpg", "validation")]]
    assert rows[0]["leak"] and rows[0]["conflict"]
    # The old record is named by the shard that holds it (its file was not read again).
    assert rows[0]["members"][0]["uri"].endswith(".tfrecord-00000-of-00002") or \
        rows[0]["members"][0]["uri"].endswith(".tfrecord-00001-of-00002")


def test_an_append_skips_a_hashes_file_that_is_not_its_shards(corpus, tmp_path):
    # Edited after its build (its header names another keys file): not trusted, the append still publishes.
    def tamper(out):
        for path in glob.glob(str(out / "v-*" / "hashes" / "*.txt")):
            with open(path) as f:
                text = f.read()
            with open(path, "w") as f:
                f.write(text.replace('"keys_sha256": "', '"keys_sha256": "0', 1))

    assert _train_then_append_a_copy(corpus, tmp_path, before_append=tamper) == []


@pytest.mark.slow
def test_direct_runner_finds_the_same_groups(corpus, local_build, tmp_path):
    build(corpus["csv"], tmp_path / "out", "--num_shards", 2, workers=2)
    assert _near_rows(tmp_path / "out") == _near_rows(local_build)
    assert (tmp_path / "out" / "duplicates.jsonl").read_bytes() == (local_build / "duplicates.jsonl").read_bytes()


class _NearTable(HTMLParser):
    """The rows of the report's near-duplicates table: [(row attrs, [img src], [caption text])]."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.rows, self.data, self._in, self._caption = [], [], False, None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if "data-near" in a:
            self.data.append(a)
        if tag == "table":
            self._in = a.get("class") == "near"
        elif tag == "tr" and self._in:
            self.rows.append((a, [], []))
        elif tag == "img" and self._in and self.rows:
            self.rows[-1][1].append(a["src"])
        elif tag == "figcaption" and self._in:
            self._caption = ""

    def handle_data(self, data):
        if self._caption is not None:
            self._caption += data

    def handle_endtag(self, tag):
        if tag == "table":
            self._in = False
        elif tag == "figcaption" and self._caption is not None:
            self.rows[-1][2].append(self._caption)
            self._caption = None


def test_the_report_shows_each_cross_split_group_side_by_side(local_build, tmp_path):
    from imagerecords.cli import inspection, report

    page = open(report.write_report(str(local_build), str(tmp_path / "r.html"),
                                    load_manifest=inspection.load_for_report), encoding="utf-8").read()
    rows = _near_rows(local_build)
    table = _NearTable(page)
    assert table.data == [{"data-near": str(len(rows)), "data-near-leaks": str(len(rows))}]
    shown = [(srcs, captions) for attrs, srcs, captions in table.rows if attrs.get("data-leak") == "1"]
    assert len(shown) == len(rows)
    for (srcs, captions), row in zip(shown, rows):
        # Both members' thumbnails, in the row's member order, taken from the records themselves.
        assert [c.split("·")[0].strip() for c in captions] == [m["split"] for m in row["members"]]
        assert len(srcs) == 2 and all(s.startswith("data:image/jpeg;base64,") for s in srcs)
        pictures = [Image.open(io.BytesIO(base64.b64decode(s.split(",", 1)[1]))) for s in srcs]
        assert distance(phash(pictures[0]), phash(pictures[1])) <= near.THRESHOLD + 4


def test_a_resumed_build_takes_a_staged_shards_hashes_from_its_record(local_build):
    # A resumed build reuses a staged shard through its record: the record must give back every hash.
    from imagerecords.pipeline.write import shard_writer

    manifest = json.loads((local_build / "manifest.json").read_text())
    shard = manifest["splits"]["validation"]["shards"][0]
    result = shard_writer.ShardResult.from_json(dict(shard, split="validation"))
    items = [(2**64 - 1 - n, f"{n:032x}", (f"k{n}", "validation", f"u{n}", "lake"), False) for n in range(3)]
    staged = shard_writer.StagedShard(result, [], [], 0, items)
    record = json.loads(shard_writer._staged_record_bytes("f" * 64, staged))
    assert shard_writer.StagedShard.from_json(record["staged"]).near == items
