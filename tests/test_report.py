"""`imagerecords report`: the page is self-contained, every image decodes, and its numbers are the dataset's.

The dataset is a real build of the `image_tree` fixture (4 classes x 10 generated images, one
truncated JPEG). The page is parsed with the stdlib's html.parser; the expected values come from
the manifest and from reading the shards with TensorFlow (its own framing and Example
proto), independently of the report's own reader (schema.parse_example, tested in test_schema.py).
"""

import base64
import collections
import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from html.parser import HTMLParser

import pytest
from PIL import Image, ImageStat

from conftest import build, shard_files, tree_with_twins
from imagerecords.cli import report
from imagerecords.cli.report.markup import BAR_WIDTH
from imagerecords.cli.report.sample import label_counts
from imagerecords.format import schema
from imagerecords.format.manifest import Manifest
from imagerecords.cli import inspection
from imagerecords.cli import main as cli

PER_CLASS = 3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_report(folder, html_path, **kwargs):
    """report.write_report with the manifest loader the command line passes it."""
    return report.write_report(str(folder), str(html_path), load_manifest=inspection.load_for_report, **kwargs)


class Page(HTMLParser):
    """What the tests read back from a report: images, links, bars, tables and data attributes."""

    def __init__(self, text):
        super().__init__(convert_charrefs=True)
        self.imgs = []          # attrs of every <img>, with the enclosing section's data-class
        self.urls = []          # every src and href value
        self.bars = []          # (attrs of a <g data-value> plus its rect's rect-width, its value <text>)
        self.rows = collections.defaultdict(list)  # table class/id -> [[cell text]]
        self.data = []          # attrs of every element with a data-* attribute
        self.tags = collections.Counter()
        self.layers = []        # attrs of every <img class=layer>, with the figure's main <img> attrs as "of"
        self.boxes = []         # (attrs of an <svg class=boxes>, [attrs of its rects], the figure's main <img> attrs)
        self._img = None
        self._svg = None
        self._section = None
        self._bar = None
        self._in_value = False
        self._table = None
        self._row = None
        self._cell = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] += 1
        if any(k.startswith("data-") for k in a):
            self.data.append(a)
        for key in ("src", "href"):
            if key in a:
                self.urls.append(a[key])
        if tag == "section":
            self._section = a.get("data-class")
        elif tag == "img" and a.get("class") == "layer":
            self.layers.append(dict(a, of=self._img))
        elif tag == "img":
            self._img = dict(a, section=self._section)
            self.imgs.append(self._img)
        elif tag == "svg" and a.get("class") == "boxes":
            self._svg = (a, [], self._img)
        elif tag == "rect" and self._svg is not None:
            self._svg[1].append(a)
        elif tag == "g" and "data-value" in a:
            self._bar = [dict(a), ""]
        elif tag == "rect" and self._bar is not None:
            self._bar[0]["rect-width"] = int(a["width"])
        elif tag == "text" and self._bar is not None and a.get("class") == "value":
            self._in_value = True
        elif tag == "table":
            self._table = a.get("class") or a.get("id")
            if a.get("data-kind"):
                self._table += ":" + a["data-kind"]
        elif tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append(" | ")

    def handle_endtag(self, tag):
        if tag == "svg" and self._svg is not None:
            self.boxes.append(self._svg)
            self._svg = None
        elif tag == "section":
            self._section = None
        elif tag == "g" and self._bar is not None:
            self.bars.append(tuple(self._bar))
            self._bar = None
        elif tag == "text":
            self._in_value = False
        elif tag in ("td", "th") and self._cell is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows[self._table].append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._in_value:
            self._bar[1] += data
        if self._cell is not None:
            self._cell.append(data)

    def one(self, attr, value=None):
        """The data attributes of the one element carrying `attr` (equal to `value` if given)."""
        found = [a for a in self.data if attr in a and (value is None or a[attr] == value)]
        assert len(found) == 1, (attr, value, found)
        return found[0]


def _blocked_python(code):
    """Runs `code` in a fresh interpreter where TensorFlow and Beam cannot be imported."""
    prelude = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("tensorflow", "apache_beam"):
                    raise ImportError(name + " is blocked in this test")
        sys.meta_path.insert(0, Block())
    """)
    return prelude + textwrap.dedent(code)


@pytest.fixture(scope="module")
def dataset(image_tree, tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    build(image_tree[0], out, "--splits", "train=0.75,validation=0.25", "--max_reject_fraction", "0.1")
    with open(out / "manifest.json", "rb") as f:
        return out, Manifest.loads(f.read())


@pytest.fixture(scope="module")
def records_by_split(dataset):
    """{split: [(shard file, filename, label, height, width, image bytes)]} in shard order, read with
    TensorFlow's TFRecordDataset and Example proto (not the report's wire-format reader). The
    `tfrecord` package is not used in-process: its Example proto clashes with TensorFlow's."""
    import tensorflow as tf

    out, manifest = dataset
    keys = schema.keys(manifest.schema)
    found = {}
    for split in manifest.splits:
        rows = found[split.name] = []
        for shard in split.shards:
            for raw in tf.data.TFRecordDataset(str(out / shard.filename)):
                f = tf.train.Example.FromString(raw.numpy()).features.feature
                rows.append((shard.filename, f[keys.filename].bytes_list.value[0].decode(),
                             f[keys.label].int64_list.value[0], f[keys.height].int64_list.value[0],
                             f[keys.width].int64_list.value[0], f[keys.image].bytes_list.value[0]))
    return found


@pytest.fixture(scope="module")
def run(dataset, tmp_path_factory):
    """The command as a user runs it, without --html, in a fresh interpreter that cannot import
    TensorFlow or Beam; returns (completed process, the folder it ran in, dataset listing before)."""
    out, _ = dataset
    cwd = tmp_path_factory.mktemp("cwd")
    before = sorted(os.listdir(out))
    code = _blocked_python(f"""
        from imagerecords.cli import main as cli
        rc = cli.main(["report", {str(out)!r}, "--per_class", "{PER_CLASS}"])
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tensorflow", "apache_beam")))
        sys.exit(rc)
    """)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)
    return proc, cwd, before


def _written(cwd):
    """The one default-named page in `cwd`."""
    (found,) = cwd.glob("images-????????-report.html")
    return found


@pytest.fixture(scope="module")
def page(run):
    proc, cwd, _ = run
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(_written(cwd), encoding="utf-8") as f:
        text = f.read()
    return text, Page(text)


@pytest.mark.slow
def test_runs_without_tensorflow_or_beam_and_leaves_the_dataset_alone(run, dataset):
    proc, cwd, before = run
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[-1] == "[]"  # neither was imported (the import hook would have refused them anyway)
    assert lines[0] == f"imagerecords report: wrote {_written(cwd).name}"
    assert os.listdir(cwd) == [_written(cwd).name]  # the default: ./<name>-<8 hex of the dataset's path>-report.html
    assert sorted(os.listdir(dataset[0])) == before


def test_every_embedded_image_decodes_at_thumbnail_size(page):
    _, p = page
    assert len(p.imgs) == 4 * PER_CLASS
    for img in p.imgs:
        head, _, payload = img["src"].partition(",")
        assert head == "data:image/jpeg;base64"
        with Image.open(io.BytesIO(base64.b64decode(payload, validate=True))) as im:
            im.load()
            assert im.format == "JPEG"
            assert im.size == (int(img["width"]), int(img["height"]))
            stored = (int(img["data-width"]), int(img["data-height"]))
            if max(stored) <= report.THUMB_SIDE:
                assert im.size == stored  # small images are not enlarged
            else:
                assert max(im.size) == report.THUMB_SIDE


def test_each_class_shows_its_first_records_in_shard_order(page, dataset, records_by_split):
    _, p = page
    _, manifest = dataset
    train = records_by_split["train"]
    by_name = {row[1]: row for row in train}
    for label, name in enumerate(manifest.label_names):
        want = [row[1] for row in train if row[2] == label][:PER_CLASS]
        shown = [img for img in p.imgs if img["section"] == name]
        assert [img["alt"] for img in shown] == want
        assert all(img["data-class"] == name for img in shown)
        for img in shown:
            # The thumbnail is that record's image: compare mean colours with the full decode.
            record = by_name[img["alt"]]
            with Image.open(io.BytesIO(record[5])) as full:
                full_mean = ImageStat.Stat(full.convert("RGB")).mean
            with Image.open(io.BytesIO(base64.b64decode(img["src"].partition(",")[2]))) as thumb:
                thumb_mean = ImageStat.Stat(thumb.convert("RGB")).mean
            assert max(abs(a - b) for a, b in zip(full_mean, thumb_mean)) < 8, img["alt"]
            assert (int(img["data-height"]), int(img["data-width"])) == record[3:5]


def test_label_histograms_match_the_manifest(page, dataset):
    _, p = page
    _, manifest = dataset
    for split in manifest.splits:
        want = collections.Counter()
        for shard in split.shards:
            want.update(dict(shard.labels))
        got = {int(a["data-label"]): (int(a["data-value"]), text) for a, text in p.bars
               if a.get("data-split") == split.name and "data-label" in a}
        assert got == {label: (want[label], str(want[label])) for label in range(len(manifest.label_names))}
        assert sum(v for v, _ in got.values()) == split.num_examples


def test_splits_and_totals_match_the_manifest(page, dataset):
    _, p = page
    _, manifest = dataset
    rows = {r[0]: r[1:3] for r in p.rows["split-table"][1:]}
    assert rows == {**{s.name: [str(s.num_examples), str(len(s.shards))] for s in manifest.splits},
                    "all": [str(manifest.num_examples), str(sum(len(s.shards) for s in manifest.splits))]}
    assert manifest.num_rejected == 1
    assert p.one("data-total", "rejected") and p.one("data-total", "skipped")
    text = page[0]
    assert f'<b data-total="rejected">{manifest.num_rejected}</b>' in text
    assert f'<b data-total="skipped">{manifest.num_skipped}</b>' in text


def test_size_histograms_count_the_records_read(page, dataset, records_by_split):
    _, p = page
    train = records_by_split["train"]
    assert int(p.one("data-sample")["data-sample"]) == len(train)  # the default sample covers this split
    values = {"height": [r[3] for r in train], "width": [r[4] for r in train], "bytes": [len(r[5]) for r in train]}
    for name, vals in values.items():
        bins = [(int(a["data-low"]), int(a["data-high"]), int(a["data-value"])) for a, _ in p.bars
                if a.get("data-hist") == name]
        assert bins, name
        assert sum(n for _, _, n in bins) == len(vals)
        for low, high, n in bins:
            assert n == sum(low <= v <= high for v in vals), (name, low, high)
    common = {r[0]: int(r[1]) for r in p.rows["common-sizes"][1:]}
    assert common == {f"{h} × {w}": n for (h, w), n in collections.Counter((r[3], r[4]) for r in train).items()
                      if n > 1}
    assert common  # the fixture's images share one size


def test_shard_sizes_match_the_manifest_and_the_files(page, dataset):
    _, p = page
    out, manifest = dataset
    got = {(a["data-split"], int(a["data-shard"])): (int(a["data-value"]), int(a["data-count"]))
           for a, _ in p.bars if "data-shard" in a}
    want = {(s.name, sh.index): (sh.num_bytes, sh.count) for s in manifest.splits for sh in s.shards}
    assert got == want
    assert sorted(os.path.getsize(f) for f in shard_files(out)) == sorted(v for v, _ in want.values())


def test_rejected_section_lists_the_truncated_jpeg_with_its_reason(page, dataset):
    _, p = page
    out, _ = dataset
    with open(out / "errors.jsonl") as f:
        row = [json.loads(line) for line in f if "truncated.jpg" in line][0]
    rows = p.rows["reasons:rejected"]
    assert rows[0] == ["stage", "reason", "count", "examples (key · split · reason)"]
    assert rows[1][:3] == ["decode", row["reason"], "1"]
    assert row["reason"].startswith("truncated JPEG")
    assert rows[1][3] == f"circle/truncated.jpg · {row['split']} · {row['reason']}"
    assert len(rows) == 2


def test_page_is_self_contained(page):
    text, p = page
    assert p.urls and all(u.startswith(("data:image/jpeg;base64,", "#")) for u in p.urls)
    assert "http://" not in text and "https://" not in text
    assert p.tags["script"] == 0 and p.tags["link"] == 0 and p.tags["iframe"] == 0
    assert p.tags["svg"] >= 4


def test_duplicates_absent_then_shown(page, dataset, tmp_path):
    _, p = page
    assert p.one("data-duplicates")["data-duplicates"] == "0"  # the build looked and found none
    copy = tmp_path / "copy"
    shutil.copytree(dataset[0], copy)
    rows = [
        {"content": "a" * 64, "members": [{"key": "square/x.jpg", "split": "train", "uri": "/x"},
                                          {"key": "square/y.jpg", "split": "train", "uri": "/y"}]},
        {"content": "b" * 64, "members": [{"key": "circle/leak.jpg", "split": "train", "uri": "/l"},
                                          {"key": "circle/leak2.jpg", "split": "validation", "uri": "/m"}]},
    ]
    (copy / report.DUPLICATES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = write_report(copy, tmp_path / "r.html", per_class=1)
    q = Page(open(path, encoding="utf-8").read())
    assert q.one("data-duplicates") == {"data-duplicates": "2", "data-leaks": "1"}
    table = q.rows["dups"]
    assert len(table) == 3
    assert table[1][1:] == ["2", "circle/leak.jpg · train | circle/leak2.jpg · validation"]  # leakage first
    assert q.one("data-leak")
    assert table[2][1:] == ["2", "square/x.jpg · train | square/y.jpg · train"]


def test_no_duplicates_is_one_line_not_an_empty_table(page, dataset):
    text, p = page
    assert (dataset[0] / report.DUPLICATES).read_bytes() == b""  # the build looked and found none
    assert p.one("data-duplicates") == {"data-duplicates": "0", "data-leaks": "0"}
    assert "dups" not in p.rows  # no table, not even its header row
    assert "No duplicate content" in text


def test_label_bars_of_every_split_share_one_scale(page, dataset):
    _, p = page
    _, manifest = dataset
    counts = {sp.name: label_counts(sp) for sp in manifest.splits}
    top = max(n for c in counts.values() for n in c.values())
    bars = [(a["data-split"], int(a["data-value"]), a["rect-width"]) for a, _ in p.bars if "data-label" in a]
    assert {split for split, _, _ in bars} == {"train", "validation"}
    for split, value, width in bars:
        assert width == (max(1, round(BAR_WIDTH * value / top)) if value else 2), (split, value)
    assert int(p.one("data-label-scale")["data-label-scale"]) == top  # the page says what a full bar is
    widest = {split: max(w for sp, _, w in bars if sp == split) for split in counts}
    smaller = min(counts, key=lambda sp: max(counts[sp].values()))
    assert max(counts[smaller].values()) < top and widest[smaller] < BAR_WIDTH  # not stretched to its own maximum


def _sized_tree(root, sizes):
    """JPEGs of the given (width, height) under two classes, written with Pillow."""
    for i, size in enumerate(sizes):
        folder = root / ("ab"[i % 2])
        folder.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", size, (30 * i % 256, 120, 200)).save(folder / f"{i:02d}.jpg", quality=90)
    return root


def test_sizes_that_all_differ_are_one_line_with_their_range(tmp_path):
    sizes = [(30 + 5 * i, 20 + 3 * i) for i in range(6)]  # (width, height), no two alike
    build(_sized_tree(tmp_path / "tree", sizes), tmp_path / "out")
    q = Page(open(write_report(tmp_path / "out", tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    assert "common-sizes" not in q.rows  # not a table of six 1s
    assert q.one("data-sizes-differ") == {"data-sizes-differ": "6"}
    text = open(tmp_path / "r.html", encoding="utf-8").read()
    assert "All 6 sizes differ: height 20–35 px, width 30–55 px" in text
    heights = sorted(int(a["data-low"]) for a, _ in q.bars if a.get("data-hist") == "height" and a["data-value"] != "0")
    assert heights == sorted(h for _, h in sizes)


def test_common_sizes_list_only_shared_sizes(tmp_path):
    sizes = [(48, 40)] * 4 + [(30, 20), (31, 21)]
    build(_sized_tree(tmp_path / "tree", sizes), tmp_path / "out")
    q = Page(open(write_report(tmp_path / "out", tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    assert q.rows["common-sizes"] == [["height × width", "records"], ["40 × 48", "4"]]
    assert q.one("data-sizes-once") == {"data-sizes-once": "2"}
    assert not any("data-sizes-differ" in a for a in q.data)


def test_build_settings_list_each_field_once(page, dataset, tmp_path):
    _, p = page
    names = [row[0] for row in p.rows["parameters"][1:]]
    assert [n for n, c in collections.Counter(names).items() if c > 1] == []
    assert dict(p.rows["parameters"][1:])["label_offset"] == "0"
    assert "parameters.label_offset" not in names
    # A build setting that disagrees with the top-level field is shown, under its full name.
    copy = tmp_path / "copy"
    shutil.copytree(dataset[0], copy)
    doc = json.loads((copy / "manifest.json").read_text())
    assert doc["parameters"]["label_offset"] == doc["label_offset"] == 0
    doc["parameters"]["label_offset"] = 1
    (copy / "manifest.json").write_text(json.dumps(doc))
    q = Page(open(write_report(copy, tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    rows = dict(q.rows["parameters"][1:])
    assert (rows["label_offset"], rows["parameters.label_offset"]) == ("0", "1")


def test_declared_features_are_listed(page, dataset, tmp_path, capsys):
    _, p = page
    assert p.one("data-features") == {"data-features": "absent"} and "features" not in p.rows
    copy = tmp_path / "copy"
    shutil.copytree(dataset[0], copy)
    doc = json.loads((copy / "manifest.json").read_text())
    doc["features"] = {"bbox": {"dtype": "float32", "shape": [None, 4]}, "caption": {"dtype": "string"},
                       "depth": {"dtype": "image", "channels": 1}, "score": {"dtype": "float32", "shape": []},
                       "odd": "int64", "weird": {"dtype": "complex64", "shape": [2]}}
    (copy / "manifest.json").write_text(json.dumps(doc))
    q = Page(open(write_report(copy, tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    assert q.one("data-features") == {"data-features": "6"}
    assert q.rows["features"] == [["name", "dtype", "shape", "encoding"],
                                  ["bbox", "float32", "[null, 4]", "bytes"], ["caption", "string", "—", "—"],
                                  ["depth", "image", "—", "png"], ["odd", "—", "—", "—"],
                                  ["score", "float32", "[]", "list"],  # encodings as the build applies them
                                  ["weird", "complex64", "[2]", "—"]]
    problems = {a["data-feature-problem"] for a in q.data if "data-feature-problem" in a}
    assert problems == {"odd", "weird"}
    text = open(tmp_path / "r.html", encoding="utf-8").read()
    assert "feature &#x27;weird&#x27;: dtype &#x27;complex64&#x27; is not one of" in text
    assert q.rows["split-table"] == p.rows["split-table"]  # the rest of the page reads as before
    doc["features"] = ["image", "label"]  # the typed manifest refuses it: one line, no page
    (copy / "manifest.json").write_text(json.dumps(doc))
    os.unlink(tmp_path / "r.html")
    assert cli.main(["report", str(copy), "--html", str(tmp_path / "r.html")]) == 3
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "manifest.json: malformed" in err[0], err
    assert not os.path.exists(tmp_path / "r.html")


@pytest.mark.slow
def test_label_conflicts_section_lists_the_same_image_under_two_classes(image_tree, page, tmp_path):
    _, p = page
    assert p.one("data-conflicts")["data-conflicts"] == "0" and not p.rows["conflicts"]
    tree, circle = tree_with_twins(image_tree, tmp_path)
    out = tmp_path / "out"
    manifest = build(tree, out, "--max_reject_fraction", "0.1")
    assert (manifest.num_duplicate_groups, manifest.num_label_conflicts) == (2, 1)
    q = Page(open(write_report(out, tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    assert q.one("data-conflicts") == {"data-conflicts": "1"}
    assert q.one("data-duplicates")["data-duplicates"] == "2"
    with open(out / report.DUPLICATES) as f:
        content = [row for row in map(json.loads, f) if row["conflict"]][0]["content"]
    assert q.one("data-conflict") == {"data-conflict": content}
    assert q.rows["conflicts"][1:] == [
        [content[:16], "circle, square", "2", f"circle/{circle} · circle · train | square/copy_of_a_circle.jpg · square · train"]]
    assert "#conflicts" in q.urls and "manifest.json counts" not in open(tmp_path / "r.html").read()


def test_label_conflicts_of_an_older_duplicates_file_are_unknown_not_zero(dataset, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(dataset[0], copy)
    old = {"content": "a" * 32, "members": [{"key": "square/x.jpg", "split": "train", "uri": "/x"},
                                            {"key": "circle/x.jpg", "split": "train", "uri": "/x"}]}
    (copy / report.DUPLICATES).write_text(json.dumps(old) + "\n")
    q = Page(open(write_report(copy, tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    assert q.one("data-conflicts") == {"data-conflicts": "unknown"}
    (copy / report.DUPLICATES).unlink()
    q = Page(open(write_report(copy, tmp_path / "r.html", per_class=1), encoding="utf-8").read())
    assert q.one("data-conflicts") == {"data-conflicts": "absent"}


def test_reads_only_the_shards_it_needs_and_is_deterministic(dataset, tmp_path):
    out, manifest = dataset
    a = write_report(out, tmp_path / "a.html", per_class=1, sample=0)
    b = write_report(out, tmp_path / "b.html", per_class=1, sample=0)
    text = open(a, encoding="utf-8").read()
    assert text == open(b, encoding="utf-8").read()
    p = Page(text)
    info = p.one("data-shards-read")
    assert int(info["data-shards-total"]) == len(manifest.split("train").shards)
    assert int(info["data-shards-read"]) < int(info["data-shards-total"])
    assert int(info["data-records-read"]) < manifest.split("train").num_examples
    assert sorted(img["section"] for img in p.imgs) == sorted(manifest.label_names)


def test_command_errors_are_one_line(dataset, tmp_path, capsys):
    out, _ = dataset
    assert cli.main(["report", str(tmp_path / "nothing")]) == 3
    assert cli.main(["report", str(out), "--split", "test", "--html", str(tmp_path / "r.html")]) == 3
    assert cli.main(["report", str(out), "--html", str(tmp_path / "no" / "r.html")]) == 2
    assert cli.main(["report", str(out), "--per_class", "-1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 4 and all(line.startswith("imagerecords report: error: ") for line in err), err
    assert "no published imagerecords dataset" in err[0]
    assert "no split 'test'" in err[1]
    assert not os.listdir(tmp_path)


def test_thumbnail_fits_the_box_keeping_the_aspect_ratio():
    big = io.BytesIO()
    Image.new("RGB", (300, 200), (200, 30, 30)).save(big, format="JPEG")
    uri, size = report.thumbnail(big.getvalue())
    assert size == (96, 64)
    with Image.open(io.BytesIO(base64.b64decode(uri.partition(",")[2]))) as im:
        assert im.size == (96, 64) and max(abs(a - b) for a, b in zip(ImageStat.Stat(im).mean, (200, 30, 30))) < 6


@pytest.mark.slow
@pytest.mark.needs_extra("chromium")  # without it, the page is still checked by parsing it and decoding every image
def test_renders_in_headless_chromium(page, run, tmp_path):
    browser = shutil.which("chromium")
    html_path = _written(run[1])
    png = tmp_path / "page.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    "--window-size=1200,2400", f"--screenshot={png}", html_path.as_uri()],
                   capture_output=True, timeout=120, check=True)
    with Image.open(png) as im:
        im.load()
        assert im.size == (1200, 2400)
        colours = im.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200  # text, bars and photos, not a blank page


# Declared features on the page -------------------------------------------------------------------
# A detection-style JSONL manifest (made here with a seeded numpy generator): boxes as fractions and
# as pixels, a class list, a float score, a caption, a palette mask of class ids and a 16-bit depth map.

FEATURES_CONFIG = """features:
  boxes:   {dtype: float32, shape: [null, 4]}
  bbox_px: {dtype: float32, shape: [null, 4]}
  tags:    {dtype: class_list}
  score:   {dtype: float32}
  caption: {dtype: string}
  mask:    {dtype: image, encoding: png}
  depth:   {dtype: image, encoding: keep, bits: 16}
"""


@pytest.fixture(scope="module")
def detection(tmp_path_factory):
    import numpy as np

    folder = tmp_path_factory.mktemp("detection")
    rng = np.random.default_rng(5)
    rows = []
    for i in range(12):
        h, w = 40, 50 + i  # under THUMB_SIDE: thumbnails keep every pixel
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        mask = Image.fromarray(rng.integers(0, 6, (h, w), dtype=np.uint8), "P")
        mask.putpalette([c for k in range(6) for c in (40 * k, 255 - 40 * k, 7 * k)])
        mask.save(folder / f"mask{i}.png")
        Image.fromarray(rng.integers(0, 65535, (h, w), dtype=np.uint16)).save(folder / f"depth{i}.png")
        k = i % 4
        rows.append({"path": f"img{i}.png", "label": ["cat", "dog"][i % 2],
                     "boxes": [[0.1 * j, 0.2, 0.1 * j + 0.5, 0.75] for j in range(k)],
                     "bbox_px": [[2.0, 4.0 + j, 30.0, 40.0] for j in range(k + 1)],
                     "tags": ["sky", "tree", "car", "zebra"][:k][::-1], "score": (i * 7 % 12) / 11,
                     "caption": f"picture {i % 9}, naïve <b>", "mask": f"mask{i}.png", "depth": f"depth{i}.png"})
    with open(folder / "m.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    (folder / "f.yaml").write_text(FEATURES_CONFIG)
    out = folder / "out"
    build(folder / "m.jsonl", out, "--config", folder / "f.yaml", "--num_shards", 3)
    text = open(write_report(out, folder / "r.html", per_class=6), encoding="utf-8").read()
    return folder, {r["path"]: r for r in rows}, text, Page(text)


def _picture(src):
    import numpy as np

    head, _, payload = src.partition(",")
    assert head == "data:image/png;base64", head
    with Image.open(io.BytesIO(base64.b64decode(payload))) as im:
        return np.asarray(im.convert("RGB"))


@pytest.mark.slow
def test_feature_values_count_the_records_read(detection):
    _, rows, _, p = detection
    assert p.one("data-sample")["data-sample"] == "12"
    score = [(b["data-low"], b["data-high"], int(b["data-value"])) for b, _ in p.bars if b.get("data-hist") == "feature-score"]
    assert sum(n for _, _, n in score) == 12 and len(score) == 20
    assert (score[0][0], score[-1][1]) == ("0", "1")  # min and max of i * 7 % 12 / 11
    assert score[0][2] == 1 and score[-1][2] == 1  # one record at 0, one at 1
    tags = {b["data-class"]: int(b["data-value"]) for b, _ in p.bars if b.get("data-feature") == "tags"}
    assert tags == dict(collections.Counter(t for r in rows.values() for t in r["tags"]))
    assert tags == {"car": 3, "sky": 9, "tree": 6}
    assert p.one("data-occurrences")["data-occurrences"] == "18"
    assert p.one("data-distinct") == {"data-distinct": "9"}  # "picture 0".."picture 8"
    text = detection[2]
    items = text.split('data-strings="caption">')[1].split("</ul>")[0]
    assert items.count("<li>") == 5 and "naïve &lt;b&gt;" in items  # escaped, not markup
    assert not any("data-missing" in a or "data-undecodable" in a for a in p.data)
    conventions = {a["data-convention"] for a in p.data if "data-convention" in a}
    assert conventions == {"normalized", "pixels"}
    assert "#values" in p.urls and [row[0] for row in p.rows["features"][1:]] == [
        "bbox_px", "boxes", "caption", "depth", "mask", "score", "tags"]


def test_boxes_are_drawn_on_their_thumbnails(detection):
    _, rows, _, p = detection
    assert len(p.imgs) == 12  # 6 per class, every record
    drawn = collections.defaultdict(dict)
    for svg, rects, img in p.boxes:
        drawn[img["alt"]][svg["data-boxes"]] = (svg, rects, img)
    assert len(drawn) == 12
    for name, by_feature in drawn.items():
        row = rows[name]
        svg, rects, img = by_feature["boxes"]
        tw, th = int(img["width"]), int(img["height"])
        assert (svg["width"], svg["height"]) == (img["width"], img["height"])
        assert int(svg["data-count"]) == len(rects) == len(row["boxes"])
        for rect, (ymin, xmin, ymax, xmax) in zip(rects, row["boxes"]):  # fractions of the thumbnail
            assert float(rect["x"]) == pytest.approx(xmin * tw, abs=0.06)
            assert float(rect["y"]) == pytest.approx(ymin * th, abs=0.06)
            assert float(rect["width"]) == pytest.approx((xmax - xmin) * tw, abs=0.11)
        svg, rects, img = by_feature["bbox_px"]
        assert len(rects) == len(row["bbox_px"]) and int(img["data-width"]) == tw  # kept at its size
        for rect, (ymin, xmin, ymax, xmax) in zip(rects, row["bbox_px"]):  # pixels of the stored image
            assert (float(rect["x"]), float(rect["y"]), float(rect["height"])) == (xmin, ymin, ymax - ymin)
    assert sum(len(r) for svg, r, _ in p.boxes if svg["data-boxes"] == "boxes") == 18  # 0+1+2+3, three times


def test_masks_and_depth_are_shown_beside_their_image(detection):
    import numpy as np

    folder, rows, _, p = detection
    assert collections.Counter(layer["data-layer"] for layer in p.layers) == {"mask": 12, "depth": 12}
    for layer in p.layers:
        row, main = rows[layer["of"]["alt"]], layer["of"]
        shown = _picture(layer["src"])
        assert shown.shape[:2] == (int(main["height"]), int(main["width"])) == (40, len(shown[0]))
        if layer["data-layer"] == "mask":
            ids = np.asarray(Image.open(folder / row["mask"]))  # palette indices: the class ids
            colours = {tuple(c) for c in shown[ids == 0]}
            assert colours == {(0, 0, 0)}  # background black
            by_id = {i: {tuple(c) for c in shown[ids == i]} for i in range(1, 6)}
            assert all(len(c) == 1 for c in by_id.values())  # one false colour per class id...
            assert len(set().union(*by_id.values())) == 5  # ...each its own, all visible
            assert all(max(c) >= 128 for cs in by_id.values() for c in cs)
        else:
            depth = np.asarray(Image.open(folder / row["depth"])).astype(np.int64)
            grey = shown[..., 0].astype(np.int64)
            assert (shown[..., 0] == shown[..., 2]).all()  # greyscale
            assert grey[depth == depth.max()].min() == 255 and grey[depth == depth.min()].max() == 0
            assert np.abs(grey - (depth - depth.min()) * 255 / (depth.max() - depth.min())).max() <= 0.5


def _arrays_dataset(dataset, folder, image_kind):
    """A copy of `dataset` whose shards hold what an arrays build writes: only `image` (raw float32
    28 x 28 bytes, or a PNG of a uint8 28 x 28 array) and, for float, `label` (no filename, height or
    width), declared in manifest.json's features as an arrays build declares them. Returns
    {(shard file, record index): the array}."""
    import numpy as np
    from imagerecords.format import records

    out = folder / image_kind
    shutil.copytree(dataset[0], out)
    doc = json.loads((out / "manifest.json").read_text())
    rng = np.random.default_rng(11)
    arrays = {}
    for split in doc["splits"].values():
        for shard in split["shards"]:
            labels = [int(k) for k, n in sorted(shard["labels"].items(), key=lambda kv: int(kv[0])) for _ in range(n)]
            raws = []
            for index, label in enumerate(labels):
                if image_kind == "float":
                    x = (rng.standard_normal((28, 28)) * 3 + 7).astype(np.float32)
                    raws.append(schema.example_of({"image": schema.bytes_feature(x.tobytes()),
                                                   "label": schema.int64_list_feature([label])}))
                else:
                    x = rng.integers(0, 256, (28, 28), dtype=np.uint8)
                    png = io.BytesIO()
                    Image.fromarray(x).save(png, "PNG")
                    raws.append(schema.example_of({"image": schema.bytes_feature(png.getvalue())}))
                arrays[(shard["filename"], index)] = x
            (out / shard["filename"]).write_bytes(b"".join(records.frame(r) for r in raws))
            if image_kind == "png":  # as an arrays build without labels records it: all class 0, named ''
                shard["labels"] = {"0": len(labels)}
    if image_kind == "float":
        doc["features"] = {"image": {"dtype": "float32", "shape": [28, 28], "encoding": "bytes"},
                           "label": {"dtype": "int64", "shape": [], "encoding": "list"}}
    else:
        doc["features"] = {"image": {"dtype": "image", "encoding": "png", "channels": 1, "bits": 8}}
        doc["label_names"] = [""]
    (out / "manifest.json").write_text(json.dumps(doc))
    return out, arrays


@pytest.mark.parametrize("image_kind", ["float", "png"])
def test_arrays_dataset_shows_its_arrays_as_greyscale(dataset, tmp_path, image_kind):
    import numpy as np

    out, arrays = _arrays_dataset(dataset, tmp_path, image_kind)
    text = open(write_report(out, tmp_path / "r.html", per_class=2), encoding="utf-8").read()
    p = Page(text)
    classes = 4 if image_kind == "float" else 1  # without labels: one group, the first records
    assert len(p.imgs) == 2 * classes and not p.layers and not p.boxes
    assert p.one("data-sizes")["data-sizes"] == "absent"
    for img in p.imgs:
        shard, _, index = img["alt"].partition(" record ")
        x = arrays[(shard, int(index))]
        shown = _picture(img["src"])
        assert shown.shape[:2] == (84, 84) == (int(img["height"]), int(img["width"]))  # 28 px cells made 3 x 3
        assert (int(img["data-height"]), int(img["data-width"])) == (28, 28)
        cells = shown[::3, ::3, 0].astype(np.float64)
        if image_kind == "float":  # min-max scaled
            want = (x - x.min()) * 255.0 / (x.max() - x.min())
            assert np.abs(cells - want).max() <= 0.5 and (cells.min(), cells.max()) == (0, 255)
        else:  # uint8 as stored
            assert (cells == x).all()
    if image_kind == "float":
        assert [a["data-label"] for a in p.data if a.get("class") == "class"] == ["0", "1", "2", "3"]
        label = sum(int(b["data-value"]) for b, _ in p.bars if b.get("data-hist") == "feature-label")
        assert label == int(p.one("data-sample")["data-sample"])
    else:
        assert [a for a in p.data if a.get("class") == "class"] == [{"class": "class", "data-class": "", "data-label": ""}]
