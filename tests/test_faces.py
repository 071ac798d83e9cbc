"""The faces a new user meets first: the reader's TensorFlow-free manifest helpers, the single-folder
commands' help, a damaged record's message, the report's default file and class titles, and the
Dataflow worker requirements beside the pinned and the newest Beam.

Datasets here are built by the `imagerecords` command in a subprocess, from images that Pillow
writes in the test (`demo`'s generated tree, or solid-colour PNGs in folders named by class id).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
from PIL import Image

from conftest import skip_unless_ci

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), TF_CPP_MIN_LOG_LEVEL="2")


def _run(args, cwd, timeout=300, **kw):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=str(cwd),
                          env=ENV, **kw)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """`imagerecords demo` run as the README shows it; returns (its output folder, its stdout)."""
    root = tmp_path_factory.mktemp("demo")
    out = _run(["-m", "imagerecords", "demo", str(root / "example_output")], root, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return root / "example_output", out.stdout


# --- the reader's manifest helpers import no TensorFlow ---------------------------------------------

def test_the_demos_read_back_line_imports_no_tensorflow(demo, tmp_path):
    """The line `demo` prints, run as printed, plus every manifest-only helper; sys.modules is checked."""
    folder, stdout = demo
    line = next(s for s in stdout.splitlines() if s.startswith("read it back:"))
    code = re.search(r'python -c "(.*)"$', line).group(1)
    dataset = str(folder / "dataset")
    probe = code + textwrap.dedent(f"""
        import sys
        i = reader.load_info({dataset!r})
        print(reader.steps_per_epoch(i, "train", 4), reader.examples_consumed({dataset!r}, "train", 3, 4, num_hosts=2),
              reader.label_names(i), sorted(reader.stored_features(i)), sorted(reader.tfrecord_description(i)),
              reader.ReadConfig().problems(), reader.HostPlan.__name__, reader.normalization_constants("imagenet")[0])
        print("TF", "tensorflow" in sys.modules)
    """)
    out = _run(["-c", probe], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith(f"images at {dataset}: schema tfds")
    assert out.stdout.splitlines()[-1] == "TF False"
    shown = out.stdout.splitlines()[-2]
    assert "['circle', 'square', 'stripes', 'triangle']" in shown and "'image/filename'" in shown


def test_without_tensorflow_the_helpers_work_and_the_readers_say_what_is_missing(demo, tmp_path):
    dataset = str(demo[0] / "dataset")
    code = textwrap.dedent(f"""
        import sys
        sys.modules["tensorflow"] = None  # as if not installed: importing it raises ImportError
        from imagerecords import reader
        n = reader.load_info({dataset!r}).split("validation").num_examples
        print(reader.steps_per_epoch({dataset!r}, "validation", 2) == -(-n // 2) > 0)
        for name in ("make_dataset", "as_dataset", "feature_spec", "PAD_LABEL"):
            try:
                getattr(reader, name)
            except ImportError as e:
                print(name, "|", e)
        try:
            from imagerecords.reader import make_dataset
        except ImportError as e:
            print("from-import |", e)
    """)
    out = _run(["-c", code], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "True"
    assert [s.split(" |")[0] for s in lines[1:]] == ["make_dataset", "as_dataset", "feature_spec", "PAD_LABEL",
                                                     "from-import"]
    assert all("needs TensorFlow >= 2.16" in s and "pip install -e '.[tensorflow]'" in s for s in lines[1:])


def test_an_unknown_reader_name_is_an_attribute_error_naming_it():
    from imagerecords import reader

    with pytest.raises(AttributeError, match="no attribute 'make_datasets'"):
        reader.make_datasets  # noqa: B018
    assert {"make_dataset", "load_info", "as_dataset"} <= set(dir(reader))


# --- the single-folder commands' help ---------------------------------------------------------------

@pytest.mark.parametrize("command,flag,words", [("verify", "--records", "CRCs"),
                                                ("finish", "--break_lock", "lock")])
def test_every_switch_of_verify_and_finish_has_help(command, flag, words, capsys):
    from imagerecords.cli.main import main

    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    described = re.search(rf"^  {flag} +(\S.*(?:\n {{10,}}\S.*)*)", text, re.M)
    assert described and words in described.group(1), text


# --- a flipped byte names its record, the damaged range and what to do ------------------------------

def test_a_flipped_byte_names_the_record_its_byte_range_and_the_remedy(demo, tmp_path):
    dataset = tmp_path / "dataset"
    shutil.copytree(demo[0] / "dataset", dataset)
    manifest = json.loads((dataset / "manifest.json").read_text())
    shard = dataset / manifest["splits"]["train"]["shards"][0]["filename"]
    data = bytearray(shard.read_bytes())
    data[200] ^= 0xFF
    shard.write_bytes(bytes(data))
    length = int.from_bytes(data[:8], "little")
    assert 12 + length > 200  # the first record's data holds byte 200, so record 0 is the damaged one
    out = _run(["-m", "imagerecords", "verify", "--records", str(dataset)], tmp_path)
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stdout.splitlines()[0] == (
        f"{shard}: record 0 at byte 0: bad data checksum (its data, bytes 12 to {11 + length}, changed after it "
        "was written): restore the file from a copy, or rebuild the dataset")


# --- the report: one default file per dataset, integer classes titled once --------------------------

@pytest.mark.slow
def test_reports_of_two_datasets_of_one_name_go_to_two_files_and_never_replace_each_other(demo, tmp_path):
    first, second = tmp_path / "a" / "dataset", tmp_path / "b" / "dataset"
    shutil.copytree(demo[0] / "dataset", first)
    shutil.copytree(demo[0] / "dataset", second)  # same name ("images"), same content, another place
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    written = []
    for dataset in (first, second):
        out = _run(["-m", "imagerecords", "report", str(dataset), "--per_class", "1"], cwd)
        assert out.returncode == 0, out.stderr[-3000:]
        written.append(re.fullmatch(r"imagerecords report: wrote (images-[0-9a-f]{8}-report\.html)",
                                    out.stdout.strip()).group(1))
    assert written[0] != written[1] and sorted(os.listdir(cwd)) == sorted(written)
    for name, dataset in zip(written, (first, second)):
        last = (cwd / name).read_text(encoding="utf-8").rstrip("\n").splitlines()[-1]
        where = json.dumps(os.path.realpath(dataset)).replace("-", "\\u002d")
        assert last == f"<!-- imagerecords report of: {where} -->"
    # Rerun: the same dataset gets the same file, replaced in place.
    out = _run(["-m", "imagerecords", "report", str(first), "--per_class", "1"], cwd)
    assert out.returncode == 0 and out.stdout.strip().endswith(written[0]) and len(os.listdir(cwd)) == 2
    # A default file that holds another dataset's report (or anything else) is refused, not replaced.
    shutil.copyfile(cwd / written[0], cwd / written[1])
    before = (cwd / written[1]).read_bytes()
    out = _run(["-m", "imagerecords", "report", str(second)], cwd)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{written[1]} holds the report of {first}, not the report of {second}" in lines[0]
    assert "--html PATH" in lines[0] and (cwd / written[1]).read_bytes() == before
    (cwd / written[1]).write_text("my notes\n")
    out = _run(["-m", "imagerecords", "report", str(second)], cwd)
    assert out.returncode != 0 and "holds a file this command did not write" in out.stderr
    assert (cwd / written[1]).read_text() == "my notes\n"


def test_integer_classes_are_titled_by_their_id_once(tmp_path):
    images = tmp_path / "images"
    for label, colour in ((0, (255, 0, 0)), (1, (0, 0, 255))):
        (images / str(label)).mkdir(parents=True)
        for i in range(3):
            Image.new("RGB", (12, 10), colour).save(images / str(label) / f"{i}.png")
    dataset = tmp_path / "dataset"
    out = _run(["-m", "imagerecords", "build", "--input", str(images), "--output", str(dataset),
                "--label_type", "int"], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    html = tmp_path / "page.html"
    out = _run(["-m", "imagerecords", "report", str(dataset), "--html", str(html)], tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    page = html.read_text(encoding="utf-8")
    assert re.findall(r"<h3>([^<]*) <small>", page) == ["0", "1"]
    bars = re.findall(r'<g data-value="\d+" data-split="train" data-label="(\d)"><title>(.*?):', page)
    assert bars == [("0", "0"), ("1", "1")]
    assert not re.search(r">(\d) (· )?\1<", page)


# --- Dataflow worker requirements resolve beside the pinned and the newest Beam ---------------------

def _pinned(name):
    with open(os.path.join(REPO, "constraints.txt")) as f:
        return next(line.split("==")[1].strip() for line in f if line.lower().startswith(f"{name.lower()}=="))


@pytest.mark.slow
def test_dataflow_worker_requirements_resolve_beside_the_pinned_and_the_newest_beam(tmp_path):
    """pip resolves `apache-beam[gcp]` with requirements-dataflow.txt (nothing installed: --dry-run),
    once held to constraints.txt (the pinned Beam) and once free (the newest Beam on the index);
    the two resolve side by side to keep the test under a minute."""
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "PyYAML", "--retries", "0",
                            "--timeout", "10"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0:
        skip_unless_ci(f"the package index is not reachable (pip index versions: {probe.stderr.strip()[-200:]})")
    requirements = os.path.join(REPO, "requirements-dataflow.txt")
    runs = {}
    for name, extra in (("pinned", ["-c", os.path.join(REPO, "constraints.txt")]), ("newest", [])):
        report = tmp_path / f"{name}.json"
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet", "--prefer-binary",
               "--report", str(report), *extra, "apache-beam[gcp]", "-r", requirements]
        runs[name] = (report, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    got = {}
    for name, (report, proc) in runs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{name} Beam: pip could not resolve requirements-dataflow.txt:\n{err[-3000:]}"
        installs = json.loads(report.read_text())["install"]
        got[name] = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in installs}
    assert got["pinned"]["apache-beam"] == _pinned("apache-beam")
    # Beside the pinned Beam the workers get constraints.txt's Pillow: a local build's JPEG bytes.
    assert got["pinned"]["pillow"] == _pinned("pillow") and got["pinned"]["pyyaml"] == _pinned("PyYAML")
    # And constraints.txt's libdeflate, whose build fixes the PNG bytes, beside either Beam.
    assert got["pinned"]["deflate"] == got["newest"]["deflate"] == _pinned("deflate")
    newest = tuple(int(p) for p in got["newest"]["apache-beam"].split(".")[:2])
    assert newest >= (2, 72), got["newest"]["apache-beam"]  # a Beam that caps Pillow below 13
    assert int(got["newest"]["pillow"].split(".")[0]) == 12
