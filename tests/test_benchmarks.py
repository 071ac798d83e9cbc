"""Smoke test of the benchmark command: `python -m benchmarks.run --quick` with tiny sizes.

The corpus is drawn by the benchmark itself (seeded, 12 images) into a temporary cache. Speed is
never asserted: only that every figure of every group is there, positive, and that ratios are
computed against a baseline from the same run.
"""

import json
import os
import statistics
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

GROUPS = {
    "codec": ["pillow_reencode_threads", "pillow_reencode_processes", "draft_decode_threads",
              "prepare_image_passthrough_threads"],
    "peers": ["loop_passthrough", "loop_reencode", "loop_peak_rss", "tfds_pass_wall", "tfds_reencode_wall"],
    "build": [f"{w}_{p}_{m}" for w in ("shards", "threads", "direct", "beam") for p in ("pass", "reencode") for m in ("img_s", "peak_rss")],
    "encodings": [f"{e}_{m}" for e in ("jpeg", "keep", "png0", "png1", "png3", "png6") for m in ("img_s", "mb")]
    + [f"png{level}_{m}_vs_png6" for level in (0, 1, 3) for m in ("img_s", "mb")],
    "arrays": [f"{w}_{f}" for w in ("float32_28x28", "uint8_32x32x3")
               for f in ("seed_loop_build", "build", "launcher_refs", "launcher", "seed_read", "read")],
    "startup": ["build16_default", "build16_in_memory", "build16_multi_threading", "build16_multi_processing"],
    "memory": ["default_base_peak_rss", "default_rows20_kib_per_image", "default_rows60_kib_per_image",
               "default_slope_kib_per_image"],
    "scale": ["build_rows2000_wall", "build_rows2000_peak", "build_rows2000_bytes_per_row", "build_base_peak",
              "plan_rows5000_take", "plan_rows5000_total", "plan_rows5000_peak_rss", "plan_rows5000_bytes_per_row"],
    "reader": ["decode_limit_img_s", "crop_resize_limit_img_s", "reader_train_uint8_vs_crop_resize_limit",
               "plain_train_img_s", "reader_train_img_s", "reader_train_uint8_img_s",
               "reader_eval_img_s", "ttfb_train", "ttfb_eval", "reader_train_vs_interleave",
               "reader_eval_vs_interleave"],
    "train": ["plain_img_s", "reader_img_s", "reader_input_wait_share", "plain_input_wait_share"],
    "web": ["files_img_s", "files_peak_rss", "urls_img_s", "urls_peak_rss"],
    # measured with "web"; urls_opted_out_downloaded is checked apart (it must be 0)
    "web_optouts": ["urls_img_s", "urls_peak_rss", "urls_checks_off_img_s", "ceiling_img_s", "urls_vs_ceiling",
                    "checked_ceiling_img_s", "urls_vs_checked_ceiling"],
}


def test_corpus_is_seeded_varied_and_cached(tmp_path):
    from benchmarks import corpus

    a = corpus.ensure_corpus(12, seed=3, classes=3, cache=str(tmp_path), workers=1)
    again = corpus.ensure_corpus(12, seed=3, classes=3, cache=str(tmp_path))
    assert a == again and len(a.files) == 12 and a.classes == 3
    assert sorted(os.listdir(a.root)) == ["class_000", "class_001", "class_002"]
    sizes = [os.path.getsize(p) for p in a.files]
    assert len(set(sizes)) == 12  # no two files compress alike
    from PIL import Image

    for path in a.files:
        with Image.open(path) as img:
            assert 300 <= min(img.size) <= 500 * 4 // 3 and img.format in ("JPEG", "PNG")


# The CI smoke run measures the groups that need no extra build processes; the build, start-up,
# memory and peer groups each start ~15 CLI builds (minutes on a loaded 2-core machine) and run in
# the full benchmark. IMAGERECORDS_BENCH_ALL=1 smoke-tests every group.
SMOKE_GROUPS = list(GROUPS) if os.environ.get("IMAGERECORDS_BENCH_ALL") == "1" else ["codec", "reader", "train", "encodings",
                                                                                   "arrays", "web", "web_optouts"]


@pytest.mark.slow
def test_quick_benchmark_reports_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    from benchmarks.run import GROUPS as RUN_GROUPS

    skip = ",".join(g for g in RUN_GROUPS if g not in SMOKE_GROUPS
                    and not (g == "tfds" and "peers" in SMOKE_GROUPS))
    cmd = [sys.executable, "-m", "benchmarks.run", "--quick", "--images", "12", "--manifest_rows", "20,60",
           "--cache", str(tmp_path / "cache"), "--json", str(out)] + (["--skip", skip] if skip else [])
    if "train" in SMOKE_GROUPS:
        cmd += ["--train_model", "tiny"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": REPO})
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert "cores" in data["machine"]
    for group in SMOKE_GROUPS:
        figures = data["groups"][group]
        for name in GROUPS[group]:
            assert name in figures, f"{group}/{name} missing; have {sorted(figures)}"
            if name.endswith(("kib_per_image", "bytes_per_row")):
                # A difference of two peaks: at smoke sizes (20 vs 16 rows) it is noise, either sign.
                assert isinstance(figures[name]["value"], float), (group, name, figures[name])
                continue
            assert figures[name]["value"] > 0 and figures[name]["min"] > 0, (group, name, figures[name])
            if "baseline" in figures[name]:
                assert figures[name]["ratio"] > 0, (group, name)
    if "web_optouts" in SMOKE_GROUPS:  # the server saw no opted-out body sent, no disallowed path asked for
        assert data["groups"]["web_optouts"]["urls_opted_out_downloaded"]["value"] == 0
    # Ratios come from figures of the same run.
    if "build" in SMOKE_GROUPS:
        build = data["groups"]["build"]["shards_pass_img_s"]
        limit = data["groups"]["codec"]["prepare_image_passthrough_threads"]
        assert build["ratio"] == pytest.approx(build["value"] / limit["value"], rel=1e-6)
    reader = data["groups"]["reader"]["reader_train_img_s"]
    base_group, base_name = reader["baseline"].split("/")
    base_runs = data["groups"][base_group][base_name]["runs"]
    # Runs pair up by round when both have one per round; otherwise medians are compared.
    if len(base_runs) == len(reader["runs"]):
        want = statistics.median(m / t for m, t in zip(reader["runs"], base_runs))
    else:
        want = statistics.median(reader["runs"]) / statistics.median(base_runs)
    assert reader["ratio"] == pytest.approx(want, rel=1e-6)
    assert "ratio vs baseline" in proc.stdout
    if "train" in SMOKE_GROUPS:
        for name in ("reader_input_wait_share", "plain_input_wait_share"):
            assert figures_in(data, "train", name)["max"] <= 1.0
        assert any("training step: tiny" in note for note in data["notes"]), data["notes"]


def figures_in(data, group, name):
    return data["groups"][group][name]


def test_raydata_is_opt_in_by_its_own_python(monkeypatch, tmp_path):
    from benchmarks import run

    monkeypatch.delenv("IMAGERECORDS_RAY_PYTHON", raising=False)
    assert run.raydata_usable() == (None, "set IMAGERECORDS_RAY_PYTHON to a python with ray[data]")
    monkeypatch.setenv("IMAGERECORDS_RAY_PYTHON", str(tmp_path / "nowhere"))
    python, reason = run.raydata_usable()
    assert python is None and "not an executable file" in reason
    monkeypatch.setenv("IMAGERECORDS_RAY_PYTHON", sys.executable)
    assert run.raydata_usable() == (sys.executable, None)
