"""One owner per format concern: frames, index files, the manifest and each feature kind's codec live in format/, and every reader goes through them."""

import ast
import functools
import json
import os
import re
import shutil

import numpy as np
import pytest

from conftest import build
from imagerecords.format import codecs, records, schema
from imagerecords.format import features as features_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "imagerecords")


def _sources(*folders):
    for folder in folders or ("",):
        for base, _, names in os.walk(os.path.join(PACKAGE, folder)):
            for name in sorted(names):
                if name.endswith(".py"):
                    path = os.path.join(base, name)
                    yield os.path.relpath(path, ROOT), _parsed(path)


@functools.lru_cache(maxsize=None)
def _parsed(path):  # each source parsed once for all the rules below
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), path)


# The source rules ------------------------------------------------------------------------------


def test_exactly_one_module_unpacks_the_frame_header():
    # A frame header is a uint64 length ('<Q') and the masked crc32c of it; no one else may read either.
    unpackers, crc_users = set(), set()
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
                first = node.args[0]
                if (node.func.attr in ("unpack", "unpack_from", "Struct", "iter_unpack")
                        and isinstance(first, ast.Constant) and isinstance(first.value, str) and "Q" in first.value):
                    unpackers.add(path)
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in ("masked_crc32c", "google_crc32c"):
                crc_users.add(path)
    owner = os.path.join("imagerecords", "format", "records.py")
    assert unpackers == {owner}
    assert crc_users == {owner}


def test_only_the_tfrecord_format_module_frames_records_or_makes_their_writer():
    # Framing a record, framing rows in bulk, writing frames and the frame writer belong to records.py and
    # the TFRecord RecordFormat (record_format.py): every other writer hands records to a format's writer.
    framing = {"frame", "frame_equal", "frame_rows", "write_framed", "RecordWriter"}
    owners = {os.path.join("imagerecords", "format", n) for n in ("records.py", "record_format.py")}
    found = {}
    for path, tree in _sources():
        if path in owners:
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr in framing and (node.attr == "write_framed" or (
                    isinstance(node.value, ast.Name) and node.value.id == "records"))) or (isinstance(node, ast.ImportFrom) and node.module ==
                                                        "imagerecords.format.records" and
                                                        {a.name for a in node.names} & framing):
                found.setdefault(path, set()).add(getattr(node, "attr", None) or "import")
    assert found == {}


def test_the_array_record_library_is_imported_by_its_format_module_alone():
    users = {path for path, tree in _sources() for module in _imports(tree) if module.startswith("array_record")}
    assert users == {os.path.join("imagerecords", "format", "array_record_format.py")}


def test_shard_names_come_from_the_registry_not_a_suffix_spelled_elsewhere():
    # A new format is one module: no other module spells a format's file suffix.
    spelled = {}
    for path, tree in _sources():
        if path.startswith(os.path.join("imagerecords", "format", "")) and path.endswith(
                ("record_format.py", "array_record_format.py")):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in (
                    ".tfrecord", ".array_record"):
                spelled.setdefault(path, []).append(node.value)
    assert spelled == {}


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "imagerecords":
                yield from (f"imagerecords.{alias.name}" for alias in node.names)
            else:
                yield node.module


@pytest.mark.parametrize("package", ["reader", "torch"])
def test_readers_import_only_the_format_among_imagerecords_packages(package):
    found = {}
    for path, tree in _sources(package):
        for module in _imports(tree):
            parts = module.split(".")
            if parts[0] == "imagerecords" and len(parts) > 1 and parts[1] not in ("format", package):
                found.setdefault(path, []).append(module)
    assert found == {}


def test_every_reader_loads_index_files_and_manifests_through_the_format():
    # The index checks and the manifest loader are called, never copied: no reader parses either itself.
    for path, tree in _sources("reader", "torch", os.path.join("cli", "inspection.py")):
        names = {n.attr if isinstance(n, ast.Attribute) else n.id
                 for n in ast.walk(tree) if isinstance(n, (ast.Attribute, ast.Name))}
        assert not names & {"parse_index", "loads", "from_json"}, path


# A stale index is refused the same way by every reader ------------------------------------------


@pytest.fixture(scope="module")
def two_builds(tmp_path_factory):
    """The same 24 images (example_images) built with index files, in two orders (seeds 1 and 2)."""
    from imagerecords.pipeline import example_images

    base = tmp_path_factory.mktemp("owner")
    example_images.write_tree(str(base / "images"), per_class=6)
    for name, seed in (("mine", 1), ("other", 2)):
        build(base / "images", base / name, "--num_shards", 1, "--write_index", "--seed", seed)
    return base


def _manifest(folder):
    with open(folder / "manifest.json") as f:
        return json.load(f)


def _shard(manifest):
    [shard] = manifest["splits"]["train"]["shards"]
    return shard


@pytest.fixture(params=["another build's index", "a line dropped, no sha256 in the manifest"])
def stale(request, two_builds, tmp_path):
    """A copy of one build whose train index file is not the one its manifest lists; returns
    (folder, index path, the problem every reader must name, the shard's bytes)."""
    out = tmp_path / "ds"
    shutil.copytree(two_builds / "mine", out)
    manifest = _manifest(out)
    shard = _shard(manifest)
    index = out / shard["index_file"]
    if request.param.startswith("another"):
        other = two_builds / "other"
        shutil.copyfile(other / _shard(_manifest(other))["index_file"], index)
        problem = "its sha256 differs from manifest.json's"
    else:
        index.write_bytes(b"".join(index.read_bytes().splitlines(keepends=True)[:-1]))
        del shard["index_sha256"]
        (out / "manifest.json").write_text(json.dumps(manifest))
        problem = f"it lists {shard['count'] - 1} records, manifest.json says {shard['count']} for its shard"
    return out, str(index), problem, (out / shard["filename"]).read_bytes()


def _refusal(index, problem):
    return rf"^index file {re.escape(index)}: {re.escape(problem)}; {re.escape(records.INDEX_MEND)}$"


def test_a_stale_index_is_refused_by_the_resumable_make_dataset(stale):
    from imagerecords import reader

    out, index, problem, shard = stale
    with pytest.raises(records.IndexFileError, match=_refusal(index, problem)):
        reader.make_dataset(str(out), "train", batch_size=4, image_size=8, training=True, seed=7, start_step=0)
    assert (out / _shard(_manifest(out))["filename"]).read_bytes() == shard


@pytest.mark.slow
@pytest.mark.needs_extra("torch")
def test_a_stale_index_is_refused_by_the_torch_dataset(stale):
    import imagerecords.torch as irt

    out, index, problem, _ = stale
    with pytest.raises(records.IndexFileError, match=_refusal(index, problem)):
        irt.RecordDataset(str(out), "train")


def test_a_stale_index_is_named_by_verify(stale):
    from imagerecords.cli import inspection

    out, index, problem, _ = stale
    for with_records in (False, True):
        problems, _ = inspection.verify(str(out), records=with_records)
        assert f"{index}: {problem}" in problems
        assert not [p for p in problems if not p.startswith(index)]  # the healthy shard is not blamed


def test_as_dataset_reads_no_index_so_a_stale_one_leaves_its_healthy_shard_readable(stale):
    # as_dataset streams whole shards and checks them against the manifest's counts, so it never
    # reads an index file; the shard the stale index sits beside still reads in full.
    from imagerecords import reader

    out, _, _, _ = stale
    count = _shard(_manifest(out))["count"]
    assert sum(1 for _ in reader.as_dataset(str(out), "train")) == count


# The index loader's checks, one per fault --------------------------------------------------------


def _good_index():
    writer = records.RecordWriter(open(os.devnull, "wb"))
    for record in (b"a", b"bb", b"ccc"):
        writer.write(record)
    return writer.index(), writer.num_bytes


@pytest.mark.parametrize("tamper, problem", [
    (lambda d: d + b"99 17\n", "it lists 4 records, manifest.json says 3 for its shard"),
    (lambda d: d.replace(b"35 19", b"35 20"), "its records end at byte 55, manifest.json says its shard is 54 bytes"),
    (lambda d: d.replace(b"35 19", b"35 x"), "line 3 is not '<offset> <length>': '35 x'"),
])
def test_load_index_refuses_each_fault_naming_the_file(tamper, problem):
    data, size = _good_index()
    assert records.load_index(data, "x.idx", count=3, num_bytes=size) == [(0, 17), (17, 18), (35, 19)]
    with pytest.raises(records.IndexFileError, match=f"^index file x.idx: {re.escape(problem)}; "):
        records.load_index(tamper(data), "x.idx", count=3, num_bytes=size)


# Each kind's codec: encode and both decoders agree -----------------------------------------------


@pytest.mark.parametrize("name, spec, value", [
    ("caption", {"dtype": "string"}, "a red\u200f circle"),
    ("tags", {"dtype": "class_list", "names": ["a", "b", "c"]}, ["c", "a"]),
    ("boxes", {"dtype": "float32", "shape": [None, 4]}, [[0.5, 1, 2, 3], [4, 5, 6, 7.25]]),
    ("mask", {"dtype": "uint8", "shape": [2, 3]}, [[0, 1, 2], [3, 4, 255]]),
    ("score", {"dtype": "int64"}, -2**40),
])
def test_each_kind_round_trips_through_its_one_codec(name, spec, value):
    tf = pytest.importorskip("tensorflow")
    feature = features_lib.from_json(name, spec)
    codec = codecs.codec(feature)
    checked = codecs.check(feature, value)
    vocabulary = features_lib.vocabulary_of(feature.names) if feature.dtype == "class_list" else None
    encoded = codec.encode(feature, checked, vocabulary)
    assert encoded == codecs.encode(feature, checked, vocabulary)
    record = schema.example_of({name: encoded})
    want = [2, 0] if feature.dtype == "class_list" else value
    as_numpy = codecs.to_numpy(feature, schema.parse_example(record)[name])
    parsed = tf.io.parse_single_example(record, {name: codec.parse_spec(feature, tf)})[name]
    as_tensor = codec.to_tensor(feature, parsed, tf).numpy()
    if feature.dtype == "string":
        assert as_numpy == value and as_tensor.decode("utf-8") == value
    else:
        np.testing.assert_array_equal(as_numpy, np.asarray(want))
        np.testing.assert_array_equal(as_tensor, as_numpy)
        assert as_tensor.dtype == as_numpy.dtype


# One manifest loader ----------------------------------------------------------------------------


@pytest.mark.parametrize("with_torch", [False, pytest.param(True, marks=pytest.mark.needs_extra("torch"))],
                         ids=["readers", "and-torch"])
@pytest.mark.parametrize("state", ["empty", "unfinished", "not JSON"])
def test_every_reader_refuses_a_folder_without_a_readable_manifest_in_the_same_words(tmp_path, state, with_torch):
    from imagerecords.cli import inspection
    from imagerecords.format import manifest as manifest_lib
    from imagerecords.pipeline import errors
    from imagerecords.reader import info

    folder = str(tmp_path / "ds")
    os.makedirs(folder)
    if state == "unfinished":
        os.makedirs(os.path.join(folder, manifest_lib.STAGING))
        want, kinds = manifest_lib.unfinished_hint(folder), (FileNotFoundError, errors.UnfinishedBuild)
    elif state == "empty":
        want, kinds = manifest_lib.no_manifest_hint(folder), (FileNotFoundError, errors.InputError)
    else:
        with open(os.path.join(folder, manifest_lib.MANIFEST), "w") as f:
            f.write("{not json")
        want, kinds = None, (manifest_lib.ManifestError, errors.InputError)
    loaders = [(info.load_info, kinds[0]), (inspection.load, kinds[1])]
    if with_torch:
        import imagerecords.torch as irt

        loaders.append((irt.load_manifest, kinds[0]))
    messages = set()
    for load, kind in loaders:
        with pytest.raises(kind) as caught:
            load(folder)
        messages.add(str(caught.value))
    assert len(messages) == 1
    if want is not None:
        assert messages == {want}
    else:
        assert next(iter(messages)).startswith(os.path.join(folder, manifest_lib.MANIFEST) + ": not valid JSON")
