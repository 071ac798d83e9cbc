"""Bad values in real builds: each fault is written by the test (a 48-bit PNG, a mask of another
size, a class id past its names, a `true` in a number list, a label of 10**12, a lone surrogate, a
value nested 100,000 deep, a CSV cell over the csv module's limit) and each ends as a rejected row
naming its reason, or as a record that holds exactly what it should; the rest of the build goes on."""

import io
import json
import os
import subprocess
import sys
import zlib

import numpy as np
import pytest
from PIL import Image

from conftest import build, shard_files
from imagerecords.format import records, schema

RNG = np.random.default_rng(22)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stored(out):
    """{image/filename: parsed record} of every published record, read without TensorFlow."""
    found = {}
    for path in shard_files(out):
        with open(path, "rb") as f:
            for raw in records.read_records(f, path):
                ex = schema.parse_example(raw)
                found[ex["image/filename"][0].decode()] = ex
    return found


def _errors(out):
    """{key: errors.jsonl row} of the published dataset."""
    with open(os.path.join(str(out), "errors.jsonl"), encoding="utf-8") as f:
        return {row["key"]: row for row in map(json.loads, f)}


def _png(folder, name, array, mode=None, **save):
    Image.fromarray(array, mode).save(folder / name, **save)
    return name


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "imagerecords", *map(str, args)], env=env, capture_output=True,
                          text=True, timeout=300)


def _jsonl(path, rows):
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


def _images(folder, n, size=(6, 8)):
    return [_png(folder, f"img{i}.png", RNG.integers(0, 255, (*size, 3), dtype=np.uint8)) for i in range(n)]


# 6: raw promises exact pixels ---------------------------------------------------------------------


def _rgb48_png(pixels):
    """A 16-bit-per-channel RGB PNG written by hand (Pillow writes none): IHDR depth 16, colour type 2."""
    h, w, _ = pixels.shape
    rows = b"".join(b"\x00" + pixels[y].astype(">u2").tobytes() for y in range(h))

    def chunk(kind, body):
        return len(body).to_bytes(4, "big") + kind + body + zlib.crc32(kind + body).to_bytes(4, "big")

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", w.to_bytes(4, "big") + h.to_bytes(4, "big") + bytes([16, 2, 0, 0, 0]))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def test_raw_rejects_a_16_bit_colour_png_it_cannot_hold_exactly(tmp_path):
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    grey16 = RNG.integers(0, 65536, (4, 5), dtype=np.uint16)
    _png(root / "a", "grey16.png", grey16)
    rgb = RNG.integers(0, 255, (4, 5, 3), dtype=np.uint8)
    _png(root / "a", "rgb8.png", rgb)
    (root / "a" / "rgb48.png").write_bytes(_rgb48_png(RNG.integers(0, 65536, (4, 5, 3), dtype=np.uint16)))
    out = tmp_path / "out"
    manifest = build(root, out, "--image_encoding", "raw", "--max_reject_fraction", 0.5, "--num_shards", 1)
    assert manifest.num_rejected == 1
    row = _errors(out)["a/rgb48.png"]
    assert (row["stage"], row["error"]) == ("decode", "ImageError")
    assert row["reason"] == ("a 16-bit-per-channel colour PNG: Pillow reads it as 8 bits, so --image_encoding raw "
                             "cannot hold its pixels exactly; store it unchanged with --image_encoding keep "
                             "(without --max_side, --short_side or --reencode)")
    stored = _stored(out)
    assert sorted(stored) == ["a/grey16.png", "a/rgb8.png"]
    pixels = np.frombuffer(stored["a/grey16.png"]["image"][0], "<f4").reshape(4, 5)
    assert np.array_equal(pixels, grey16.astype(np.float32))  # the 16-bit grey one is exact
    assert np.array_equal(np.frombuffer(stored["a/rgb8.png"]["image"][0], "<f4").reshape(4, 5, 3), rgb)


@pytest.mark.parametrize("encoding,how", [("png", "it cannot be re-encoded"),
                                          ("raw", "--image_encoding raw cannot hold it"), ("keep", None)])
def test_a_16_bit_grey_png_with_a_transparent_level_is_kept_whole_or_rejected_never_made_opaque(tmp_path, encoding,
                                                                                                 how):
    """Its tRNS chunk makes one grey level transparent; no Pillow mode holds that at 16 bits, so 'png'
    and 'raw' dropped the transparency silently. 'keep' stores the file's own bytes."""
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    grey16 = RNG.integers(1, 65536, (4, 5), dtype=np.uint16)
    _png(root / "a", "keyed.png", grey16, transparency=int(grey16[0, 0]))
    _png(root / "a", "plain.png", grey16)
    source = (root / "a" / "keyed.png").read_bytes()
    assert b"tRNS" in source
    out = tmp_path / "out"
    manifest = build(root, out, "--image_encoding", encoding, "--max_reject_fraction", 0.5, "--num_shards", 1)
    stored = _stored(out)
    if how is None:
        assert manifest.num_rejected == 0 and stored["a/keyed.png"]["image"][0] == source
        return
    assert manifest.num_rejected == 1 and sorted(stored) == ["a/plain.png"]
    row = _errors(out)["a/keyed.png"]
    assert (row["stage"], row["error"]) == ("decode", "ImageError")
    assert row["reason"] == (f"a 16-bit greyscale PNG with a transparent grey level (tRNS): {how} without losing its "
                             "transparency; store it unchanged with --image_encoding keep (without --max_side, "
                             "--short_side or --reencode)")


def test_an_image_feature_rejects_a_16_bit_colour_png_too(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    paths = _images(folder, 2, size=(4, 5))
    (folder / "deep.png").write_bytes(_rgb48_png(RNG.integers(0, 65536, (4, 5, 3), dtype=np.uint16)))
    rgb = RNG.integers(0, 255, (4, 5, 3), dtype=np.uint8)
    rows = [{"path": paths[0], "label": "a", "pic": "deep.png"},
            {"path": paths[1], "label": "a", "pic": _png(folder, "rgb.png", rgb)}]
    (folder / "f.yaml").write_text("features:\n  pic: {dtype: image, encoding: keep, channels: 3}\n"
                                   "max_reject_fraction: 0.5\n")
    out = tmp_path / "out"
    manifest = build(_jsonl(folder / "m.jsonl", rows), out, "--config", folder / "f.yaml", "--num_shards", 1)
    assert manifest.num_rejected == 1
    assert _errors(out)[paths[0]]["reason"] == (
        f"feature 'pic': {folder / 'deep.png'} is a 16-bit-per-channel colour PNG; Pillow reads it as 8 bits, so it "
        "cannot be stored exactly (16 bits are kept for 1-channel images only)")
    assert _stored(out)[paths[1]]["pic"] == [(folder / "rgb.png").read_bytes()]


def test_a_file_name_that_is_not_utf8_is_a_rejected_row(tmp_path):
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    _png(root / "a", "good.png", RNG.integers(0, 255, (4, 5, 3), dtype=np.uint8))
    with open(os.path.join(os.fsencode(root / "a"), b"bad\xff.png"), "wb") as f:
        f.write((root / "a" / "good.png").read_bytes())
    out = tmp_path / "out"
    manifest = build(root, out, "--max_reject_fraction", 0.6, "--num_shards", 1, "--skip_duplicate_check")
    assert manifest.num_rejected == 1
    assert _errors(out) == {"a/bad\\udcff.png": {
        "error": "", "key": "a/bad\\udcff.png", "reason": "key 'a/bad\\udcff.png' holds a lone surrogate U+DCFF, "
                                                         "which UTF-8 cannot encode",
        "skipped": False, "split": "", "stage": "list", "uri": f"{root}/a/bad\\udcff.png"}}
    assert sorted(_stored(out)) == ["a/good.png"]


# 8: a mask follows its image ----------------------------------------------------------------------

MASK_CONFIG = """features:
  mask:  {dtype: image, encoding: png}
max_reject_fraction: 0.5
"""


def _decoded(data):
    return np.asarray(Image.open(io.BytesIO(data)))


def test_a_mask_follows_the_images_resize_and_exif_rotation(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    big = RNG.integers(0, 255, (86, 128, 3), dtype=np.uint8)
    big_mask = (big[..., 0] > 127).astype(np.uint8)
    turned = RNG.integers(0, 255, (6, 10, 3), dtype=np.uint8)
    turned_mask = (turned[..., 0] > 127).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # shown rotated 90 degrees clockwise
    rows = [
        {"path": _png(folder, "big.png", big), "label": "a", "mask": _png(folder, "big_mask.png", big_mask)},
        {"path": _png(folder, "turned.png", turned, exif=exif.tobytes()), "label": "a",
         "mask": _png(folder, "turned_mask.png", turned_mask)},
        {"path": _png(folder, "small.png", RNG.integers(0, 255, (43, 64, 3), dtype=np.uint8)), "label": "b",
         "mask": _png(folder, "other_mask.png", np.zeros((200, 300), np.uint8))},
    ]
    (folder / "f.yaml").write_text(MASK_CONFIG)
    out = tmp_path / "out"
    manifest = build(_jsonl(folder / "m.jsonl", rows), out, "--config", folder / "f.yaml", "--max_side", 64,
                     "--image_encoding", "png", "--num_shards", 1)
    assert manifest.num_rejected == 1
    row = _errors(out)["small.png"]
    assert (row["stage"], row["error"]) == ("decode", "ValueProblem")
    assert row["reason"] == (f"feature 'mask': {folder / 'other_mask.png'} is 300x200 pixels, its image is 64x43; "
                             "an image feature follows its image's resize and rotation, so it must be the image's "
                             "size (declare independent: true for an image of its own size)")
    stored = _stored(out)
    assert sorted(stored) == ["big.png", "turned.png"]
    image, mask = (_decoded(stored["big.png"][k][0]) for k in ("image", "mask"))
    assert image.shape == (43, 64, 3) and mask.shape == (43, 64)  # shrunk together
    expected = np.asarray(Image.fromarray(big_mask).resize((64, 43), Image.Resampling.NEAREST))
    assert np.array_equal(mask, expected)  # nearest: class ids stay ids
    image, mask = (_decoded(stored["turned.png"][k][0]) for k in ("image", "mask"))
    assert image.shape == (10, 6, 3) and mask.shape == (10, 6)  # rotated together
    assert np.array_equal(mask, (image[..., 0] > 127).astype(np.uint8))


def test_an_independent_image_feature_keeps_its_own_size(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    thumb = _png(folder, "thumb.png", RNG.integers(0, 255, (5, 7), dtype=np.uint8))
    rows = [{"path": p, "label": "a", "thumb": thumb} for p in _images(folder, 2, size=(86, 128))]
    (folder / "f.yaml").write_text("features:\n  thumb: {dtype: image, encoding: keep, independent: true}\n")
    out = tmp_path / "out"
    manifest = build(_jsonl(folder / "m.jsonl", rows), out, "--config", folder / "f.yaml", "--max_side", 64,
                     "--num_shards", 1)
    assert manifest.num_rejected == 0 and manifest.features["thumb"]["independent"] is True
    for ex in _stored(out).values():
        assert ex["thumb"] == [(folder / thumb).read_bytes()]  # not shrunk with its image: its own bytes


# 11: class ids within the names; a bool is not a number -------------------------------------------

LIST_CONFIG = """features:
  tags:  {dtype: class_list, names: [cat, dog]}
  seen:  {dtype: class_list}
  boxes: {dtype: float32, shape: [null, 4]}
  count: {dtype: int32, shape: [null]}
  n:     {dtype: int32}
max_reject_fraction: 0.9
"""


@pytest.mark.slow
def test_class_ids_past_the_names_and_bools_in_number_lists_are_rejected_rows(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    paths = _images(folder, 7)
    good = {"tags": [1, 0], "seen": ["sky"], "boxes": [[0.5, 0.25, 1, 2]], "count": [1, 2], "n": 3}
    rows = [
        dict(good, path=paths[0], label="x", key="good"),
        dict(good, path=paths[1], label="x", key="past-declared", tags=[0, 2]),
        dict(good, path=paths[2], label="x", key="past-seen", seen=[1]),  # one name seen: id 1 is past it
        dict(good, path=paths[3], label="x", key="true-in-floats", boxes=[[0.5, True, 1, 2]]),
        dict(good, path=paths[4], label="x", key="true-in-ints", count=[1, True]),
        dict(good, path=paths[5], label="x", key="lone-true", n=True),
        dict(good, path=paths[6], label="x", key="seen-id", seen=[0]),
    ]
    (folder / "f.yaml").write_text(LIST_CONFIG)
    out = tmp_path / "out"
    manifest = build(_jsonl(folder / "m.jsonl", rows), out, "--config", folder / "f.yaml", "--num_shards", 1)
    reasons = {k: (r["stage"], r["reason"]) for k, r in _errors(out).items()}
    assert reasons == {
        "past-declared": ("list", "feature 'tags': class id 2 is outside 0..1 (its 2 names)"),
        "past-seen": ("decode", "feature 'seen': class id 1 is outside 0..0 (its 1 name)"),
        "true-in-floats": ("list", "feature 'boxes': [[0.5, true, 1, 2]] holds a bool (true/false), not a number "
                                   "(float32)"),
        "true-in-ints": ("list", "feature 'count': [1, true] holds a bool (true/false), not a number (int32)"),
        "lone-true": ("list", "feature 'n': true is a bool, not a number (int32)"),
    }
    assert manifest.num_rejected == 5 and sorted(_stored(out)) == ["good", "seen-id"]
    done = _cli("verify", out, "--records")
    assert (done.returncode, done.stderr) == (0, ""), done.stdout


# 12: an integer label never makes a vocabulary of its size ----------------------------------------


@pytest.mark.parametrize("huge", ["2000000", "1" + "0" * 12, "1" + "0" * 5000], ids=["2e6", "1e12", "1e5000"])
def test_an_integer_label_past_the_class_limit_is_a_rejected_row(tmp_path, huge):
    folder = tmp_path / "in"
    folder.mkdir()
    paths = _images(folder, 3)
    manifest_path = folder / "m.csv"
    manifest_path.write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in zip(paths, (0, 2, huge))))
    out = tmp_path / "out"
    manifest = build(manifest_path, out, "--label_type", "int", "--max_reject_fraction", 0.5, "--num_shards", 1)
    shown = huge if len(huge) <= 20 else huge[:17] + "..."
    assert _errors(out)["img2.png"] == {
        "error": "", "key": "img2.png", "skipped": False, "split": "train", "stage": "label",
        "uri": str(folder / "img2.png"),
        "reason": f"label {shown} is past the largest integer class id 999999: integer labels name ids 0..the "
                  "largest one, so they are capped at 1,000,000 classes; give class names (--label_type name) instead"}
    assert manifest.num_rejected == 1
    assert (out / "label.labels.txt").read_text() == "0\n1\n2\n"


# 13: text and size hazards in manifest rows -------------------------------------------------------

TEXT_CONFIG = """features:
  caption: {dtype: string}
  tags:    {dtype: class_list}
max_reject_fraction: 0.9
"""


@pytest.mark.slow
def test_lone_surrogates_and_deep_values_are_rejected_rows(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    paths = _images(folder, 1)
    good = {"path": paths[0], "label": "x", "caption": "fine", "tags": ["sky"]}
    deep = "[" * 100_000 + "]" * 100_000
    lines = [dict(good, key=f"row{i:04d}") for i in range(1600)]
    lines[0] = ('{"path": "img0.png", "label": "x", "caption": "fine", "tags": ["sky"], "key": "deep-first", '
                '"extra": ' + deep + '}')
    lines[3] = json.dumps(dict(good, key="surrogate-caption")).replace('"fine"', '"bad \\ud800"')
    lines[4] = json.dumps(dict(good, key="surrogate-key-\\udc00")).replace("\\\\udc00", "\\udc00")
    lines[5] = json.dumps(dict(good, key="surrogate-label", label="x\\ud83d")).replace("\\\\ud83d", "\\ud83d")
    lines[6] = json.dumps(dict(good, key="surrogate-tag", tags=["\\udfff"])).replace("\\\\udfff", "\\udfff")
    lines[7] = json.dumps(dict(good, key="newline-tag", tags=["a\nb"]))
    lines[8] = json.dumps(dict(good, key="surrogate-column", note=1)).replace('"note"', '"note\\ud800"')
    lines[1500] = ('{"path": "img0.png", "label": "x", "key": "deep-later", "caption": "fine", "tags": ["sky"], '
                   '"extra": ' + deep + '}')
    (folder / "f.yaml").write_text(TEXT_CONFIG)
    out = tmp_path / "out"
    done = _cli("build", "--input", _jsonl(folder / "m.jsonl", lines), "--output", out, "--config", folder / "f.yaml",
                "--num_shards", 1, "--no_progress", "--skip_duplicate_check")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "  ignored columns: note\\ud800 (" in done.stdout  # a column nothing reads is named, escaped
    with open(out / "errors.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    reasons = sorted((r["key"], r["stage"], r["reason"]) for r in rows)
    manifest = str(folder / "m.jsonl")
    deep_reason = f"{manifest}: bad manifest line: a JSON value nested deeper than the parser's limit"
    assert reasons == sorted([
        ("", "list", deep_reason),
        ("", "list", deep_reason),
        ("newline-tag", "list", "feature 'tags': class 'a\\nb' holds control character U+000A: class names go one "
                                "per line into tags.labels.txt, which it would break or shift"),
        ("surrogate-caption", "list", "feature 'caption': \"bad \\ud800\" holds a lone surrogate U+D800, which UTF-8 "
                                      "cannot encode"),
        ("surrogate-key-\\udc00", "list", "key 'surrogate-key-\\udc00' holds a lone surrogate U+DC00, which UTF-8 "
                                          "cannot encode"),
        ("surrogate-label", "label", "label 'x\\ud83d' holds a lone surrogate U+D83D, which UTF-8 cannot encode"),
        ("surrogate-tag", "list", "feature 'tags': class '\\udfff' holds a lone surrogate U+DFFF, which UTF-8 "
                                  "cannot encode"),
    ])
    assert len(_stored(out)) == 1600 - 7


def test_a_csv_cell_over_the_csv_modules_limit_is_a_rejected_row(tmp_path):
    folder = tmp_path / "in"
    folder.mkdir()
    paths = _images(folder, 3)
    big = "w" * (200 * 1024)
    (folder / "f.yaml").write_text("features:\n  caption: {dtype: string}\nmax_reject_fraction: 0.9\n")
    manifest_path = folder / "m.csv"
    manifest_path.write_text("path,label,caption,note\n"
                             f"{paths[0]},x,fine,\n{paths[1]},x,{big},\n{paths[2]},x,fine,{big}\n")
    out = tmp_path / "out"
    done = _cli("build", "--input", manifest_path, "--output", out, "--config", folder / "f.yaml", "--num_shards", 1,
                "--no_progress")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    with open(out / "errors.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert [(r["stage"], r["reason"]) for r in rows] == [
        ("list", f"{manifest_path}: bad manifest line: a CSV field is over the csv module's limit of 131072 "
                 "characters; shorten it or store it in a file the row names")] * 2
    assert sorted(r["uri"][:40] for r in rows) == sorted([f"{paths[1]},x,{big}"[:40], f"{paths[2]},x,fine,{big}"[:40]])
    assert sorted(_stored(out)) == [paths[0]]


@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_negative_integer_label_is_a_rejected_row_never_a_switch_to_class_names(tmp_path, kind):
    # One -1 among integer labels once made every label a class name: 0 became id 1 and 10 id 3.
    folder = tmp_path / "in"
    folder.mkdir()
    paths = _images(folder, 4)
    labels = [0, 10, -1, 3]
    if kind == "csv":
        manifest_path = folder / "m.csv"
        manifest_path.write_text("path,label\n" + "".join(f"{p},{label}\n" for p, label in zip(paths, labels)))
    else:
        manifest_path = _jsonl(folder / "m.jsonl", [{"path": p, "label": label} for p, label in zip(paths, labels)])
    out = tmp_path / "out"
    manifest = build(manifest_path, out, "--max_reject_fraction", 0.5, "--num_shards", 1)
    assert {k: r["reason"] for k, r in _errors(out).items()} == {
        "img2.png": "label -1 is a negative class id: integer labels are ids from 0; fix or drop the row, or give "
                    "class names (label_type 'name') to treat every label as a name"}
    assert manifest.num_rejected == 1
    assert (out / "label.labels.txt").read_text() == "".join(f"{i}\n" for i in range(11))
    assert {k: int(ex["label"][0]) for k, ex in _stored(out).items()} == {"img0.png": 0, "img1.png": 10,
                                                                         "img3.png": 3}


def test_a_manifest_size_past_int64_plans_and_builds(tmp_path):
    # Out of range: a size column may say anything the --max_file_mb limit allows (here 2e13 MB, past
    # int64's 9.2e18 bytes). The local engine's plan holds such a size at 9.2 EB and sums the rest
    # exactly: every row is written, as many shards as rows, no OverflowError.
    rows = []
    for i, size in enumerate([15 * 10**18, 2**62, 2**62]):
        Image.new("RGB", (8, 8), (60 * i, 0, 0)).save(tmp_path / f"i{i}.jpg")
        rows.append(f"{tmp_path / f'i{i}.jpg'},{'ab'[i % 2]},{size}\n")
    (tmp_path / "m.csv").write_text("path,label,size\n" + "".join(rows))
    manifest = build(tmp_path / "m.csv", tmp_path / "out", "--max_file_mb", "2e13")
    assert manifest.num_examples == 3 and manifest.num_rejected == 0
    assert [len(s.shards) for s in manifest.splits] == [3]
