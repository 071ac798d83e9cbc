"""Inputs become records or deterministic errors.jsonl rows: symlinks, special files, oversize
files, root-level files and undecodable bytes, on real files made in tmp_path by the tests."""

import io
import json
import os
import socket
import subprocess
import sys
import threading

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from PIL import Image

from imagerecords.format import record_format
from imagerecords.pipeline import example_images
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline import refs
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.pipeline.read import input_files
from imagerecords.pipeline.write import stream as write_stream
from imagerecords.transforms import ReadImages, ReadManifest
from imagerecords.transforms.common import REJECTED

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


def write_image(path, index=0, fmt="JPEG"):
    """Writes a small real picture (example_images.draw) and returns its size in bytes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    Image.fromarray(example_images.draw("circle", index)).save(path, format=fmt)
    return os.path.getsize(path)


def row_tuple(r: Rejected):
    return (r.uri, r.key, r.stage, r.reason, r.error, r.skipped)


def check_listing(root, want_refs, want_rows, max_file_bytes=None):
    """Runs ReadImages on a real TestPipeline; asserts (key, uri, label, size) of every ref and
    (uri, key, stage, reason, error, skipped) of every row. Also run in a subprocess (JSON args)."""
    want_refs = [tuple(r) for r in want_refs]
    want_rows = [tuple(r) for r in want_rows]
    with TestPipeline() as p:
        listed = p | "List" >> ReadImages(root, max_file_bytes)
        assert_that(listed.refs | "Refs" >> beam.Map(lambda r: (r.key, r.uri, r.label, r.size)),
                    equal_to(want_refs), label="CheckRefs")
        assert_that(listed[REJECTED] | "Rows" >> beam.Map(row_tuple), equal_to(want_rows), label="CheckRows")


def run_in_subprocess(function, *args, timeout=180):
    """Runs test_inputs.<function>(*args) in a fresh Python; a hang fails the test after `timeout`
    seconds instead of hanging the suite (subprocess.run kills the child)."""
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_inputs as t; "
            "getattr(t, sys.argv[2])(*json.loads(sys.argv[3]))")
    proc = subprocess.run([sys.executable, "-c", code, TESTS_DIR, function, json.dumps(args)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]


def within(seconds, fn, *args):
    """Calls fn(*args) in a daemon thread; fails the test if it has not returned in `seconds`
    (a FIFO opened for reading blocks forever; a daemon thread does not keep pytest alive)."""
    result = {}

    def target():
        try:
            result["value"] = fn(*args)
        except BaseException as e:  # handed to the test thread below
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        pytest.fail(f"{getattr(fn, '__name__', fn)} did not return within {seconds}s (blocked on a FIFO?)")
    if "error" in result:
        raise result["error"]
    return result["value"]


# Symlinks ---------------------------------------------------------------------------------------


@pytest.fixture
def linked_tree(tmp_path):
    """in/cats: 2 images, a sub-folder with one image and a link back to cats, a linked file;
    in/dogs -> elsewhere/dogs_real (2 images, one nested)."""
    root = tmp_path / "in"
    other = tmp_path / "elsewhere"
    sizes = {
        "cats/a.jpg": write_image(str(root / "cats/a.jpg"), 1),
        "cats/b.png": write_image(str(root / "cats/b.png"), 2, "PNG"),
        "cats/sub/c.jpg": write_image(str(root / "cats/sub/c.jpg"), 3),
        "dogs/x.jpg": write_image(str(other / "dogs_real/x.jpg"), 4),
        "dogs/deep/y.jpg": write_image(str(other / "dogs_real/deep/y.jpg"), 5),
        "cats/linked.jpg": write_image(str(other / "single.jpg"), 6),
    }
    os.symlink(other / "dogs_real", root / "dogs")                 # symlinked class folder
    os.symlink("../../elsewhere/single.jpg", root / "cats/linked.jpg")  # symlinked file (relative)
    os.symlink("..", root / "cats/sub/loop")                         # back to cats: a loop
    (root / "cats/.hidden.jpg").write_bytes(b"not listed")
    return root, sizes


def test_symlinked_folder_and_file_are_listed_and_a_loop_is_one_row(linked_tree):
    root, sizes = linked_tree
    want_refs = [(k, f"{root}/{k}", k.split("/")[0], n) for k, n in sizes.items()]
    want_rows = [(f"{root}/cats/sub/loop", "cats/sub/loop", "list",
                  "symlink loop: 'cats/sub/loop' leads back to its ancestor folder 'cats'; not descended again", "", False)]
    check_listing(str(root), want_refs, want_rows)


def test_walk_finishes_on_loops_and_reports_each_once(tmp_path):
    root = tmp_path / "in"
    write_image(str(root / "cls/a.jpg"))
    os.symlink(".", root / "cls/self")             # a folder that is itself
    os.symlink(str(root), root / "cls/up")         # back to the input root
    os.symlink("ping", root / "cls/pong")          # two links that point at each other
    os.symlink("pong", root / "cls/ping")
    os.symlink(str(root / "cls"), root / "again")  # a second class folder, same files: copy semantics

    def walk():
        return [list(input_files.walk_class_folder(str(root), name)) for name in input_files.list_root(str(root))]

    again, cls = within(30, walk)
    refs_of = lambda items: sorted(i.key for i in items if isinstance(i, ImageRef))  # noqa: E731
    rows_of = lambda items: sorted((i.key, i.reason) for i in items if isinstance(i, Rejected))  # noqa: E731
    assert refs_of(cls) == ["cls/a.jpg"] and refs_of(again) == ["again/a.jpg"]
    loop_never_resolves = "symlink loop: the link never resolves to a file or folder"
    assert rows_of(cls) == [
        ("cls/ping", loop_never_resolves),
        ("cls/pong", loop_never_resolves),
        ("cls/self", "symlink loop: 'cls/self' leads back to its ancestor folder 'cls'; not descended again"),
        ("cls/up", "symlink loop: 'cls/up' leads back to the input root; not descended again"),
    ]
    assert all(i.stage == "list" for i in cls if isinstance(i, Rejected))


def test_a_second_link_to_a_walked_folder_is_reported_not_walked_again(tmp_path):
    root = tmp_path / "in"
    write_image(str(tmp_path / "shared/p.jpg"))
    (root / "cls").mkdir(parents=True)
    os.symlink(tmp_path / "shared", root / "cls/one")
    os.symlink(tmp_path / "shared", root / "cls/two")
    items = list(input_files.walk_class_folder(str(root), "cls"))
    assert [i.key for i in items if isinstance(i, ImageRef)] == ["cls/one/p.jpg"]
    assert [(i.key, i.reason) for i in items if isinstance(i, Rejected)] == [
        ("cls/two", "symlink to a folder already listed as 'cls/one'; not listed again")]


# Special files ----------------------------------------------------------------------------------


@pytest.fixture
def special_tree(tmp_path):
    """cls/ok.jpg plus a dangling symlink, a FIFO named x.jpg and a unix socket named s.jpg."""
    root = tmp_path / "in"
    size = write_image(str(root / "cls/ok.jpg"))
    os.symlink("gone.jpg", root / "cls/dangling.jpg")
    os.mkfifo(root / "cls/x.jpg")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # Bound by a relative name: a socket's path may hold 107 bytes, and pytest's (with CI's TMPDIR
    # and a worker's folder) can hold more. The socket file stays after close, as a stale one would.
    here = os.getcwd()
    os.chdir(root / "cls")
    try:
        sock.bind("s.jpg")
    finally:
        os.chdir(here)
        sock.close()
    return root, size


def special_rows(root):
    return [
        (f"{root}/cls/dangling.jpg", "cls/dangling.jpg", "list",
         "dangling symlink: its target 'gone.jpg' does not exist", "FileNotFoundError", False),
        (f"{root}/cls/s.jpg", "cls/s.jpg", "list", "not a regular file: a socket; it was not opened", "", False),
        (f"{root}/cls/x.jpg", "cls/x.jpg", "list", "not a regular file: a FIFO (named pipe); it was not opened", "", False),
    ]


@pytest.mark.slow
def test_dangling_symlink_fifo_and_socket_are_rows_and_listing_finishes(special_tree):
    root, size = special_tree
    # Pure walk in a thread, then the whole Beam listing in a subprocess: a FIFO opened by
    # mistake fails the test at the timeout instead of hanging it.
    items = within(30, lambda: list(input_files.walk_class_folder(str(root), "cls")))
    assert [(i.key, i.size) for i in items if isinstance(i, ImageRef)] == [("cls/ok.jpg", size)]
    assert sorted(row_tuple(i) for i in items if isinstance(i, Rejected)) == special_rows(root)
    run_in_subprocess("check_listing", str(root), [("cls/ok.jpg", f"{root}/cls/ok.jpg", "cls", size)],
                      special_rows(root), timeout=180)


def test_read_path_refuses_a_fifo_without_opening_it(special_tree):
    root, _ = special_tree
    fifo = f"{root}/cls/x.jpg"
    with pytest.raises(input_files.Refused, match=r"^not a regular file: a FIFO \(named pipe\); it was not opened$"):
        within(10, input_files.read_limited, fifo, 1000)
    ref = ImageRef("cls/x.jpg", fifo, "cls", "train", label_id=0)
    row = within(10, write_stream.encode_ref, ref, write_stream.limited_reader(codec.ImageOptions()), "tfds",
                 LabelMap(("cls",)), codec.ImageOptions())
    assert row == Rejected(fifo, "not a regular file: a FIFO (named pipe); it was not opened", "cls/x.jpg", "train",
                           stage="read", error="")


def test_unreadable_entries_are_rows_without_a_real_permission_error():
    # We run as root, so chmod/os.access cannot produce an unreadable file here for real: the
    # classifier is fed the errors through FileOps instead (no mocks of Beam or of the walk).
    def denied_stat(path):
        raise PermissionError(13, "Permission denied", path)

    found = input_files.probe("/r/cls/a.jpg", input_files.FileOps(stat=denied_stat))
    assert found == input_files.Probe("bad", reason="unreadable: permission denied (cannot stat)", error="PermissionError")

    regular = os.stat(__file__)
    no_read = input_files.FileOps(stat=lambda p: regular, access=lambda p, mode: False)
    assert input_files.probe("/r/cls/a.jpg", no_read).reason == "unreadable file: no read permission"

    def denied_listdir(path):
        if path == "/r":
            return ["cls"]
        raise PermissionError(13, "Permission denied", path)

    folders = {"/r": os.stat("/"), "/r/cls": os.stat(TESTS_DIR)}  # two real, distinct folder stats
    ops = input_files.FileOps(stat=folders.__getitem__, access=lambda p, mode: True, listdir=denied_listdir)
    assert list(input_files.walk_class_folder("/r", "cls", ops=ops)) == [
        Rejected("/r/cls", "unreadable folder: permission denied", "cls", stage="list", error="PermissionError")]


# Root-level files -------------------------------------------------------------------------------


def test_files_directly_under_the_root_are_skipped_rows(tmp_path):
    root = tmp_path / "in"
    size = write_image(str(root / "cls/a.jpg"))
    (root / "README.md").write_text("about this data\n")
    write_image(str(root / "stray.jpg"))
    (root / ".DS_Store").write_bytes(b"\0")
    reason = refs.ROOT_FILE_REASON
    check_listing(str(root), [("cls/a.jpg", f"{root}/cls/a.jpg", "cls", size)], [
        (f"{root}/README.md", "README.md", "list", reason, "", True),
        (f"{root}/stray.jpg", "stray.jpg", "list", reason, "", True),
    ])
    assert "not inside a class folder" in reason


# Oversize files ---------------------------------------------------------------------------------


def test_oversize_file_is_a_row_at_listing(tmp_path):
    root = tmp_path / "in"
    small = write_image(str(root / "cls/small.jpg"))
    with open(root / "cls/big.bin", "wb") as f:
        f.truncate(5_000_000)  # sparse: 5 MB of size, no disk
    reason = "file too large: 5000000 bytes is over the limit of 2000000 bytes (max_file_mb=2); it was not read"
    check_listing(str(root), [("cls/small.jpg", f"{root}/cls/small.jpg", "cls", small)],
                  [(f"{root}/cls/big.bin", "cls/big.bin", "read", reason, "", False)], max_file_bytes=2_000_000)


def test_oversize_file_in_a_manifest_is_a_row_at_listing(tmp_path):
    with open(tmp_path / "big.jpg", "wb") as f:
        f.truncate(3_000_000)
    (tmp_path / "m.csv").write_text("path,label\nbig.jpg,cls\n")
    with TestPipeline() as p:
        read = p | ReadManifest(str(tmp_path / "m.csv"), max_file_bytes=1_000_000, header="path,label")
        assert_that(read.refs, equal_to([]), label="NoRefs")
        assert_that(read[REJECTED] | beam.Map(lambda r: (r.key, r.stage, r.reason)), equal_to([
            ("big.jpg", "read", "file too large: 3000000 bytes is over the limit of 1000000 bytes (max_file_mb=1); "
                                "it was not read")]), label="Rows")


def test_read_path_refuses_oversize_files_without_reading_them_whole(tmp_path):
    # Local: a sparse 4 GB file is refused from its stat; reading it whole would take GBs of RAM.
    big = tmp_path / "huge.jpg"
    with open(big, "wb") as f:
        f.truncate(4_000_000_000)
    options = codec.ImageOptions(max_file_mb=1)
    ref = ImageRef("cls/huge.jpg", str(big), "cls", "train", label_id=0)
    row = within(10, write_stream.encode_ref, ref, write_stream.limited_reader(options), "tfds", LabelMap(("cls",)), options)
    assert (row.stage, row.error, row.reason) == (
        "read", "", "file too large: 4000000000 bytes is over the limit of 1000000 bytes (max_file_mb=1); it was not read")

    # Remote: at most max_bytes + 1 bytes are asked of the stream, then the file is refused.
    class CountingStream(io.BytesIO):
        asked = []

        def read(self, n=-1):
            CountingStream.asked.append(n)
            return super().read(n)

    with pytest.raises(input_files.Refused, match=r"over the limit of 1000 bytes .*reading stopped after 1001 bytes"):
        input_files.read_limited("gs://bucket/cls/big.jpg", 1000, open_uri=lambda uri: CountingStream(b"\xff" * 50_000))
    assert CountingStream.asked == [1001]
    assert input_files.read_limited("gs://b/x", 1000, open_uri=lambda uri: io.BytesIO(b"abc")) == b"abc"


class _Trickle(io.BytesIO):
    """A file whose reads return at most 3 bytes (short reads, as a signal or a network mount gives)."""

    def read(self, n=-1):
        return super().read(3 if n < 0 else min(n, 3))


def test_local_read_sizes_its_first_read_by_the_stat_and_keeps_every_byte(tmp_path):
    # Short reads: read on to EOF.
    assert input_files._read_whole(_Trickle(b"0123456789"), 10, 1000) == b"0123456789"
    # A file that grew after the stat: the new bytes are read too, up to the limit plus one.
    assert input_files._read_whole(io.BytesIO(b"x" * 5000), 100, None) == b"x" * 5000
    assert input_files._read_whole(io.BytesIO(b"x" * 5000), 100, 1000) == b"x" * 1001
    assert input_files._read_whole(_Trickle(b"x" * 50), 10, 20) == b"x" * 21
    assert input_files._read_whole(io.BytesIO(b""), 0, 1000) == b""
    # End to end: a real file is read whole, and a file at the limit is accepted.
    path = tmp_path / "a.jpg"
    path.write_bytes(b"y" * 1000)
    assert input_files.read_limited(str(path), 1000) == b"y" * 1000
    assert input_files.read_limited(str(path), None) == b"y" * 1000


def test_max_file_mb_is_validated():
    assert codec.ImageOptions().max_file_mb == 64.0 and codec.ImageOptions().max_file_bytes == 64_000_000
    for bad in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="max_file_mb"):
            codec.ImageOptions(max_file_mb=bad)
    with pytest.raises(ValueError, match="max_file_bytes"):
        ReadImages("/data", max_file_bytes=0)


# Deterministic reasons --------------------------------------------------------------------------


def undecodable_inputs(folder):
    """Writes the undecodable cases and returns their refs (label id 0)."""
    folder = str(folder)
    os.makedirs(f"{folder}/cls", exist_ok=True)
    noise = np.random.RandomState(0).bytes(3000)
    assert codec.sniff_format(noise) is None
    with open(f"{folder}/cls/noise.jpg", "wb") as f:
        f.write(noise)
    with open(f"{folder}/cls/jpeg_magic_then_noise.jpg", "wb") as f:
        f.write(b"\xff\xd8\xff" + noise)
    with open(f"{folder}/cls/text.png", "w") as f:
        f.write("this is a text file, not a PNG\n")
    # A truncated JPEG as example_images writes it (first half of a real JPEG).
    example_images.write_tree(f"{folder}/tree", per_class=1, broken=True)
    names = ["noise.jpg", "jpeg_magic_then_noise.jpg", "text.png"]
    out = [ImageRef(f"cls/{n}", f"{folder}/cls/{n}", "cls", "train", label_id=0) for n in names]
    out.append(ImageRef("circle/truncated.jpg", f"{folder}/tree/circle/truncated.jpg", "cls", "train", label_id=0))
    out.append(ImageRef("cls/missing.jpg", f"{folder}/cls/missing.jpg", "cls", "train", label_id=0))
    return out


def rejection_lines(folder):
    """The errors.jsonl lines of the undecodable inputs, through the shard writer's read path."""
    inputs = undecodable_inputs(folder)
    options = codec.ImageOptions()
    _, rejected = write_stream.write_shard(inputs, record_format.writer(io.BytesIO()), read_bytes=write_stream.limited_reader(options),
                                           preset="tfds", labels=LabelMap(("cls",)), options=options)
    return [r.to_json().replace(str(folder), "<in>") for r in rejected]


def print_rejection_lines(folder):
    print("\n".join(rejection_lines(folder)))


@pytest.mark.slow
def test_reasons_are_deterministic_and_name_the_exception(tmp_path):
    first = rejection_lines(tmp_path / "a")
    rows = [json.loads(line) for line in first]
    assert [(r["key"], r["stage"], r["error"], r["reason"]) for r in rows] == [
        ("cls/noise.jpg", "decode", "ImageError", "not a supported image: unrecognized file signature"),
        ("cls/jpeg_magic_then_noise.jpg", "decode", "UnidentifiedImageError",
         "not a decodable image (format unknown): the bytes start like JPEG but no decoder accepts them"),
        ("cls/text.png", "decode", "ImageError", "not a supported image: unrecognized file signature"),
        ("circle/truncated.jpg", "decode", "OSError", rows[3]["reason"]),
        ("cls/missing.jpg", "read", "FileNotFoundError", "cannot read file: No such file or directory"),
    ]
    assert rows[3]["reason"].startswith("truncated JPEG: ")
    for line in first:
        assert "0x" not in line and "object at" not in line, line
        assert sorted(json.loads(line)) == ["error", "key", "reason", "skipped", "split", "stage", "uri"]
    # A second run over a fresh copy in the same process, and one in another process (other
    # object addresses): byte-identical lines.
    assert rejection_lines(tmp_path / "b") == first
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import test_inputs as t; "
            "t.print_rejection_lines(sys.argv[2])")
    proc = subprocess.run([sys.executable, "-c", code, TESTS_DIR, str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == first


# Labels that cannot be class names --------------------------------------------------------------


def test_control_character_and_list_labels_in_a_jsonl_manifest_are_rows(tmp_path):
    """A newline in a label would shift label.labels.txt (line number = id); such rows are rejected."""
    from conftest import build

    good = {f"{cls}/{i}.jpg": cls for cls in ("cat", "dog") for i in range(2)}
    bad = {"nl.jpg": "cat\ndog", "tab.jpg": "a\tb", "list.jpg": ["cat", "dog"]}
    man = tmp_path / "m.jsonl"
    with open(man, "w") as f:
        for i, (rel, label) in enumerate({**good, **bad}.items()):
            write_image(str(tmp_path / "img" / rel), i)
            f.write(json.dumps({"path": f"img/{rel}", "label": label, "key": rel}) + "\n")
    out = tmp_path / "out"
    manifest = build(man, out, "--num_shards", 1, "--max_reject_fraction", 0.5)
    assert list(manifest.label_names) == ["cat", "dog"] and manifest.num_examples == 4
    assert manifest.num_rejected == 3
    assert (out / "label.labels.txt").read_text() == "cat\ndog\n"
    rows = {r["key"]: r for r in map(json.loads, (out / "errors.jsonl").read_text().splitlines())}
    assert sorted(rows) == sorted(bad) and {r["stage"] for r in rows.values()} == {"label"}
    assert rows["nl.jpg"]["reason"].startswith("label 'cat\\ndog' holds control character U+000A: class names go "
                                               "one per line into label.labels.txt")
    assert rows["tab.jpg"]["reason"].startswith("label 'a\\tb' holds control character U+0009")
    assert rows["list.jpg"]["reason"].startswith('label ["cat", "dog"] is a list, not a class label: give one class '
                                                 'name in \'label\'; for several classes per image')
    assert rows["nl.jpg"]["uri"] == "img/nl.jpg"


def test_a_class_folder_with_a_newline_in_its_name_is_rows(tmp_path):
    from conftest import build

    root = tmp_path / "in"
    sizes = {rel: write_image(str(root / rel), i) for i, rel in enumerate(["ok/a.jpg", "ok/b.jpg", "two\nlines/c.jpg"])}
    reason = ("class folder name 'two\\nlines' holds control character U+000A: class names go one per line into "
              "label.labels.txt, which it would break or shift; rename the class")
    check_listing(str(root), [("ok/a.jpg", f"{root}/ok/a.jpg", "ok", sizes["ok/a.jpg"]),
                              ("ok/b.jpg", f"{root}/ok/b.jpg", "ok", sizes["ok/b.jpg"])],
                  [(f"{root}/two\nlines/c.jpg", "two\nlines/c.jpg", "label", reason, "", False)])
    out = tmp_path / "out"
    manifest = build(root, out, "--num_shards", 1, "--max_reject_fraction", 0.5)
    assert list(manifest.label_names) == ["ok"] and manifest.num_examples == 2 and manifest.num_rejected == 1
    assert (out / "label.labels.txt").read_text() == "ok\n"
    (row,) = map(json.loads, (out / "errors.jsonl").read_text().splitlines())
    assert (row["key"], row["stage"], row["reason"]) == ("two\nlines/c.jpg", "label", reason)


@pytest.mark.slow
def test_float_tiffs_of_values_0_to_1_are_rejected_rows_not_clipped_images(tmp_path):
    """Mode-F TIFFs holding 0..1 (what scientific and normalised images hold) became JPEGs of 0 and 1
    out of 255 with 'rejected 0'. Now each is a row naming the value range, counted against the
    budget; 8-bit images beside them are written as usual."""
    from conftest import build
    from imagerecords.pipeline.errors import BudgetExceeded

    root = tmp_path / "tree"
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.random((16, 16), dtype=np.float32), "F").save(root / label / f"f{i}.tif")
            write_image(root / label / f"ok{i}.jpg", i)
    with pytest.raises(BudgetExceeded, match="6 of 12 inputs rejected"):
        build(root, tmp_path / "strict")
    manifest = build(root, tmp_path / "out", "--max_reject_fraction", "0.5")
    assert manifest.num_examples == 6 and manifest.num_rejected == 6
    rows = [json.loads(line) for line in open(tmp_path / "out" / "errors.jsonl")]
    assert sorted(r["key"] for r in rows) == [f"{c}/f{i}.tif" for c in "ab" for i in range(3)]
    assert all(r["reason"].startswith("a floating-point image (values 0.") and "scale it to 8 or 16 bits first"
               in r["reason"] for r in rows), rows[0]["reason"]
