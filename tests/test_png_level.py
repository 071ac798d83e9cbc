"""--png_level: the libdeflate level of every PNG a build writes (png, keep's conversions, uint8 arrays).

Fixtures are drawn by code here: flat pictures (gradients with a patch, the kind a mask or a drawing
is, where zlib's levels differ in size) saved as PNG and BMP with Pillow into tmp_path.
"""

import io
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from conftest import build, read_examples, shard_files
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode import png as png_writer
from test_bad_inputs_resume import _kill_after_two_shards, _resume

CLASSES = ("cat", "dog")


def _flat(c, i):
    """A 64x48 RGB picture: gradients plus a square patch, fixed by class `c` and index `i`."""
    yy, xx = np.mgrid[0:48, 0:64]
    img = np.stack([(xx * 4 + c * 60) % 256, (yy * 5 + i * 20) % 256, ((xx + yy) * 2) % 256], -1).astype(np.uint8)
    img[10 + i:30 + i, 8 + 4 * i:28 + 4 * i] = (250, 40 * c, 30 * i)
    return img


@pytest.fixture(scope="module")
def flat_tree(tmp_path_factory):
    """images/<class>/<i>.png (and one .bmp per class, which keep converts to PNG); returns (root, {key: pixels})."""
    root = tmp_path_factory.mktemp("flat") / "images"
    pixels = {}
    for c, cls in enumerate(CLASSES):
        (root / cls).mkdir(parents=True)
        for i in range(4):
            key = f"{cls}/{i}.{'bmp' if i == 3 else 'png'}"
            pixels[key] = _flat(c, i)
            Image.fromarray(pixels[key]).save(root / key)
    return root, pixels


def _stored(out):
    """{filename: stored image bytes} of every record."""
    return {k: ex.features.feature["image"].bytes_list.value[0] for k, ex in read_examples(out).items()}


def _shard_bytes(out):
    return {os.path.basename(p): open(p, "rb").read() for p in shard_files(out)}


def _cli(*args):
    proc = subprocess.run([sys.executable, "-m", "imagerecords", "build", *map(str, args), "--no_progress"],
                          capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stderr


def test_png_bytes_are_the_writers_at_the_level_asked():
    img = Image.fromarray(_flat(0, 0))
    for level in (0, 1, 6, 9, 12):
        assert codec.png_bytes(img, level) == png_writer.encode(_flat(0, 0), level, png_writer.FILTER)
    assert codec.png_bytes(img) == codec.png_bytes(img, codec.PNG_LEVEL) == codec.png_bytes(img, 1)
    assert len(codec.png_bytes(img, 9)) < len(codec.png_bytes(img, 1)) < len(codec.png_bytes(img, 0))


@pytest.mark.slow
@pytest.mark.parametrize("encoding", ["png", "keep"])
def test_the_level_is_honoured_and_every_level_decodes_to_the_source_pixels(flat_tree, tmp_path, encoding):
    root, pixels = flat_tree
    stored = {}
    for level in (1, 9):
        out = tmp_path / f"level{level}"
        manifest = build(root, out, "--image_encoding", encoding, "--png_level", level, "--num_shards", 1)
        assert manifest.parameters["image"]["png_level"] == level
        stored[level] = _stored(out)
        assert sorted(stored[level]) == sorted(pixels)
        for key, data in stored[level].items():
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(data))), pixels[key]), (level, key)
    # keep stores the source PNGs as they are; only the BMPs are converted, at the level asked.
    converted = sorted(k for k in pixels if encoding == "png" or k.endswith(".bmp"))
    for key in converted:
        assert len(stored[9][key]) < len(stored[1][key]), key
    assert sum(map(len, stored[9].values())) < sum(map(len, stored[1].values()))
    for key in sorted(set(pixels) - set(converted)):
        assert stored[1][key] == stored[9][key] == (root / key).read_bytes()


@pytest.mark.slow
def test_two_builds_and_both_engines_write_the_same_bytes(flat_tree, tmp_path):
    root, _ = flat_tree
    args = ("--image_encoding", "png", "--num_shards", 2)
    build(root, tmp_path / "a", *args)
    build(root, tmp_path / "b", *args)
    build(root, tmp_path / "direct", *args, workers=2)
    a = _shard_bytes(tmp_path / "a")
    assert len(a) == 2
    assert a == _shard_bytes(tmp_path / "b") == _shard_bytes(tmp_path / "direct")
    # The default level is the one the bytes are made with.
    for data in _stored(tmp_path / "a").values():
        img = Image.open(io.BytesIO(data))
        assert data == codec.png_bytes(img.convert(img.mode), codec.PNG_LEVEL)


@pytest.mark.slow
def test_uint8_arrays_are_stored_at_the_level(tmp_path):
    images = np.stack([_flat(i % 2, i % 3) for i in range(12)])
    np.savez(tmp_path / "a.npz", image=images, label=np.arange(12) % 2)
    sizes = {}
    for level in (1, 9):
        out = tmp_path / f"level{level}"
        manifest = build(tmp_path / "a.npz", out, "--png_level", level, "--num_shards", 1)
        assert manifest.parameters["image"]["png_level"] == level
        import tensorflow as tf

        total, decoded = 0, []
        for path in shard_files(out):
            for raw in tf.data.TFRecordDataset(path):
                data = tf.train.Example.FromString(raw.numpy()).features.feature["image"].bytes_list.value[0]
                decoded.append(np.asarray(Image.open(io.BytesIO(data))).tobytes())
                total += len(data)
        assert sorted(decoded) == sorted(im.tobytes() for im in images)
        sizes[level] = total
    assert sizes[9] < sizes[1], sizes


@pytest.mark.parametrize("value", ["13", "-1", "1.5", "x", ""])
def test_a_bad_level_is_one_line_and_exit_2(flat_tree, tmp_path, value):
    root, _ = flat_tree
    rc, err = _cli("--input", root, "--output", tmp_path / "out", "--png_level", value)
    assert rc == 2, err
    assert err.strip().count("\n") == 0 and "png_level" in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [13, -1, 1.5, True, "1", None])
def test_image_options_refuse_a_level_outside_libdeflates(value):
    with pytest.raises(ValueError, match=r"png_level must be a whole number within 0\.\.12"):
        codec.ImageOptions(png_level=value)


def test_a_default_jpeg_build_records_no_level(flat_tree, tmp_path):
    root, _ = flat_tree
    manifest = build(root, tmp_path / "out", "--num_shards", 1)
    assert "png_level" not in manifest.parameters["image"]
    raw = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "png_level" not in raw["parameters"]["image"]


def _copy_with_a_delta(flat_tree, tmp_path):
    """A copy of the flat tree; returns (root, add) where add() puts one new image in it."""
    root = tmp_path / "in"
    shutil.copytree(flat_tree[0], root)
    return root, lambda: Image.fromarray(_flat(1, 5)).save(root / "dog" / "new.png")


@pytest.mark.slow
def test_append_with_another_level_is_refused_in_one_line(flat_tree, tmp_path):
    root, add = _copy_with_a_delta(flat_tree, tmp_path)
    out = tmp_path / "out"
    assert _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1)[0] == 0
    before = (out / "manifest.json").read_bytes()
    rc, err = _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1,
                   "--png_level", 9, "--append")
    assert rc == 2, err
    assert err.strip().count("\n") == 0 and "--append refused" in err and "png_level 9 differs" in err, err
    assert (out / "manifest.json").read_bytes() == before
    add()
    rc, err = _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1,
                   "--png_level", 1, "--append")
    assert rc == 0, err


def _as_an_earlier_version_wrote_it(out, *keys):
    """Drops `keys` from the manifest's parameters.image, as versions before them wrote it."""
    raw = json.loads((out / "manifest.json").read_text())
    for key in keys:
        del raw["parameters"]["image"][key]
    (out / "manifest.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return (out / "manifest.json").read_bytes()


def test_the_manifest_records_the_writer_beside_the_level(flat_tree, tmp_path):
    manifest = build(flat_tree[0], tmp_path / "out", "--image_encoding", "png", "--num_shards", 1)
    assert manifest.parameters["image"]["png_level"] == codec.PNG_LEVEL
    assert manifest.parameters["image"]["png_writer"] == codec.PNG_WRITER


def test_append_to_a_dataset_of_pillows_pngs_is_refused_in_one_line(flat_tree, tmp_path):
    """A manifest with a level and no writer was written by Pillow's PNG writer: the same level
    gave other bytes, so appending this version's PNGs to it is refused, never mixed."""
    root, add = _copy_with_a_delta(flat_tree, tmp_path)
    out = tmp_path / "out"
    assert _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1)[0] == 0
    before = _as_an_earlier_version_wrote_it(out, "png_writer")
    add()
    rc, err = _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1, "--append")
    assert rc == 2, err
    assert err.strip().count("\n") == 0 and "--append refused" in err, err
    assert "written by 'pillow'" in err and repr(codec.PNG_WRITER) in err and "--overwrite" in err, err
    assert (out / "manifest.json").read_bytes() == before


@pytest.mark.slow
def test_append_to_a_dataset_written_before_the_setting_is_refused(flat_tree, tmp_path):
    """No level recorded: written at 6, by Pillow. An append without a level takes 6 and is refused
    for the writer; another level given is named first."""
    root, add = _copy_with_a_delta(flat_tree, tmp_path)
    out = tmp_path / "out"
    assert _cli("--input", root, "--output", out, "--image_encoding", "png", "--png_level", 6,
                "--num_shards", 1)[0] == 0
    _as_an_earlier_version_wrote_it(out, "png_level", "png_writer")
    add()
    rc, err = _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1,
                   "--png_level", 1, "--append")
    assert rc == 2 and "png_level 1 differs from the dataset's 6" in err and "--append refused" in err, err
    for level in ((), ("--png_level", 6)):
        rc, err = _cli("--input", root, "--output", out, "--image_encoding", "png", "--num_shards", 1, *level,
                       "--append")
        assert rc == 2 and "written by 'pillow'" in err and err.strip().count("\n") == 0, err


@pytest.mark.slow
def test_resume_with_another_level_rewrites_every_shard(flat_tree, tmp_path):
    root, _ = flat_tree
    out = tmp_path / "out"
    staged = _kill_after_two_shards(out, tmp_path, "--input", root, "--image_encoding", "png")
    assert len(staged) == 2, staged
    code = _resume(out, "--input", root, "--image_encoding", "png", "--png_level", 9)
    assert code.returncode == 0, code.stderr
    assert "resumed: 0 of 4 shards reused" in code.stderr, code.stderr
    fresh = tmp_path / "fresh"
    build(root, fresh, "--num_shards", 4, "--image_encoding", "png", "--png_level", 9)
    assert _shard_bytes(out) == _shard_bytes(fresh)
