"""Golden builds: the exact bytes of every file a fixed build writes, pinned in tests/golden/builds.json.

A refactor that must not change the output proves it by passing this file unchanged. Eight builds
of one generated input (3 classes x 8 images; baseline JPEGs that pass through, PNGs that are
re-encoded, greyscale JPEGs converted to RGB, one broken JPEG that lands in errors.jsonl): a
class-folder build, a CSV-manifest build (with one row whose file is missing), the folder again
with --image_encoding png, and an arrays build (an .npz of the same pictures, one row with a
negative label), each on the local engine and on Beam's DirectRunner, all with --splits (train and
validation) and --write_index.

Every file in the output folder is pinned by its sha256, except manifest.json: its `created` is
the build's clock time and its `versions` records the installed libraries (both vary without the
code changing), so its pin is the digest of the file as `json.dumps(indent=2, sort_keys=True)`
writes it, with those two values replaced by "<varies>". If the file is not laid out that way
(another indent, unsorted keys) its entry reads "not in the pinned layout" instead of a digest.

The builds run in a temporary folder whose path differs per run; the folder build's paths stay
relative (it runs with that folder as working directory), and the CSV build's rows resolve against
the CSV's absolute folder, so errors.jsonl names it: before hashing, every file has that folder's
path replaced by "<workdir>". Nothing else is masked.

The pins hold for the library set in constraints.txt: Pillow and its libjpeg/zlib shape both the
generated input and the re-encoded records. The input files are pinned too (section "inputs"), so a
different Pillow shows as "the input changed", apart from a change in what the build writes.

To change the pins deliberately (the output is meant to differ), run
    IMAGERECORDS_REGENERATE_GOLDEN=1 python -m pytest -q tests/test_golden.py
which rewrites tests/golden/builds.json from this run (only if the local engine and DirectRunner
agree) and then fails, so a run that rewrote the pins is never green; rerun without the variable,
review `git diff tests/golden/` and commit it with the change that explains it.
"""

import hashlib
import json
import os

import numpy as np
import pytest
from PIL import Image

from conftest import build

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "builds.json")
REGENERATE = os.environ.get("IMAGERECORDS_REGENERATE_GOLDEN") == "1"
# Keys of manifest.json whose values legitimately differ between two builds of the same input.
VARYING_MANIFEST_KEYS = ("created", "versions")
CLASSES = ("cat", "dog", "owl")
PER_CLASS = 8
COMMON = ["--splits", "train=0.75,validation=0.25", "--num_shards", 2, "--write_index",
          "--max_reject_fraction", 0.2]
# Two worker processes: DirectRunner's multi_processing mode, the one the launcher picks for real runs.
ENGINES = {"local": [], "direct": ["--runner", "DirectRunner", "--direct_num_workers=2"]}
ENGINE_NAMES = {"local": "the local engine", "direct": "DirectRunner"}
INPUTS = {"folder": "images", "csv": "list.csv", "png": "images", "arrays": "arrays.npz"}
EXTRA = {"png": ["--image_encoding", "png"]}  # an input's own flags, after COMMON


def _pixels(c: int, i: int) -> np.ndarray:
    """A 32x24 RGB picture fixed by class `c` and index `i`: gradients plus a class-shaped patch."""
    yy, xx = np.mgrid[0:24, 0:32]
    img = np.stack([(xx * 8 + c * 60 + i * 5) % 256, (yy * 10 + i * 20) % 256,
                    ((xx + yy) * 4 + c * 90) % 256], axis=-1).astype(np.uint8)
    cx, cy = 8 + 2 * i, 12
    if c == 0:
        patch = (xx - cx) ** 2 + (yy - cy) ** 2 <= 36
    elif c == 1:
        patch = (abs(xx - cx) <= 5) & (abs(yy - cy) <= 5)
    else:
        patch = (xx // 3) % 2 == 0
    img[patch] = (250, 240 - 20 * c, 30 * i)
    return img


def _write_input(base: str) -> None:
    """Writes images/<class>/... and list.csv under `base`; the CSV's paths are relative to it."""
    rows = ["path,label,key"]
    for c, cls in enumerate(CLASSES):
        os.makedirs(os.path.join(base, "images", cls))
        for i in range(PER_CLASS):
            img = Image.fromarray(_pixels(c, i))
            if i % 3 == 0:
                name, img, kw = f"{cls}_{i}.jpg", img, {"format": "JPEG", "quality": 90}
            elif i % 3 == 1:
                name, img, kw = f"{cls}_{i}.png", img, {"format": "PNG"}
            else:
                name, img, kw = f"{cls}_{i}_grey.jpg", img.convert("L"), {"format": "JPEG", "quality": 90}
            img.save(os.path.join(base, "images", cls, name), **kw)
            rows.append(f"images/{cls}/{name},{cls},{cls}/{name}")
    # A JPEG start marker and then nothing an image decoder can use.
    with open(os.path.join(base, "images", "cat", "broken.jpg"), "wb") as f:
        f.write(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00 cut short")
    rows.append("images/cat/broken.jpg,cat,cat/broken.jpg")
    rows.append("images/dog/missing.jpg,dog,dog/missing.jpg")
    with open(os.path.join(base, "list.csv"), "w") as f:
        f.write("\n".join(rows) + "\n")
    # The same pictures as arrays; row 5's label is negative: the arrays build's rejected row.
    images = np.stack([_pixels(c, i) for c in range(len(CLASSES)) for i in range(PER_CLASS)])
    labels = np.repeat(np.arange(len(CLASSES)), PER_CLASS)
    labels[5] = -1
    with open(os.path.join(base, "arrays.npz"), "wb") as f:
        np.savez(f, image=images, label=labels)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _manifest_digest(raw: bytes) -> str:
    parsed = json.loads(raw.decode("utf-8"))
    if raw != (json.dumps(parsed, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"):
        return "not in the pinned layout (json.dumps indent=2, sort_keys=True, one final newline)"
    masked = {k: ("<varies>" if k in VARYING_MANIFEST_KEYS else v) for k, v in parsed.items()}
    return _sha256((json.dumps(masked, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8"))


def digests(folder: str, workdir: str) -> dict:
    """{path relative to `folder`: sha256} of every file under it, hidden ones included, with the
    path of `workdir` (the run's temporary folder) replaced by "<workdir>" in each file's bytes."""
    places = sorted({os.path.realpath(workdir).encode(), os.path.abspath(workdir).encode()}, key=len, reverse=True)
    # Each build publishes into a folder named after its build id: that one name is masked.
    versions = [n for n in os.listdir(folder) if n.startswith("v-")] if os.path.isdir(folder) else []
    out = {}
    for dirpath, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, folder).replace(os.sep, "/")
            with open(path, "rb") as f:
                data = f.read()
            for place in places:
                data = data.replace(place, b"<workdir>")
            for version in versions:
                data = data.replace(version.encode(), b"v-<build>")
                rel = rel.replace(version + "/", "v-<build>/")
            out[rel] = _manifest_digest(data) if rel == "manifest.json" else _sha256(data)
    return dict(sorted(out.items()))


def differences(want: dict, got: dict) -> list:
    """One line per file that differs: 'path: expected X, got Y' (a missing side reads 'absent')."""
    return [f"{path}: expected {want.get(path, 'absent')}, got {got.get(path, 'absent')}"
            for path in sorted(set(want) | set(got)) if want.get(path) != got.get(path)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden")
    _write_input(str(base))
    return base


@pytest.fixture(scope="module")
def built(workdir):
    """Runs each (input, engine) build once, on first use; returns a function giving its digests."""
    cache = {}

    def get(inp: str, engine: str, args=None) -> dict:
        if (inp, engine) not in cache:
            out = f"out-{inp}-{engine}"
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(workdir)  # relative paths: the temporary folder's name stays out of the output
                manifest = build(INPUTS[inp], out, *COMMON, *EXTRA.get(inp, ()),
                                 *(ENGINES[engine] if args is None else args))
            # The input covers what it is meant to: passthrough and re-encoded records, rejects, two splits.
            assert sorted(s.name for s in manifest.splits) == ["train", "validation"]
            assert manifest.num_examples == len(CLASSES) * PER_CLASS - (inp == "arrays")
            assert manifest.num_rejected == (2 if inp == "csv" else 1)
            passthrough = sum(sh.passthrough for s in manifest.splits for sh in s.shards)
            if inp in ("folder", "csv"):
                assert 0 < passthrough < manifest.num_examples
            else:  # every record written as PNG
                assert passthrough == 0
            cache[inp, engine] = digests(str(workdir / out), str(workdir))
        return cache[inp, engine]

    return get


def _pinned() -> dict:
    if not os.path.exists(GOLDEN):
        return {}
    with open(GOLDEN) as f:
        return json.load(f)


def test_the_generated_input_is_the_pinned_one(workdir):
    got = {k: v for k, v in digests(str(workdir), str(workdir)).items() if not k.startswith("out-")}
    want = _pinned().get("inputs", {})
    if REGENERATE:
        pytest.skip("regenerating: the inputs are rewritten with the builds")
    changed = differences(want, got)
    assert not changed, ("the generated input differs from the pinned one, so the library set differs from "
                         "constraints.txt (Pillow, libjpeg, zlib) or _write_input changed:\n  "
                         + "\n  ".join(changed))


@pytest.mark.slow
@pytest.mark.parametrize("inp", sorted(INPUTS))
def test_local_engine_and_direct_runner_write_the_same_bytes(built, inp):
    changed = differences(built(inp, "direct"), built(inp, "local"))
    assert not changed, f"{inp} build: local engine (got) against DirectRunner (expected):\n  " + "\n  ".join(changed)


@pytest.mark.parametrize("inp", sorted(INPUTS))
def test_local_engine_and_prism_runner_write_the_same_bytes(built, inp, prism_binary):
    """Beam's Prism runner (the DirectRunner of Beam >= 2.68 when it can reach it): every file alike."""
    # Beam keeps one Prism job server per process, made with the options of the first run that
    # wanted one: a DirectRunner build before this one (which tries Prism without a location) would
    # leave it pointing at a download. The experiment gives this run its own.
    prism = ["--runner", "PrismRunner", f"--prism_location={prism_binary}",
             "--experiments=disable_prism_server_singleton"]
    changed = differences(built(inp, "prism", prism),
                          built(inp, "local"))
    assert not changed, f"{inp} build: local engine (got) against PrismRunner (expected):\n  " + "\n  ".join(changed)


# The local engine's pins are in the fast tier; DirectRunner's (a runner, seconds each) in the full one.
@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) if e != "local" else e
                                    for e in sorted(ENGINES)])
@pytest.mark.parametrize("inp", sorted(INPUTS))
def test_build_writes_the_pinned_bytes(built, inp, engine):
    got = built(inp, engine)
    if REGENERATE:
        pytest.skip("regenerating: see test_regenerate_the_pins")
    want = _pinned().get("builds", {}).get(inp, {})
    changed = differences(want, got)
    assert not changed, (f"the {inp} build on {ENGINE_NAMES[engine]} wrote other bytes than tests/golden/builds.json "
                         f"pins:\n  " + "\n  ".join(changed) + "\nIf the change is meant, regenerate the pins with "
                         "IMAGERECORDS_REGENERATE_GOLDEN=1 python -m pytest -q tests/test_golden.py and commit them.")


@pytest.mark.skipif(not REGENERATE, reason="rewrites the pins only with IMAGERECORDS_REGENERATE_GOLDEN=1")
def test_regenerate_the_pins(built, workdir):
    builds = {}
    for inp in sorted(INPUTS):
        changed = differences(built(inp, "direct"), built(inp, "local"))
        assert not changed, f"not regenerating: the engines disagree on the {inp} build:\n  " + "\n  ".join(changed)
        builds[inp] = built(inp, "local")
    inputs = {k: v for k, v in digests(str(workdir), str(workdir)).items() if not k.startswith("out-")}
    os.makedirs(os.path.dirname(GOLDEN), exist_ok=True)
    with open(GOLDEN, "w") as f:
        f.write(json.dumps({"inputs": inputs, "builds": builds}, indent=2, sort_keys=True) + "\n")
    pytest.fail(f"rewrote {GOLDEN}; rerun without IMAGERECORDS_REGENERATE_GOLDEN, review git diff tests/golden/ "
                "and commit it")
