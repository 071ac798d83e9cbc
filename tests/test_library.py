"""The build library under the command: imagerecords.build, build_arrays, BuildOptions, Error.

Builds run on conftest's image tree (4 classes x 10 generated images and one truncated JPEG) and on
arrays made here with NumPy; library builds run in a fresh interpreter so that the test can see
which modules the call imported (no argv parsing: nothing of imagerecords.cli).
"""

import filecmp
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import imagerecords
from imagerecords.cli import main as cli
from imagerecords.pipeline import staging
from imagerecords.builder import session
from imagerecords.pipeline import errors
from imagerecords.pipeline.naming import flag_names
from imagerecords.builder.options import BuildOptions
from imagerecords.pipeline import lock as output_lock
from tests.conftest import build, shard_files

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _python(code: str) -> dict:
    """Runs `code` in a fresh interpreter (this tree first on the path) and returns the JSON it
    prints last."""
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# Prints which of imagerecords.cli's modules, Beam and TensorFlow the call imported.
_IMPORTED = ("json.dumps(dict(result, cli=sorted(m for m in sys.modules if m.startswith('imagerecords.cli')), "
             "beam='apache_beam' in sys.modules, tf='tensorflow' in sys.modules))")


def _same_shards(a, b):
    left, right = shard_files(a), shard_files(b)
    assert [os.path.basename(p) for p in left] == [os.path.basename(p) for p in right] and left
    for x, y in zip(left, right):
        assert filecmp.cmp(x, y, shallow=False), (x, y)


@pytest.mark.slow
def test_build_publishes_the_commands_bytes_without_argv_and_reports_progress(image_tree, tmp_path):
    root, _ = image_tree
    out = tmp_path / "lib"
    result = _python(f"""
import json, sys, imagerecords
seen = []
manifest = imagerecords.build({str(root)!r}, {str(out)!r}, num_shards=2, splits={{"train": 0.75, "test": 0.25}},
                              local_workers=0, progress=seen.append, max_reject_fraction=0.05)
result = dict(examples=manifest.num_examples, rejected=manifest.num_rejected,
              done=[p.done for p in seen], totals=[p.total for p in seen], finals=[p.final for p in seen])
print({_IMPORTED})
""")
    assert result["cli"] == [] and not result["beam"] and not result["tf"]
    assert (result["examples"], result["rejected"]) == (40, 1)
    # Counts never go down; the last report is the only final one, with every input done.
    assert result["done"] == sorted(result["done"]) and len(result["done"]) >= 2
    assert result["finals"] == [False] * (len(result["finals"]) - 1) + [True]
    assert result["done"][-1] == result["totals"][-1] == 41
    cli_manifest = build(root, tmp_path / "cli", "--num_shards", 2, "--splits", "train=0.75,test=0.25",
                         "--max_reject_fraction", 0.05)
    assert cli_manifest.num_examples == 40
    _same_shards(out, tmp_path / "cli")


@pytest.mark.slow
def test_build_arrays_publishes_the_commands_bytes_without_argv(tmp_path, capsys):
    rng = np.random.default_rng(3)
    arrays = {"image": rng.integers(0, 256, (12, 8, 8, 3), dtype=np.uint8), "label": np.arange(12) % 3}
    folder = tmp_path / "arrays"  # build_arrays's own folder name, so that the keys agree
    folder.mkdir()
    for name, value in arrays.items():
        np.save(folder / f"{name}.npy", value)
    result = _python(f"""
import json, sys, numpy as np, imagerecords
arrays = {{name: np.load({str(folder)!r} + "/" + name + ".npy") for name in ("image", "label")}}
manifest = imagerecords.build_arrays(arrays, {str(tmp_path / "lib")!r}, num_shards=1, seed=np.int64(4))
result = dict(examples=manifest.num_examples)
print({_IMPORTED})
""")
    assert result["cli"] == [] and result["examples"] == 12
    capsys.readouterr()
    build(folder, tmp_path / "cli", "--num_shards", 1, "--seed", 4)
    summary = capsys.readouterr().out
    _same_shards(tmp_path / "lib", tmp_path / "cli")
    # An arrays build counts rows, not images.
    assert " rows/s" in summary and "images/s" not in summary, summary


@pytest.mark.parametrize("settings,named", [
    # wrong type
    ({"num_shards": "4"}, "num_shards"),
    ({"num_shards": True}, "num_shards"),
    ({"overwrite": "yes"}, "overwrite"),
    ({"local_workers": 1.5}, "local_workers"),
    ({"progress": "stderr"}, "progress"),
    ({"pipeline_options": "--runner=DirectRunner", "runner": "DirectRunner"}, "pipeline_options"),
    ({"runner": 3}, "runner"),
    # argument edges: negatives, unknown names, options that contradict each other
    ({"num_shards": 0}, "num_shards"),
    ({"num_shards": 10**9}, r"num_shards must be within 1\.\.99,999"),  # once a 20 GB plan for 40 images
    ({"runner": "DirectRuner"}, r"^runner 'DirectRuner': no such Beam runner \(did you mean DirectRunner\?\)"),
    ({"splits": [("train", 0.9)]}, r"^splits: fractions sum to 0\.9, not 1"),  # once built silently
    ({"splits": {"train": "0.9", "validation": "0.1"}}, r"^splits: fraction of 'train' must be a number, got '0\.9'"),
    ({"splits": {"train": True}}, r"^splits: fraction of 'train' must be a number, got True"),
    ({"features": {"boxes": "float32[?"}}, r"^features: 'boxes': 'float32\[\?': expected"),
    ({"min_shards": 10**9}, r"min_shards must be within 1\.\.99,999"),
    ({"local_workers": -1}, "local_workers"),
    ({"max_reject_fraction": -0.1}, "max_reject_fraction"),
    ({"num_shard": 4}, "num_shard"),
    ({"pipeline_options": ["--direct_num_workers=2"]}, "need a runner"),
    ({"runner": "PrismRunner", "pipeline_options": ["--runner=FlinkRunner"]}, "disagrees"),
])
def test_a_bad_option_is_a_value_error_at_the_call_naming_it(image_tree, tmp_path, settings, named):
    root, _ = image_tree
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=named):
        imagerecords.build(str(root), str(out), **settings)
    assert not out.exists()  # refused before anything was read or written


@pytest.mark.parametrize("value", [None, "", 7])
def test_input_and_output_must_be_paths(tmp_path, value):
    with pytest.raises(ValueError, match="input"):
        BuildOptions.make(value, str(tmp_path / "out"))
    with pytest.raises(ValueError, match="output"):
        BuildOptions.make(str(tmp_path), value)


def test_a_feature_declared_as_text_is_the_flags_declaration(tmp_path):
    # The README's features={"boxes": "float32[?,4]"} raised SpecError: only mappings were taken.
    as_text = BuildOptions.make(str(tmp_path), str(tmp_path / "out"), features={"boxes": "float32[?,4]",
                                                                                "tags": "class_list"})
    as_maps = BuildOptions.make(str(tmp_path), str(tmp_path / "out"), features={
        "boxes": {"dtype": "float32", "shape": [None, 4]}, "tags": {"dtype": "class_list"}})
    assert as_text.config.features == as_maps.config.features and len(as_text.config.features) == 2


@pytest.mark.skipif(tuple(int(p) for p in __import__("apache_beam").__version__.split(".")[:2]) >= (2, 68),
                    reason="this Beam runs Prism")
def test_prism_on_a_beam_that_predates_it_is_one_line_before_anything_runs(image_tree, tmp_path, capsys):
    # It once failed inside the pipeline, trying to download a Prism binary.
    root, _ = image_tree
    out = tmp_path / "out"
    with pytest.raises(ValueError, match=r"^runner 'PrismRunner': needs apache-beam 2\.68 or newer"):
        imagerecords.build(str(root), str(out), runner="PrismRunner")
    code = cli.main(["build", "--input", str(root), "--output", str(out), "--runner", "PrismRunner", "--no_progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--runner PrismRunner: needs apache-beam 2.68" in err, err
    assert not out.exists()


def test_numpy_numbers_are_taken_as_numbers(tmp_path):
    options = BuildOptions.make(str(tmp_path), str(tmp_path / "out"), num_shards=np.int32(3), local_workers=np.int64(0),
                                max_reject_fraction=np.float32(0.5))
    assert (options.config.shards.num_shards, options.local_workers) == (3, 0)
    assert type(options.config.shards.num_shards) is int and type(options.local_workers) is int
    assert options.config.publish.max_reject_fraction == 0.5


def test_another_builds_write_probe_is_not_a_file_of_the_folder(image_tree, tmp_path):
    """Two builds started together into a new folder: the one that took the lock listed the other's
    write probe (there between its create and its remove) as a file, refused the folder as not empty,
    and removed the folder it had made, under the other's feet: both failed (exit 4)."""
    from imagerecords.builder import checks

    root, _ = image_tree
    out = tmp_path / "out"
    out.mkdir()
    probe = out / (checks.PROBE_PREFIX + "0123456789abcdef")
    probe.write_bytes(b"\0")
    manifest = imagerecords.build(str(root), str(out), max_reject_fraction=0.05)
    assert manifest.num_examples > 0 and (out / "manifest.json").exists()
    assert probe.read_bytes() == b"\0"  # not ours: left alone


def test_an_expected_failure_is_an_imagerecords_error_and_the_command_keeps_its_line(image_tree, tmp_path, capsys):
    root, _ = image_tree
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(imagerecords.Error) as e:
        imagerecords.build(str(root), str(out), max_reject_fraction=0.05)
    assert isinstance(e.value, errors.OutputError) and "not empty" in str(e.value)
    # A Python caller reads the setting's keyword; the command's line is the same sentence in flags.
    assert "pass overwrite=True to replace" in str(e.value) and "--" not in str(e.value)
    capsys.readouterr()
    code = cli.main(["build", "--input", str(root), "--output", str(out), "--no_progress"])
    err = capsys.readouterr().err
    said = str(e.value).replace("overwrite=True", "--overwrite")
    assert code == 4 and err == f"imagerecords build: error: {said}\n"
    assert (out / "notes.txt").read_text() == "mine" and sorted(os.listdir(out)) == ["notes.txt"]


def test_import_imagerecords_and_its_error_import_no_beam_and_no_tensorflow():
    result = _python("import json, sys, imagerecords\nimagerecords.Error, imagerecords.BuildOptions\nresult = {}\n"
                     f"print({_IMPORTED})")
    assert result == {"cli": [], "beam": False, "tf": False}


def test_build_with_no_flags_names_the_command_once(capsys):
    code = cli.main(["build"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == ("imagerecords build: error: --input and --output are required (see imagerecords build "
                   "--help)\n")


def test_an_unknown_flag_names_the_command_once(capsys):
    code = cli.main(["build", "--input", "a", "--output", "b", "--num_shards", "x"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("imagerecords build") == 2, err  # the prefix, and the --help hint
    assert err.startswith("imagerecords build: error: argument --num_shards: invalid int value: 'x'"), err


@pytest.mark.parametrize("staged,says", [(1, "1 complete shard is staged"), (2, "2 complete shards are staged")])
def test_a_stopped_build_counts_its_staged_shards_in_words(tmp_path, staged, says):
    import signal

    from imagerecords.pipeline.config import BuildConfig

    out = tmp_path / "out"
    build_id = output_lock.new_build_id()
    staged_dir = staging.staging_dir(str(out), build_id)
    os.makedirs(staged_dir)
    for i in range(staged):
        open(os.path.join(staged_dir, f"s{i}{staging.STAGED_RECORD}"), "w").close()
    e = session._interrupted(errors.Stopped(signal.SIGTERM), "engine", BuildConfig.of(input="in", output=str(out)),
                             build_id)
    assert f"; {says}: rerun the same call with resume=True to reuse them" in str(e)
    with flag_names():  # the command's words
        e = session._interrupted(errors.Stopped(signal.SIGTERM), "engine", BuildConfig.of(input="in", output=str(out)),
                                 build_id)
    assert f"; {says}: rerun the same command with --resume to reuse them" in str(e)


@pytest.mark.slow
def test_the_runner_option_chooses_beam_and_writes_the_local_engines_bytes(image_tree, tmp_path):
    root, _ = image_tree
    settings = dict(num_shards=2, max_reject_fraction=0.05)
    beam = imagerecords.build(str(root), str(tmp_path / "beam"), runner="DirectRunner",
                              pipeline_options=["--direct_num_workers=1"], **settings)
    local = imagerecords.build(str(root), str(tmp_path / "local"), **settings)
    assert beam.num_examples == local.num_examples == 40
    _same_shards(tmp_path / "beam", tmp_path / "local")
    with pytest.raises(errors.UsageError, match="^local_workers is for the local engine"):
        imagerecords.build(str(root), str(tmp_path / "x"), runner="DirectRunner", local_workers=2, **settings)


def test_stopping_a_beam_build_spares_the_callers_own_processes():
    """Ctrl-C in a notebook ends the Beam build's SDK workers and job servers, never the processes
    the caller was already running (a TensorBoard, a data server) nor theirs."""
    import time

    from imagerecords.builder.engines.beam import runner

    code = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)"
    bystander = subprocess.Popen([sys.executable, "-c", code])
    engine_child, before = None, set()
    try:
        before = set(runner._descendants(os.getpid()))
        deadline = time.monotonic() + 30
        while len(before) < 2 and time.monotonic() < deadline:  # the bystander and its own child
            before = set(runner._descendants(os.getpid()))
        assert bystander.pid in before and len(before) >= 2, f"the bystander's child never started: {before}"
        engine_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        runner.end_child_processes(spare=before)
        assert not runner._alive(engine_child.pid), "the build's own process outlived stop()"
        assert bystander.poll() is None
        assert all(runner._alive(pid) for pid in before), "a process the caller started before the build was ended"
    finally:
        for pid in before | set(runner._descendants(os.getpid())):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        for proc in (bystander, engine_child):
            if proc is not None:
                proc.wait()


def test_a_python_caller_reads_settings_by_their_keywords_and_the_command_by_its_flags(tmp_path, capsys):
    """The same refusal, from imagerecords.build and from the command: each names the settings as its
    caller gave them, and the library's names no flag at all."""
    tree = tmp_path / "in"
    (tree / "cat").mkdir(parents=True)
    with pytest.raises(ValueError) as e:
        imagerecords.build(str(tree), str(tmp_path / "out"), append=True, writer="beam")
    assert str(e.value) == "invalid build configuration: append=True needs writer='shards'"
    code = cli.main(["build", "--input", str(tree), "--output", str(tmp_path / "out"), "--append", "--writer", "beam"])
    assert code == 2 and capsys.readouterr().err == \
        "imagerecords build: error: invalid build configuration: --append needs --writer shards\n"
    with pytest.raises(imagerecords.Error) as e:
        imagerecords.build(str(tmp_path / "nowhere"), str(tmp_path / "out2"))
    assert str(e.value) == f"input={str(tmp_path / 'nowhere')!r}: no such file or folder"
    assert os.environ.get("IMAGERECORDS_SETTING_NAMES") is None  # the command's words did not outlive it


def test_a_setting_renders_as_a_flag_or_a_keyword():
    from imagerecords.pipeline.naming import setting

    assert (setting("overwrite"), setting("num_shards"), setting("writer", "shards")) == \
        ("overwrite=True", "num_shards", "writer='shards'")
    with flag_names():
        assert (setting("overwrite"), setting("num_shards"), setting("writer", "shards")) == \
            ("--overwrite", "--num_shards", "--writer shards")
