"""Pre-flight checks (imagerecords.builder.checks) on real files in tmp_path.

Fixtures are made by the tests: tiny files stand in for images (the checks read no more than the
first bytes of files directly under a folder root, and those only to tell images apart), CSV
and JSONL manifests are written as text, and the unwritable/full outputs are real tmpfs mounts
(root only; skipped with the reason where mount is refused).
"""

import contextlib
import errno
import os
import subprocess

import pytest

from conftest import skip_unless_ci
from imagerecords.pipeline.config import BuildConfig, parse_splits
from imagerecords.pipeline.errors import InputError, OutputError, UsageError
from imagerecords.builder import checks as preflight
from imagerecords.cli.exit_codes import exit_code
from imagerecords.pipeline.naming import flag_names


@pytest.fixture(autouse=True)
def command_line_names():
    """These checks run for the command and the library alike; here they are pinned in the command's
    words (--input). test_library.py pins a Python caller's (input='...')."""
    with flag_names():
        yield


def _config(input_path, output_path="unused-out", **kwargs):
    return BuildConfig.of(input=str(input_path), output=str(output_path), **kwargs)


def _touch(path, data=b"x"):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _tree(root, classes=("cat", "dog")):
    for label in classes:
        _touch(root / label / f"{label}0.jpg")
    return root


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@contextlib.contextmanager
def _tmpfs(mountpoint, options):
    """Mounts a fresh tmpfs with `options` at `mountpoint`, unmounting it afterwards."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        skip_unless_ci(f"cannot mount a tmpfs here ({result.stderr.strip() or result.returncode}); "
                       "this check needs root in a container that allows mount")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


# Input: folders ---------------------------------------------------------------------------------


def test_class_folder_tree_passes(tmp_path):
    info = preflight.check_input(_config(_tree(tmp_path / "in")))
    assert info == preflight.InputInfo("folder")


def test_missing_input(tmp_path):
    path = tmp_path / "nope"
    with pytest.raises(InputError) as e:
        preflight.check_input(_config(path))
    assert str(e.value) == f"--input {path}: no such file or folder"
    assert exit_code(e.value) == 3


def test_missing_manifest(tmp_path):
    path = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=f"^--input {path}: no such file$"):
        preflight.check_input(_config(path))


def test_empty_folder(tmp_path):
    (tmp_path / "in").mkdir()
    with pytest.raises(InputError, match="the folder is empty"):
        preflight.check_input(_config(tmp_path / "in"))


def test_folder_with_only_hidden_entries_is_empty(tmp_path):
    _touch(tmp_path / "in" / ".DS_Store")
    _touch(tmp_path / "in" / ".git" / "HEAD")
    with pytest.raises(InputError, match="the folder is empty"):
        preflight.check_input(_config(tmp_path / "in"))


def test_flat_folder_is_refused_with_a_manifest_hint(tmp_path):
    _touch(tmp_path / "in" / "a.jpg")
    _touch(tmp_path / "in" / "b.jpg")
    with pytest.raises(InputError) as e:
        preflight.check_input(_config(tmp_path / "in"))
    message = str(e.value)
    assert message.startswith(f"--input {tmp_path / 'in'}: has no class folders (expected INPUT/<label>/<image>)")
    assert "CSV/JSONL manifest with path,label columns" in message


# An image's first bytes as the decoder sniffs them (codec.sniff_format); the rest is filler.
_PNG_HEAD = b"\x89PNG\r\n\x1a\n" + b"\0" * 8


def test_one_class_folder_given_as_the_root_is_refused_naming_its_parent(tmp_path):
    # What a user gets by pointing --input at photos/cat: cat's images beside one sub-folder.
    cat = tmp_path / "photos" / "cat"
    for i in range(5):
        _touch(cat / f"cat{i}.jpg")
    _touch(cat / "more" / "cat9.jpg")
    with pytest.raises(InputError) as e:
        preflight.check_input(_config(cat))
    assert str(e.value) == (f"--input {cat}: looks like one class's folder, not a folder of class folders: it holds "
                            "images (cat0.jpg, cat1.jpg, cat2.jpg, ...) beside one sub-folder, 'more', which would "
                            f"be the only class and the images skipped; pass its parent {tmp_path / 'photos'} as "
                            "--input")
    assert exit_code(e.value) == 3


def test_root_images_are_told_by_their_first_bytes_when_their_name_says_nothing(tmp_path):
    cat = tmp_path / "cat"
    _touch(cat / "IMG_0001", _PNG_HEAD)
    _touch(cat / "notes", b"plain text")
    _touch(cat / "more" / "x.jpg")
    with pytest.raises(InputError, match=r"it holds images \(IMG_0001\) beside one sub-folder, 'more'"):
        preflight.check_input(_config(cat))


def test_a_flat_folder_of_images_suggests_its_parent_and_a_manifest(tmp_path):
    flat = tmp_path / "cat"
    _touch(flat / "a.png", _PNG_HEAD)
    with pytest.raises(InputError) as e:
        preflight.check_input(_config(flat))
    assert str(e.value) == (f"--input {flat}: has no class folders (expected INPUT/<label>/<image>), only images "
                            f"(a.png); if it is one class's folder, pass its parent {tmp_path} as --input; otherwise "
                            "list the images in a CSV/JSONL manifest with path,label columns")


def test_one_class_folder_beside_files_that_are_not_images_is_a_root(tmp_path):
    root = _tree(tmp_path / "in", classes=("cat",))
    _touch(root / "README.md", b"about the cats")
    _touch(root / "labels", b"cat\n")
    assert preflight.check_input(_config(root)).kind == "folder"


def test_images_at_a_root_of_several_class_folders_are_left_to_the_listing(tmp_path):
    root = _tree(tmp_path / "in")
    _touch(root / "stray.jpg")
    assert preflight.check_input(_config(root)).kind == "folder"  # listed as a skipped row


def test_class_folders_without_files(tmp_path):
    (tmp_path / "in" / "cat").mkdir(parents=True)
    (tmp_path / "in" / "dog" / "deeper").mkdir(parents=True)
    _touch(tmp_path / "in" / "dog" / ".hidden.jpg")
    with pytest.raises(InputError, match=r"the class folders \(cat, dog\) hold no files"):
        preflight.check_input(_config(tmp_path / "in"))


def test_file_deep_below_a_class_folder_counts(tmp_path):
    (tmp_path / "in" / "cat").mkdir(parents=True)
    _touch(tmp_path / "in" / "dog" / "2024" / "jan" / "x.png")
    assert preflight.check_input(_config(tmp_path / "in")).kind == "folder"


def test_symlinked_class_folder_counts(tmp_path):
    _touch(tmp_path / "elsewhere" / "cat" / "c.jpg")
    (tmp_path / "in").mkdir()
    os.symlink(tmp_path / "elsewhere" / "cat", tmp_path / "in" / "cat")
    assert preflight.check_input(_config(tmp_path / "in")).kind == "folder"


def test_symlinked_input_root_counts(tmp_path):
    _tree(tmp_path / "real")
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert preflight.check_input(_config(tmp_path / "link")).kind == "folder"


def test_symlink_loop_without_files_ends(tmp_path):
    (tmp_path / "in" / "cat").mkdir(parents=True)
    os.symlink(tmp_path / "in" / "cat", tmp_path / "in" / "cat" / "again")
    with pytest.raises(InputError, match="hold no files"):
        preflight.check_input(_config(tmp_path / "in"))


def test_input_file_that_is_not_a_manifest(tmp_path):
    path = _touch(tmp_path / "photos.zip")
    with pytest.raises(InputError, match="is a file but not a manifest"):
        preflight.check_input(_config(path))


def test_broken_symlink_input(tmp_path):
    os.symlink(tmp_path / "gone", tmp_path / "in")
    with pytest.raises(InputError, match="is a broken symlink"):
        preflight.check_input(_config(tmp_path / "in"))


# Input: manifests -------------------------------------------------------------------------------


def test_csv_manifest_passes_and_reports_its_header(tmp_path):
    path = _write(tmp_path / "m.csv", "\ufeffpath,label,split\r\na.jpg,cat,train\r\n")
    info = preflight.check_input(_config(path))
    assert info == preflight.InputInfo("csv", ("path", "label", "split"), "path,label,split",
                                       first_row=(("path", "a.jpg"), ("label", "cat"), ("split", "train")))


def test_csv_manifest_with_uri_column_passes(tmp_path):
    path = _write(tmp_path / "m.csv", "uri,label\ngs://b/a.jpg,cat\n")
    assert preflight.check_input(_config(path)).columns == ("uri", "label")


def test_empty_csv_manifest(tmp_path):
    path = _write(tmp_path / "m.csv", "\n\n")
    with pytest.raises(InputError, match=f"^--input {path}: the manifest is empty"):
        preflight.check_input(_config(path))


def test_csv_manifest_with_a_header_only(tmp_path):
    path = _write(tmp_path / "m.csv", "path,label\n")
    with pytest.raises(InputError, match=r"has a header \(path,label\) but no rows"):
        preflight.check_input(_config(path))


def test_csv_manifest_without_the_label_column(tmp_path):
    path = _write(tmp_path / "m.csv", "path,class\na.jpg,cat\n")
    with pytest.raises(InputError) as e:
        preflight.check_input(_config(path))
    assert str(e.value) == (f"--input {path}: the CSV header has no 'label' column (columns: path, class); "
                            "name the label column with --label_column")


def test_csv_manifest_without_the_path_column(tmp_path):
    path = _write(tmp_path / "m.csv", "file,label\na.jpg,cat\n")
    with pytest.raises(InputError, match=r"has no 'path' \(or 'uri'\) column .*--path_column"):
        preflight.check_input(_config(path))


def test_csv_manifest_with_renamed_columns(tmp_path):
    path = _write(tmp_path / "m.csv", "file,class\na.jpg,cat\n")
    info = preflight.check_input(_config(path, path_column="file", label_column="class"))
    assert info.columns == ("file", "class")


def test_csv_manifest_that_is_not_utf8(tmp_path):
    path = tmp_path / "m.csv"
    path.write_bytes(b"path,label\n\xe9t\xe9.jpg,cat\n")
    with pytest.raises(InputError, match="line 2 is not UTF-8 text"):
        preflight.check_input(_config(path))


def test_jsonl_manifest_passes_and_reports_its_first_row_keys(tmp_path):
    path = _write(tmp_path / "m.jsonl", '\n{"path": "a.jpg", "label": "cat", "key": "k1"}\n')
    assert preflight.check_input(_config(path)) == preflight.InputInfo(
        "jsonl", ("path", "label", "key"), first_row=(("path", "a.jpg"), ("label", "cat"), ("key", "k1")))


def test_empty_jsonl_manifest(tmp_path):
    path = _write(tmp_path / "m.jsonl", "")
    with pytest.raises(InputError, match="the manifest is empty"):
        preflight.check_input(_config(path))


def test_jsonl_manifest_whose_first_row_is_not_an_object(tmp_path):
    path = _write(tmp_path / "m.jsonl", '["a.jpg", "cat"]\n')
    with pytest.raises(InputError, match="the first row is not a JSON object"):
        preflight.check_input(_config(path))


def test_manifest_path_that_is_a_folder(tmp_path):
    (tmp_path / "m.csv").mkdir()
    with pytest.raises(InputError, match="is a folder named like a manifest"):
        preflight.check_input(_config(tmp_path / "m.csv"))


# --splits against a manifest's split column ----------------------------------------------------

SPLITS = parse_splits("train=0.8,validation=0.2")


def test_splits_with_a_csv_split_column_is_refused(tmp_path):
    path = _write(tmp_path / "m.csv", "path,label,split\na.jpg,cat,train\n")
    with pytest.raises(UsageError) as e:
        preflight.check_input(_config(path, splits=SPLITS))
    message = str(e.value)
    assert message.startswith(f"--splits would replace the 'split' column of {path}")
    assert "--ignore_split_column" in message
    assert exit_code(e.value) == 2


def test_splits_with_a_split_column_is_accepted_when_told_to_ignore_it(tmp_path):
    path = _write(tmp_path / "m.csv", "path,label,split\na.jpg,cat,train\n")
    info = preflight.check_input(_config(path, splits=SPLITS), ignore_split_column=True)
    assert info.columns == ("path", "label", "split")


def test_splits_with_a_renamed_split_column_is_refused(tmp_path):
    path = _write(tmp_path / "m.csv", "path,label,fold\na.jpg,cat,train\n")
    assert preflight.check_input(_config(path, splits=SPLITS)).kind == "csv"  # 'split' is not a column
    with pytest.raises(UsageError, match="replace the 'fold' column"):
        preflight.check_input(_config(path, splits=SPLITS, split_column="fold"))


def test_splits_with_a_jsonl_split_key_is_refused(tmp_path):
    path = _write(tmp_path / "m.jsonl", '{"path": "a.jpg", "label": "cat", "split": "train"}\n')
    with pytest.raises(UsageError, match="--splits would replace the 'split' column"):
        preflight.check_input(_config(path, splits=SPLITS))


def test_splits_with_a_manifest_without_split_column_is_accepted(tmp_path):
    path = _write(tmp_path / "m.csv", "path,label\na.jpg,cat\n")
    assert preflight.check_input(_config(path, splits=SPLITS)).kind == "csv"


def test_a_split_column_without_splits_is_fine(tmp_path):
    path = _write(tmp_path / "m.csv", "path,label,split\na.jpg,cat,train\n")
    assert preflight.check_input(_config(path)).kind == "csv"


# Output ------------------------------------------------------------------------------------------


def test_output_is_created_with_parents_and_left_clean(tmp_path):
    out = tmp_path / "a" / "b" / "ds"
    preflight.check_output(_config(_tree(tmp_path / "in"), out))
    assert out.is_dir()
    assert os.listdir(out) == []  # the probe file is gone


def test_check_output_names_the_folder_it_created_and_remove_takes_only_empty_ones(tmp_path):
    root = _tree(tmp_path / "in")
    out = tmp_path / "a" / "b" / "ds"
    created = preflight.check_output(_config(root, out))
    assert created == str(tmp_path / "a")
    assert preflight.check_output(_config(root, out)) is None  # it exists now
    preflight.remove_created_output(created)
    assert sorted(os.listdir(tmp_path)) == ["in"]
    # A folder that something was written into stays, whole.
    created = preflight.check_output(_config(root, out))
    _touch(out / ".imagerecords-staging" / "errors.jsonl", b"{}")
    preflight.remove_created_output(created)
    assert (out / ".imagerecords-staging" / "errors.jsonl").read_bytes() == b"{}"


def test_a_refused_output_leaves_no_folder_behind(tmp_path):
    root = _tree(tmp_path / "in")
    with _tmpfs(tmp_path / "ro", "ro,size=64k") as mount:
        with pytest.raises(OutputError, match="Read-only file system"):
            preflight.check_output(_config(root, mount / "new" / "ds"))
        assert os.listdir(mount) == []
    with _tmpfs(tmp_path / "full", "size=4k") as mount:
        _touch(mount / "filler", b"\0" * 4096)
        with pytest.raises(OutputError, match="No space left on device"):
            preflight.check_output(_config(root, mount / "new"))
        assert sorted(os.listdir(mount)) == ["filler"]


def test_existing_output_keeps_its_files(tmp_path):
    out = tmp_path / "ds"
    _touch(out / "manifest.json", b"{}")
    preflight.check_output(_config(_tree(tmp_path / "in"), out))
    assert os.listdir(out) == ["manifest.json"]
    assert (out / "manifest.json").read_bytes() == b"{}"


def test_output_that_is_a_file(tmp_path):
    out = _touch(tmp_path / "ds")
    with pytest.raises(OutputError) as e:
        preflight.check_output(_config(_tree(tmp_path / "in"), out))
    assert str(e.value) == f"--output {out}: is a file, not a folder; choose a folder path"
    assert exit_code(e.value) == 4


def test_output_below_a_file(tmp_path):
    _touch(tmp_path / "f")
    with pytest.raises(OutputError, match="a part of the path is a file"):
        preflight.check_output(_config(_tree(tmp_path / "in"), tmp_path / "f" / "ds"))


def test_output_equal_to_input(tmp_path):
    root = _tree(tmp_path / "in")
    with pytest.raises(OutputError, match=f"^--output {root}/: is the input folder"):
        preflight.check_output(_config(root, f"{root}/"))


def test_output_inside_input(tmp_path):
    root = _tree(tmp_path / "in")
    out = root / "out" / "ds"
    with pytest.raises(OutputError, match=f"^--output {out}: is inside the input folder {root}; "):
        preflight.check_output(_config(root, out))
    assert not (root / "out").exists()  # refused before anything was created


def test_output_inside_input_through_a_symlink(tmp_path):
    root = _tree(tmp_path / "in")
    os.symlink(root / "cat", tmp_path / "alias")
    with pytest.raises(OutputError, match="is inside the input folder"):
        preflight.check_output(_config(root, tmp_path / "alias" / "ds"))


def test_output_inside_input_given_relative(tmp_path, monkeypatch):
    root = _tree(tmp_path / "in")
    monkeypatch.chdir(root)
    with pytest.raises(OutputError, match="is inside the input folder"):
        preflight.check_output(_config(root, "ds"))


def test_output_next_to_input_with_a_common_prefix_is_fine(tmp_path):
    root = _tree(tmp_path / "data")
    preflight.check_output(_config(root, tmp_path / "data2"))
    assert (tmp_path / "data2").is_dir()


def test_output_containing_the_input_is_fine(tmp_path):
    # The input inside the output is no overlap the build writes into: the existing folder is
    # neither created (nothing to remove on failure) nor emptied.
    root = _tree(tmp_path / "work" / "images")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert preflight.check_output(_config(root, tmp_path / "work")) is None
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_output_next_to_a_manifest_is_fine(tmp_path):
    manifest = _write(tmp_path / "m.csv", "path,label\na.jpg,cat\n")
    preflight.check_output(_config(manifest, tmp_path / "ds"))
    assert (tmp_path / "ds").is_dir()


@pytest.mark.parametrize("inp,out", [
    ("gs://bucket/photos", "gs://bucket/photos/ds"),
    ("gs://bucket/photos/", "gs://bucket/photos"),
    ("gs://bucket/photos", "gs://bucket//photos/./ds/"),
    ("gs://bucket/photos", "GS://bucket/photos/ds"),
])
def test_remote_output_inside_remote_input(inp, out):
    # Refused from the paths alone, before any storage call.
    with pytest.raises(OutputError, match="is (the|inside the) input folder"):
        preflight.check_output(_config(inp, out))


def test_read_only_output(tmp_path):
    root = _tree(tmp_path / "in")
    with _tmpfs(tmp_path / "ro", "size=1m,ro") as mount:
        with pytest.raises(OutputError) as e:
            preflight.check_output(_config(root, mount))
        assert str(e.value) == (f"--output {mount}: cannot create a file there (Read-only file system); "
                                "choose an --output on a writable filesystem")
        with pytest.raises(OutputError, match=r"cannot create the folder \(Read-only file system\)"):
            preflight.check_output(_config(root, mount / "sub" / "ds"))


def test_full_output(tmp_path):
    root = _tree(tmp_path / "in")
    with _tmpfs(tmp_path / "full", "size=64k") as mount:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            with pytest.raises(OSError) as full:  # fill it: tmpfs refuses writes past its size
                while True:
                    os.write(fd, b"\0" * 4096)
            assert full.value.errno == errno.ENOSPC
        finally:
            os.close(fd)
        with pytest.raises(OutputError) as e:
            preflight.check_output(_config(root, mount))
        assert str(e.value) == (f"--output {mount}: cannot write there (No space left on device); "
                                "free some space or choose another --output")
        assert sorted(os.listdir(mount)) == ["filler"]  # the empty probe file was removed


# The same checks on gs:// against the GCS emulator ----------------------------------------------


@pytest.fixture(scope="module")
def gcs_bucket(fake_gcs_server):
    """A bucket on the GCS emulator holding a class tree, a flat folder and manifests."""
    import uuid

    from tests.support.gcs import GcsEmulator

    with GcsEmulator(binary=fake_gcs_server) as emulator:
        name = f"checks-{uuid.uuid4().hex[:12]}"
        emulator.create_bucket(name)
        for path, data in {
            "tree/cat/c0.jpg": b"x",
            "tree/dog/d0.jpg": b"x",
            "flat/a.jpg": b"x",
            "flat/b.jpg": b"x",
            "oneclass/a.jpg": b"x",
            "oneclass/more/b.jpg": b"x",
            "m.csv": b"path,label,split\ntree/cat/c0.jpg,cat,train\n",
            "header-only.csv": b"path,label\n",
            "ds": b"a file where a folder should be",
        }.items():
            emulator.upload(data, f"gs://{name}/{path}")
        with emulator.activated():
            yield f"gs://{name}"


@pytest.mark.slow
@pytest.mark.gcs
def test_gcs_input_checks(gcs_bucket):
    assert preflight.check_input(_config(f"{gcs_bucket}/tree")).kind == "folder"
    assert preflight.check_input(_config(f"{gcs_bucket}/m.csv")).columns == ("path", "label", "split")
    with pytest.raises(InputError, match=rf"has no class folders .*, only images \(a.jpg, b.jpg\); if it is one "
                                         rf"class's folder, pass its parent {gcs_bucket} as --input"):
        preflight.check_input(_config(f"{gcs_bucket}/flat"))
    # Told by name on gs:// (objects are not read before the build).
    with pytest.raises(InputError, match=rf"looks like one class's folder.* beside one sub-folder, 'more'.*pass its "
                                         rf"parent {gcs_bucket} as --input$"):
        preflight.check_input(_config(f"{gcs_bucket}/oneclass"))
    with pytest.raises(InputError, match="no such folder, or no files under it"):
        preflight.check_input(_config(f"{gcs_bucket}/nothing"))
    with pytest.raises(InputError, match="no such file"):
        preflight.check_input(_config(f"{gcs_bucket}/nothing.csv"))
    with pytest.raises(InputError, match="but no rows"):
        preflight.check_input(_config(f"{gcs_bucket}/header-only.csv"))
    with pytest.raises(UsageError, match="--splits would replace the 'split' column"):
        preflight.check_input(_config(f"{gcs_bucket}/m.csv", splits=SPLITS))


@pytest.mark.slow
@pytest.mark.gcs
def test_gcs_output_checks(gcs_bucket):
    preflight.check_output(_config(f"{gcs_bucket}/tree", f"{gcs_bucket}/new-ds"))
    with pytest.raises(OutputError, match="is a file, not a folder"):
        preflight.check_output(_config(f"{gcs_bucket}/tree", f"{gcs_bucket}/ds"))
    with pytest.raises(OutputError, match="is inside the input folder"):
        preflight.check_output(_config(f"{gcs_bucket}/tree", f"{gcs_bucket}/tree/ds"))
