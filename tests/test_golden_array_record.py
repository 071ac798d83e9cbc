"""Golden ArrayRecord builds: tests/test_golden.py's input built with --record_format array_record,
every file pinned in tests/golden/array_record.json the way test_golden.py pins its TFRecord builds
(same masking of the build's clock, versions, folder and version name).

The folder build (the refs path: passthrough and re-encoded JPEGs, a broken file in errors.jsonl)
and the arrays build (the columnar fast path handing whole blocks to the writer's write_many), each
on the local engine and on DirectRunner with two workers, which must write the same bytes.
Regenerate as test_golden.py says, with this file:
    IMAGERECORDS_REGENERATE_GOLDEN=1 python -m pytest -q tests/test_golden_array_record.py
"""

import json
import os

import pytest

from conftest import build
from test_golden import ENGINE_NAMES, ENGINES, INPUTS, REGENERATE, _write_input, differences, digests

GOLDEN = os.path.join(os.path.dirname(__file__), "golden", "array_record.json")
BUILDS = ("folder", "arrays")
# test_golden.COMMON without --write_index: an ArrayRecord file's footer is its index.
COMMON = ["--splits", "train=0.75,validation=0.25", "--num_shards", 2, "--max_reject_fraction", 0.2,
          "--record_format", "array_record"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    base = tmp_path_factory.mktemp("golden_ar")
    _write_input(str(base))
    return base


@pytest.fixture(scope="module")
def built(workdir):
    cache = {}

    def get(inp: str, engine: str, args=None) -> dict:
        if (inp, engine) not in cache:
            out = f"out-{inp}-{engine}"
            with pytest.MonkeyPatch.context() as mp:
                mp.chdir(workdir)
                manifest = build(INPUTS[inp], out, *COMMON, *(ENGINES[engine] if args is None else args))
            assert manifest.record_format == "array_record"
            assert manifest.num_examples == 24 - (inp == "arrays") and manifest.num_rejected == 1
            cache[inp, engine] = digests(str(workdir / out), str(workdir))
        return cache[inp, engine]

    return get


def _pinned() -> dict:
    if not os.path.exists(GOLDEN):
        return {}
    with open(GOLDEN) as f:
        return json.load(f)


@pytest.mark.parametrize("engine", [pytest.param(e, marks=pytest.mark.slow) if e != "local" else e
                                    for e in sorted(ENGINES)])
@pytest.mark.parametrize("inp", BUILDS)
def test_array_record_build_writes_the_pinned_bytes(built, inp, engine):
    got = built(inp, engine)
    assert any(".array_record-" in path for path in got) and not any(".tfrecord" in path for path in got)
    if REGENERATE:
        pytest.skip("regenerating: see test_regenerate_the_array_record_pins")
    changed = differences(_pinned().get(inp, {}), got)
    assert not changed, (f"the ArrayRecord {inp} build on {ENGINE_NAMES[engine]} wrote other bytes than "
                         f"{GOLDEN} pins:\n  " + "\n  ".join(changed))


@pytest.mark.slow
@pytest.mark.parametrize("inp", BUILDS)
def test_local_engine_and_direct_runner_write_the_same_array_record_bytes(built, inp):
    changed = differences(built(inp, "direct"), built(inp, "local"))
    assert not changed, f"{inp}: local engine (got) against DirectRunner (expected):\n  " + "\n  ".join(changed)


@pytest.mark.parametrize("inp", BUILDS)
def test_local_engine_and_prism_runner_write_the_same_array_record_bytes(built, inp, prism_binary):
    prism = ["--runner", "PrismRunner", f"--prism_location={prism_binary}",
             "--experiments=disable_prism_server_singleton"]  # as test_golden.py runs Prism
    changed = differences(built(inp, "prism", prism), built(inp, "local"))
    assert not changed, f"{inp}: local engine (got) against PrismRunner (expected):\n  " + "\n  ".join(changed)


@pytest.mark.skipif(not REGENERATE, reason="rewrites the pins only with IMAGERECORDS_REGENERATE_GOLDEN=1")
def test_regenerate_the_array_record_pins(built):
    pins = {}
    for inp in BUILDS:
        changed = differences(built(inp, "direct"), built(inp, "local"))
        assert not changed, f"not regenerating: the engines disagree on the {inp} build:\n  " + "\n  ".join(changed)
        pins[inp] = built(inp, "local")
    with open(GOLDEN, "w") as f:
        f.write(json.dumps(pins, indent=2, sort_keys=True) + "\n")
    pytest.fail(f"rewrote {GOLDEN}; rerun without IMAGERECORDS_REGENERATE_GOLDEN, review it and commit it")
