"""Every expected failure of the readers is an imagerecords.Error, keeping the builtin a user
already catches as a second base: checked over the source (every raise of the reader packages)
and by provoking the failures that need no dataset."""

import ast
import builtins
import glob
import os

import pytest

import imagerecords
from imagerecords.format import errors, schema
from imagerecords.format.files import Files, split_gs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The modules a trainer's process runs: the readers and the format layer they read through.
READER_MODULES = ("imagerecords/reader/*.py", "imagerecords/torch/*.py", "imagerecords/grain/*.py",
                  "imagerecords/format/access.py", "imagerecords/format/files.py", "imagerecords/format/schema.py")
# Raises that are no user's failure: a module's __getattr__ protocol and a missing optional package.
NOT_FAILURES = {("imagerecords/reader/__init__.py", "AttributeError"), ("imagerecords/reader/__init__.py", "ImportError"),
                ("imagerecords/format/files.py", "ImportError")}


def _raised(path):
    """(class name, line) of every `raise X(...)` in `path`; a bare re-raise or a helper's result is skipped."""
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Raise) and node.exc is not None:
            target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            if isinstance(target, ast.Name):
                yield target.id, node.lineno


def _error_classes(pattern):
    """Every class name the modules of `pattern` can raise, resolved in the module that raises it."""
    import importlib

    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, pattern))):
        rel = os.path.relpath(path, ROOT)
        module = importlib.import_module(rel[:-3].replace("/", ".").removesuffix(".__init__"))
        for name, line in _raised(path):
            if (rel, name) not in NOT_FAILURES:
                found.append((f"{rel}:{line}", name, getattr(module, name, None) or getattr(builtins, name, None)))
    return found


# One case per package, so that a missing torch (not in [test]) skips only the torch reader's scan.
@pytest.mark.parametrize("pattern", [pytest.param(p, marks=pytest.mark.needs_extra("torch")) if "/torch/" in p else p
                                     for p in READER_MODULES])
def test_every_raise_of_the_readers_is_an_imagerecords_error(pattern):
    found = _error_classes(pattern)
    assert found, pattern  # the scan saw the modules' raises
    strays = [f"{where} raises {name}" for where, name, cls in found
              if not (isinstance(cls, type) and issubclass(cls, imagerecords.Error))]
    assert not strays, "raise an imagerecords.Error subclass (format/errors.py), keeping the builtin as a base:\n" + \
        "\n".join(strays)


def test_the_scan_sees_a_planted_builtin_raise(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text("def f(x):\n    if x:\n        raise ValueError('bad')\n    raise ReadError('fine')\n")
    assert sorted(_raised(str(planted)), key=lambda r: r[1]) == [("ValueError", 3), ("ReadError", 4)]


@pytest.mark.parametrize("cls, builtin", [(errors.OutOfRange, IndexError), (errors.WrongIndexType, TypeError),
                                          (errors.NoSuchFeature, KeyError), (errors.RecordUndecodable, ValueError),
                                          (errors.TooLate, RuntimeError), (errors.FilesMissing, FileNotFoundError),
                                          (errors.ReadError, ValueError), (schema.UnknownPreset, ValueError)])
def test_each_error_keeps_its_builtin(cls, builtin):
    assert issubclass(cls, imagerecords.Error) and issubclass(cls, builtin)


def test_a_missing_feature_reads_as_a_sentence_not_a_quoted_key():
    assert str(errors.NoSuchFeature("shard-0: record 3 has no 'mask' feature")) == "shard-0: record 3 has no 'mask' feature"


@pytest.mark.parametrize("data", [b"\x0a\xff", b"\x0f", b"\x0a\x05\x0a\x03\x0a\x01"])
def test_bytes_that_are_no_example_are_refused_by_name(data):
    with pytest.raises(errors.RecordUndecodable, match="not a serialized tf.train.Example"):
        schema.parse_example(data)


def test_files_and_presets_fail_as_imagerecords_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist") as e:
        Files().size(str(tmp_path / "nope"))
    assert isinstance(e.value, imagerecords.Error)
    with pytest.raises(imagerecords.Error, match="not a gs://bucket/object path"):
        split_gs("gs://bucket-only")
    with pytest.raises(ValueError, match="unknown schema preset 'coco'") as e:
        schema.keys("coco")
    assert isinstance(e.value, imagerecords.Error)
    with pytest.raises(KeyError, match="no int64 feature 'nope'") as e:
        schema.read_int64(b"", "nope")
    assert isinstance(e.value, imagerecords.Error)
