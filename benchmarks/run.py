"""One benchmark command: corpus, codec limits, peers, both writers, start-up, memory, reader; with ratios.

Usage:
    python -m benchmarks.run --images 4000 [--repeats 3] [--json out.json]
    python -m benchmarks.run --quick --json out.json      # a smoke run, a few minutes at most

Every figure is measured in this run and printed next to a baseline from the same run, because the
machines are shared and noisy: only ratios travel between machines. With --repeats R each
measurement is taken R times, interleaved with the others, and printed as median [min-max].
Peak memory is summed over a command's whole process tree (psutil, sampled every 0.1 s) as PSS,
which splits pages a forked worker shares with its parent (RSS would count them once per process).

Groups (printed as one table each):
  codec    the limits: Pillow decode + RGB + encode (q90) with one thread per core, and with one
           process per core (Pillow releases the GIL inside decode and encode, so threads should
           reach the process figure without pickling bytes across processes; both are printed
           and the better one is the limit); the checked pass-through limit: a DCT-scaled draft
           decode of every image on every core, and the builder's own per-image function
           (codec.prepare_image: draft-check RGB JPEGs, convert the rest) on every core.
  peers    a serial loop (tf.train.Example + tf.io.TFRecordWriter), pass-through and re-encode;
           TFDS's Beam path (GeneratorBasedBuilder whose _generate_examples returns a PTransform,
           DirectRunner with the same worker count) on the same images; Ray Data (when
           IMAGERECORDS_RAY_PYTHON names a python with ray[data], tensorflow and crc32c: Ray runs in
           an environment of its own) on a local Ray with one CPU per core, the pipeline its docs
           show (read_binary_files with paths -> map to image bytes, class index, key ->
           random_shuffle -> write_tfrecords), pass-through only; its records counted with tf.data.
  build    `python -m imagerecords build` (the real CLI, --no_progress): the default (local
           engine, --writer shards), the same with --local_workers=0 (threads), on
           --runner=DirectRunner, and --writer beam; each
           pass-through and --reencode: wall time (imports included), images/s, peak memory.
  startup  a 16-image build in the CLI's default (the local engine) and in DirectRunner's
           in_memory, multi_threading and multi_processing modes (--direct_num_workers = cores).
  memory   manifest builds of many rows pointing at 64 tiny JPEGs under distinct keys:
           (peak memory - base) / rows, base being a 16-row manifest build's peak; and the slope
           between the two sizes. Modes: default (the local engine) and DirectRunner's modes.
  append   a dataset of --append_images images (default 20,000) built, --append_added (1,000) appended
           (--append), and a full rebuild (--overwrite) of all of them: the append's wall time as
           a ratio of the rebuild's (target <= 0.1).
  scale    the launcher at scale (README "Scale"): a --scale_rows manifest build (default 1M rows on 64
           tiny JPEGs, local engine): wall time, peak memory and (peak - base) per row, base being a
           16-row build's peak, against 1 KiB/row; and a planning-only pass (list, assign, plan with
           the local engine's own functions, no shard written) of --plan_rows rows (default 10M):
           wall time per step and the launcher's peak RSS (getrusage maxrss) per row above its base.
  flink    (Java and a cached Flink distribution needed, else a note says why it skipped) the
           harness's cluster (tests/support/flink.py: 2 TaskManagers, a worker pool beside each)
           started once; builds of --flink_sizes images (1,000 and 4,000; at most --images) on the local engine,
           DirectRunner, Flink with the job server FlinkRunner starts per job, and Flink through a
           job server kept up (--job_endpoint), that with --environment_cache_millis=60000 (a
           TaskManager keeps the job's SDK worker between stages), and that with warm worker pools
           (SDK workers as threads of a pool that has Beam and imagerecords imported); each Flink build split by the REST API's timestamps
           into submit (launcher start -> job INITIALIZING), schedule, run, after (commit), with
           per-vertex durations in the notes, SDK workers started per job, and the shards checked
           equal to the local engine's.
  train    (with --train_model) one SGD step of ResNet-50 (mixed bfloat16 on a GPU) fed by the
           reader's uint8 batches, normalised in the step, and by plain tf.data: images/s and the
           share of the time spent waiting for input (the accelerator's idle share).
  reader   make_dataset train (random-resized crop) and eval (center crop), 224 px, batch 128,
           against plain tf.data (interleave, shuffle, parse, decode_jpeg, resize, batch) and
           the decode limit (tf.io.decode_jpeg alone on all cores) and the crop-resize limit (the
           training crop's decode, resize and rounding alone on all cores); time to first batch;
           make_dataset's one order (the resumable one) of the train and eval pipelines against
           the former default order (shard interleave + shuffle buffer, now only under cache).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks import corpus as corpus_lib

CORES = os.cpu_count() or 1
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Results:
    """Figures by group; each figure keeps every run so ranges can be printed."""

    def __init__(self):
        self.groups: Dict[str, Dict[str, dict]] = {}
        self.notes: List[str] = []

    def add(self, group: str, name: str, value: float, unit: str, baseline: Optional[str] = None,
            higher_is_better: bool = True):
        fig = self.groups.setdefault(group, {}).setdefault(
            name, {"unit": unit, "runs": [], "baseline": baseline, "higher_is_better": higher_is_better})
        fig["runs"].append(float(value))

    def value(self, group: str, name: str) -> float:
        return statistics.median(self.groups[group][name]["runs"])

    def to_json(self) -> dict:
        out = {"machine": machine(), "notes": list(dict.fromkeys(self.notes)), "groups": {}}
        for group, figs in self.groups.items():
            g = out["groups"][group] = {}
            for name, fig in figs.items():
                entry = {"value": statistics.median(fig["runs"]), "min": min(fig["runs"]), "max": max(fig["runs"]),
                         "runs": fig["runs"], "unit": fig["unit"]}
                base = fig["baseline"]
                if base:
                    bg, bn = base.split("/")
                    ratio = self._ratios(group, name, bg, bn)
                    entry.update(baseline=base, ratio=statistics.median(ratio), ratio_min=min(ratio),
                                 ratio_max=max(ratio))
                g[name] = entry
        return out

    def _ratios(self, group, name, bg, bn) -> List[float]:
        """Per-run ratios (runs pair up by index: both were taken in the same round)."""
        mine, theirs = self.groups[group][name]["runs"], self.groups[bg][bn]["runs"]
        higher = self.groups[group][name]["higher_is_better"]
        pairs = list(zip(mine, theirs)) if len(mine) == len(theirs) else [(statistics.median(mine), statistics.median(theirs))]
        return [(m / t) if higher else (m / t) for m, t in pairs if t]

    def print(self, file=sys.stdout):
        data = self.to_json()
        print(f"\nmachine: {data['machine']}", file=file)
        for group, figs in data["groups"].items():
            print(f"\n[{group}]", file=file)
            print(f"  {'figure':<44} {'value (median [min-max])':>34}  ratio vs baseline", file=file)
            for name, e in figs.items():
                value = f"{_fmt(e['value'])} [{_fmt(e['min'])}-{_fmt(e['max'])}] {e['unit']}"
                ratio = ""
                if "ratio" in e:
                    ratio = f"{e['ratio']:.2f} [{e['ratio_min']:.2f}-{e['ratio_max']:.2f}] x {e['baseline']}"
                print(f"  {name:<44} {value:>34}  {ratio}", file=file)
        for note in data["notes"]:
            print(f"note: {note}", file=file)


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def machine() -> str:
    import platform

    import psutil

    return (f"{platform.node()}: {CORES} cores ({platform.processor() or platform.machine()}), "
            f"{psutil.virtual_memory().total / 2**30:.0f} GiB RAM, Python {platform.python_version()}")


# --- running a command and watching its process tree


def _memory(p) -> int:
    """A process's share of memory: PSS where the OS has it (Linux), else RSS. Summing RSS over a
    tree counts every page a forked worker shares with its parent once per process, so the local
    engine's forked workers would each seem to hold the whole launcher's heap."""
    import psutil

    try:
        return p.memory_full_info().pss
    except (AttributeError, psutil.AccessDenied):
        return p.memory_info().rss


def run_watched(cmd: Sequence[str], env: Optional[dict] = None,
                seen: Optional[Dict[int, float]] = None) -> Tuple[float, float]:
    """Runs `cmd`; returns (wall seconds, peak memory in MB summed over its process tree: PSS, or
    RSS where there is no PSS; sampled per 0.1 s). `seen`, when given, gets every process the tree
    held at a sample, pid -> create time (to find any that outlive the command).

    Raises:
      RuntimeError: with the tail of stderr when the command fails.
    """
    import psutil

    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(list(cmd), stdout=subprocess.DEVNULL, stderr=err, cwd=REPO,
                                env={**os.environ, "PYTHONPATH": REPO, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})})
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            total = 0
            try:
                for p in [root] + root.children(recursive=True):
                    try:
                        if seen is not None and p.pid not in seen:
                            seen[p.pid] = p.create_time()
                        total += _memory(p)
                    except psutil.Error:
                        pass
            except psutil.Error:
                pass
            peak = max(peak, total)
            time.sleep(0.1)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"{' '.join(cmd[:6])} ... failed (exit {proc.returncode}):\n"
                               f"{err.read().decode(errors='replace')[-3000:]}")
    return seconds, peak / 1e6


def compile_package() -> None:
    """Writes imagerecords' bytecode before anything is timed: an installed package has it (pip
    compiles at install), but a checkout run with PYTHONDONTWRITEBYTECODE compiles every module at
    every start, about half a second of each timed command's start-up on this machine."""
    import compileall

    compileall.compile_dir(os.path.join(REPO, "imagerecords"), quiet=1)


def build_cmd(inp: str, out: str, *extra: str) -> List[str]:
    return [sys.executable, "-m", "imagerecords", "build", "--input", inp, "--output", out, "--no_progress", *extra]


# --- codec limits (in this process: no TensorFlow, no Beam)


def _pillow_reencode(data: bytes) -> int:
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=90)
    return len(out.getvalue())


def _draft_decode(data: bytes) -> int:
    import io

    from PIL import Image

    img = Image.open(io.BytesIO(data))
    if img.format == "JPEG":
        img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
    img.load()
    return img.width


def _prepare(data: bytes) -> int:
    from imagerecords.pipeline.encode import image_codec as codec

    return len(codec.prepare_image(data).data)


def pool_rate(fn: Callable[[bytes], int], blobs: List[bytes], processes: bool) -> float:
    """Images per second of fn over every blob, one worker per core (threads or processes)."""
    pool_cls = ProcessPoolExecutor if processes else ThreadPoolExecutor
    with pool_cls(CORES) as pool:
        list(pool.map(fn, blobs[:CORES * 2]))  # warm: workers started, modules imported
        start = time.perf_counter()
        list(pool.map(fn, blobs, chunksize=16 if processes else 1))
        return len(blobs) / (time.perf_counter() - start)


def bench_codec(res: Results, blobs: List[bytes]):
    res.add("codec", "pillow_reencode_threads", pool_rate(_pillow_reencode, blobs, False), "img/s")
    res.add("codec", "pillow_reencode_processes", pool_rate(_pillow_reencode, blobs, True), "img/s",
            baseline="codec/pillow_reencode_threads")
    res.add("codec", "draft_decode_threads", pool_rate(_draft_decode, blobs, False), "img/s",
            baseline="codec/pillow_reencode_threads")
    res.add("codec", "prepare_image_passthrough_threads", pool_rate(_prepare, blobs, False), "img/s",
            baseline="codec/draft_decode_threads")


# --- the groups that run commands


def count_records(folder: str) -> int:
    """Records in every file under `folder`, read with tf.data (TFRecordDataset) in a process of its own."""
    files = sorted(os.path.join(d, f) for d, _, names in os.walk(folder) for f in names)
    code = ("import sys, tensorflow as tf\n"
            "print(sum(1 for _ in tf.data.TFRecordDataset(sys.argv[1:])))")
    out = subprocess.run([sys.executable, "-c", code, *files], capture_output=True, text=True, check=True,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    return int(out.stdout.split()[-1])


def _leftovers(seen: Dict[int, float]) -> List[str]:
    """Processes of `seen` (pid -> create time) still running, ended here: "pid name" of each."""
    import psutil

    left = []
    for pid, created in seen.items():
        try:
            p = psutil.Process(pid)
            if p.create_time() != created:  # the pid was reused by another process
                continue
            left.append(f"{pid} {p.name()}")
            p.kill()
        except psutil.Error:
            pass
    return left


def raydata_usable() -> Tuple[Optional[str], Optional[str]]:
    """(python, None) when Ray Data can be measured, else (None, the reason it is skipped). Ray runs
    under an interpreter of its own (ray[data] pins other numpy, pyarrow and protobuf versions than
    ours; write_tfrecords also needs tensorflow and crc32c there): IMAGERECORDS_RAY_PYTHON."""
    python = os.environ.get("IMAGERECORDS_RAY_PYTHON")
    if not python:
        return None, "set IMAGERECORDS_RAY_PYTHON to a python with ray[data]"
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return None, f"IMAGERECORDS_RAY_PYTHON={python} is not an executable file"
    return python, None


def bench_raydata(res: Results, root: str, work: str, n: int, python: str, r: int) -> bool:
    """True when measured (else a note says why not). Ray Data's files -> TFRecords pipeline (benchmarks.workloads raydata) on a local Ray with one
    CPU per core: wall time (imports, ray.init and shutdown included) and peak memory of the whole
    tree (the driver, GCS, raylet with its object store, the agents and the workers are all
    descendants of the workload's process); the records written counted back with tf.data."""
    folder = os.path.join(work, f"raydata-{r}")
    out, js = os.path.join(folder, "out"), os.path.join(folder, "raydata.json")
    seen: Dict[int, float] = {}
    try:
        try:
            wall, rss = run_watched([python, "-m", "benchmarks.workloads", "raydata", "--input", root, "--output", out,
                                     "--num_cpus", str(CORES), "--json", js], seen=seen)
        except RuntimeError as e:  # a peer's failure is a finding, not the end of the run
            res.notes.append(f"round {r + 1}: Ray Data failed: {str(e).strip().splitlines()[-1][:200]}")
            return False
        finally:
            time.sleep(0.5)  # ray.shutdown() has returned; give its children a moment to exit
            left = _leftovers(seen)
            if left:
                res.notes.append(f"round {r + 1}: Ray Data left {len(left)} processes running, killed: "
                                 f"{', '.join(left[:8])}")
        with open(js) as f:
            ray = json.load(f)
        written = count_records(out)
        if written != n:
            res.notes.append(f"round {r + 1}: Ray Data's output was short: tf.data read {written} records of {n} images")
        res.add("peers", "raydata_pass_wall", n / wall, "img/s")
        res.add("peers", "raydata_pass_peak_rss", rss, "MB", higher_is_better=False)
        res.notes.append(f"Ray Data {ray['ray_version']} ran read_binary_files -> map -> random_shuffle -> "
                         f"write_tfrecords on a local Ray, num_cpus={CORES}, {len(seen)} processes in its tree; "
                         f"ray.init took {ray['pass_init_seconds']:.1f} s")
        return True
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench_peers(res: Results, root: str, work: str, n: int, tfds: bool, quick: bool, r: int,
                ray_python: Optional[str] = None) -> bool:
    """The peers; True when Ray Data was measured in this round."""
    out = os.path.join(work, f"loop-{r}")
    js = os.path.join(work, "loop.json")
    wall, rss = run_watched([sys.executable, "-m", "benchmarks.workloads", "loop", "--input", root, "--output", out,
                             "--paths", "pass,reencode", "--json", js])
    with open(js) as f:
        loop = json.load(f)
    res.add("peers", "loop_passthrough", n / loop["pass_seconds"], "img/s")
    res.add("peers", "loop_reencode", n / loop["reencode_seconds"], "img/s")
    res.add("peers", "loop_peak_rss", rss, "MB", higher_is_better=False)
    shutil.rmtree(out, ignore_errors=True)
    raydata = bool(ray_python) and bench_raydata(res, root, work, n, ray_python, r)
    if not tfds:
        return raydata
    # The same DirectRunner setup our CLI picks locally; --quick runs in process to stay short.
    beam = (["--direct_running_mode=in_memory"] if quick else
            [f"--direct_num_workers={CORES}", "--direct_running_mode=multi_processing"])
    res.notes.append(f"TFDS Beam writer ran with {' '.join(beam)}")
    for path in ("pass", "reencode"):
        out = os.path.join(work, f"tfds-{path}-{r}")
        js = os.path.join(work, "tfds.json")
        try:
            wall, rss = run_watched([sys.executable, "-m", "benchmarks.workloads", "tfds", "--input", root,
                                     "--output", out, "--paths", path, "--json", js, *beam])
        except RuntimeError as e:  # a peer's failure is a finding, not the end of the run
            res.notes.append(f"round {r + 1}: TFDS {path} failed: {str(e).strip().splitlines()[-1][:200]}")
            shutil.rmtree(out, ignore_errors=True)
            continue
        res.add("peers", f"tfds_{path}_wall", n / wall, "img/s")
        res.add("peers", f"tfds_{path}_peak_rss", rss, "MB", higher_is_better=False)
        shutil.rmtree(out, ignore_errors=True)
    return raydata


# Our build configurations: the local default (the local engine, --writer shards: worker
# processes), the local engine on threads in one process, the same writer on Beam's DirectRunner
# (what a cluster runs), and Beam's own TFRecord sink.
BUILDS = (("shards", []), ("threads", ["--local_workers=0"]), ("direct", ["--runner=DirectRunner"]),
          ("beam", ["--writer", "beam"]))


def bench_builds(res: Results, root: str, work: str, n: int, keep: str, r: int, tfds: bool,
                 raydata: bool = False):
    for writer, extra in BUILDS:
        for path in ("pass", "reencode"):
            out = os.path.join(work, f"build-{writer}-{path}-{r}")
            args = extra + (["--reencode"] if path == "reencode" else [])
            wall, rss = run_watched(build_cmd(root, out, *args))
            name = f"{writer}_{path}"
            limit = "codec/pillow_reencode_threads" if path == "reencode" else "codec/prepare_image_passthrough_threads"
            res.add("build", f"{name}_img_s", n / wall, "img/s", baseline=limit)
            res.add("build", f"{name}_peak_rss", rss, "MB", higher_is_better=False,
                    baseline=f"peers/tfds_{path}_peak_rss" if tfds else None)
            if writer == "shards" and path == "pass" and not os.path.exists(keep):
                os.rename(out, keep)  # the reader's dataset
            else:
                shutil.rmtree(out, ignore_errors=True)
    for path in ("pass", "reencode"):
        ours = res.groups["build"][f"shards_{path}_img_s"]["runs"][-1]
        res.add("build", f"shards_{path}_vs_loop", ours, "img/s",
                baseline=f"peers/loop_{'passthrough' if path == 'pass' else 'reencode'}")
        if tfds:
            res.add("build", f"shards_{path}_vs_tfds", ours, "img/s", baseline=f"peers/tfds_{path}_wall")
        if raydata and path == "pass":  # Ray Data measured in this round (pass-through only)
            res.add("build", f"shards_{path}_vs_raydata", ours, "img/s", baseline=f"peers/raydata_{path}_wall")
        res.add("build", f"shards_{path}_vs_beam_writer", ours, "img/s", baseline=f"build/beam_{path}_img_s")
        res.add("build", f"shards_{path}_vs_direct", ours, "img/s", baseline=f"build/direct_{path}_img_s")
        res.add("build", f"shards_{path}_vs_threads", ours, "img/s", baseline=f"build/threads_{path}_img_s")


# PNG levels measured (libdeflate): 1 is the default; 6 is the level every PNG had before --png_level.
PNG_LEVELS = (0, 1, 3, 6)


def bench_encodings(res: Results, root: str, work: str, n: int, r: int, png_levels=PNG_LEVELS):
    """The lossless encodings against the default JPEG path, same corpus, same run; png at each
    of `png_levels`, its bytes also against level 6's (the level every PNG had before the setting)."""
    from imagerecords.pipeline.encode.image_codec import LEGACY_PNG_LEVEL, PNG_LEVEL

    runs = [("jpeg", None), ("keep", None)] + [("png", level) for level in png_levels]
    for encoding, level in runs:
        name = encoding if level is None else f"png{level}"
        out = os.path.join(work, f"build-{name}-{r}")
        wall, rss = run_watched(build_cmd(root, out, "--image_encoding", encoding,
                                          *(() if level is None else ("--png_level", str(level)))))
        res.add("encodings", f"{name}_img_s", n / wall, "img/s",
                baseline=None if encoding == "jpeg" else "encodings/jpeg_img_s")
        res.add("encodings", f"{name}_mb", _tree_mb(out), "MB", higher_is_better=False,
                baseline=None if encoding == "jpeg" else "encodings/jpeg_mb")
        shutil.rmtree(out, ignore_errors=True)
    if LEGACY_PNG_LEVEL in png_levels:
        for level in png_levels:
            if level != LEGACY_PNG_LEVEL:
                res.add("encodings", f"png{level}_mb_vs_png{LEGACY_PNG_LEVEL}",
                        res.groups["encodings"][f"png{level}_mb"]["runs"][-1], "MB", higher_is_better=False,
                        baseline=f"encodings/png{LEGACY_PNG_LEVEL}_mb")
                res.add("encodings", f"png{level}_img_s_vs_png{LEGACY_PNG_LEVEL}",
                        res.groups["encodings"][f"png{level}_img_s"]["runs"][-1], "img/s",
                        baseline=f"encodings/png{LEGACY_PNG_LEVEL}_img_s")
    if PNG_LEVEL not in png_levels:
        res.notes.append(f"encodings: the default --png_level {PNG_LEVEL} was not measured")


def _tree_mb(folder: str) -> float:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(folder) for f in files) / 1e6


def bench_arrays_group(res: Results, work: str, quick: bool, r: int, float_rows: int = 0, rgb_rows: int = 0,
                       storage_rows: int = 0):
    """NumPy input against the seed tutorial's serial loop (tf.train.Example + TFRecordWriter), and
    the records read back with plain tf.data + decode_raw / decode_png, same run."""
    import numpy as np

    from benchmarks import bench_arrays

    import tensorflow as tf

    rng = np.random.default_rng(r)
    float_rows = float_rows or (600 if quick else 200000)
    rgb_rows = rgb_rows or (500 if quick else 50000)
    folder = os.path.join(work, f"arrays-{r}")
    os.makedirs(folder, exist_ok=True)
    raw32 = lambda b: tf.reshape(tf.io.decode_raw(b, tf.float32), (28, 28))  # noqa: E731
    x = rng.random((float_rows, 28, 28), dtype=np.float32)
    runs = {"float32_28x28": bench_arrays.workload("float", x, rng.integers(0, 10, len(x)), folder, raw32, raw32)}
    x = rng.integers(0, 256, (rgb_rows, 32, 32, 3), dtype=np.uint8)
    runs["uint8_32x32x3"] = bench_arrays.workload(
        "rgb", x, rng.integers(0, 10, len(x)), folder, lambda b: tf.io.decode_png(b, channels=3),
        lambda b: tf.reshape(tf.io.decode_raw(b, tf.uint8), (32, 32, 3)))
    for name, w in runs.items():
        res.add("arrays", f"{name}_seed_loop_build", w["rows"] / w["seed_build_s"], "rows/s")
        res.add("arrays", f"{name}_seed_loop_per_core_build", w["rows"] / w["per_core_build_s"], "rows/s")
        res.add("arrays", f"{name}_build", w["rows"] / w["ours_build_s"], "rows/s",
                baseline=f"arrays/{name}_seed_loop_build")
        res.add("arrays", f"{name}_build_vs_per_core", w["rows"] / w["ours_build_s"], "rows/s",
                baseline=f"arrays/{name}_seed_loop_per_core_build")
        res.add("arrays", f"{name}_launcher_refs", w["rows"] / w["launcher_refs_s"], "rows/s")
        res.add("arrays", f"{name}_launcher", w["rows"] / w["launcher_rows_s"], "rows/s",
                baseline=f"arrays/{name}_launcher_refs")
        res.add("arrays", f"{name}_seed_read", w["seed_read_per_s"], "rows/s")
        res.add("arrays", f"{name}_read", w["ours_read_per_s"], "rows/s", baseline=f"arrays/{name}_seed_read")
    # Each storage of uint8 images against the loop a user writes for it (200,000 rows: start-up no
    # longer dominates): --image_encoding raw vs the seed's tobytes() loop, PNG vs a Pillow PNG loop.
    x = rng.integers(0, 256, (storage_rows or (500 if quick else 200000), 32, 32, 3), dtype=np.uint8)
    s = bench_arrays.storages(x, rng.integers(0, 10, len(x)), folder)
    res.add("arrays", "uint8_32x32x3_seed_raw_loop_build", s["rows"] / s["seed_raw_loop_s"], "rows/s")
    res.add("arrays", "uint8_32x32x3_raw_build", s["rows"] / s["ours_raw_s"], "rows/s",
            baseline="arrays/uint8_32x32x3_seed_raw_loop_build")
    res.add("arrays", "uint8_32x32x3_pillow_png_loop_build", s["rows"] / s["pillow_png_loop_s"], "rows/s")
    res.add("arrays", "uint8_32x32x3_png_build", s["rows"] / s["ours_png_s"], "rows/s",
            baseline="arrays/uint8_32x32x3_pillow_png_loop_build")
    shutil.rmtree(folder, ignore_errors=True)


def bench_startup(res: Results, tiny_root: str, work: str, r: int):
    modes = [("default", []), ("in_memory", ["--direct_running_mode=in_memory", "--direct_num_workers=1"]),
             ("multi_threading", ["--direct_running_mode=multi_threading", f"--direct_num_workers={CORES}"]),
             ("multi_processing", ["--direct_running_mode=multi_processing", f"--direct_num_workers={CORES}"])]
    for mode, extra in modes:
        out = os.path.join(work, f"start-{mode}-{r}")
        wall, _ = run_watched(build_cmd(tiny_root, out, *extra))
        res.add("startup", f"build16_{mode}", wall, "s", higher_is_better=False,
                baseline=None if mode == "default" else "startup/build16_default")
        shutil.rmtree(out, ignore_errors=True)


def _link_tree(files: Sequence[str], src_root: str, dst_root: str) -> None:
    """`files` (under `src_root`) at the same relative paths under `dst_root`: hard links where the
    file system allows (no copy of the corpus), copies elsewhere."""
    for path in files:
        dst = os.path.join(dst_root, os.path.relpath(path, src_root))
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        try:
            os.link(path, dst)
        except OSError:
            shutil.copyfile(path, dst)


def _settle(root: str) -> None:
    """Waits until every file under `root` changed longer ago than --append's clock slack: a
    dataset's files are older than the build that stores them, and the benchmark must not time
    the re-read an append gives files changed (here: just linked) as its base build started."""
    from imagerecords.pipeline.publish.appending import _CLOCK_SLACK_NS

    newest = max(os.stat(os.path.join(d, f)).st_ctime_ns for d, _, files in os.walk(root) for f in files)
    while time.time_ns() < newest + _CLOCK_SLACK_NS + 10**8:
        time.sleep(0.1)


def bench_append(res: Results, work: str, n: int, added: int, seed: int, classes: int, cache: str, r: int):
    """A dataset of `n` images, then `added` new ones appended (timed), against a full rebuild
    (--overwrite) of all n + added in the same run. The new images are spread over every class."""
    corpus = corpus_lib.ensure_corpus(n + added, seed, classes, cache)
    step = len(corpus.files) / max(added, 1)
    new = {int(i * step) for i in range(added)}
    tree, out = os.path.join(work, f"append-tree-{r}"), os.path.join(work, f"append-out-{r}")
    _link_tree([f for i, f in enumerate(corpus.files) if i not in new], corpus.root, tree)
    _settle(tree)
    wall, _ = run_watched(build_cmd(tree, out))
    res.add("append", f"build{n}_wall", wall, "s", higher_is_better=False)
    _link_tree([f for i, f in enumerate(corpus.files) if i in new], corpus.root, tree)
    wall, rss = run_watched(build_cmd(tree, out, "--append"))
    res.add("append", f"append{added}_wall", wall, "s", higher_is_better=False,
            baseline=f"append/rebuild{n + added}_wall")
    res.add("append", f"append{added}_peak_rss", rss, "MB", higher_is_better=False)
    with open(os.path.join(out, "manifest.json")) as f:
        records = sum(s["num_examples"] for s in json.load(f)["splits"].values())
    if records != n + added:
        raise RuntimeError(f"the appended dataset holds {records} records, not {n + added}")
    wall, _ = run_watched(build_cmd(tree, out, "--overwrite"))
    res.add("append", f"rebuild{n + added}_wall", wall, "s", higher_is_better=False)
    shutil.rmtree(tree, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


def write_manifest(path: str, rows: int, files: List[str]):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "key"])
        for i in range(rows):
            w.writerow([files[i % len(files)], f"c{i % 10}", f"row{i:09d}"])


def bench_memory(res: Results, work: str, sizes: Sequence[int], r: int, modes: Sequence[str]):
    tiny = corpus_lib.ensure_tiny_images()
    for mode in modes:
        extra = [] if mode == "default" else [f"--direct_running_mode={mode}", f"--direct_num_workers={CORES}"]
        peaks = {}
        for rows in (16, *sizes):
            man = os.path.join(work, f"manifest-{rows}.csv")
            if not os.path.exists(man):
                write_manifest(man, rows, tiny)
            out = os.path.join(work, f"mem-{mode}-{rows}-{r}")
            wall, peaks[rows] = run_watched(build_cmd(man, out, *extra))
            shutil.rmtree(out, ignore_errors=True)
            if rows != 16:
                res.add("memory", f"{mode}_rows{rows}_peak_rss", peaks[rows], "MB", higher_is_better=False)
                res.add("memory", f"{mode}_rows{rows}_img_s", rows / wall, "img/s")
                res.add("memory", f"{mode}_rows{rows}_kib_per_image", (peaks[rows] - peaks[16]) * 1e6 / 1024 / rows,
                        "KiB", higher_is_better=False)
        res.add("memory", f"{mode}_base_peak_rss", peaks[16], "MB", higher_is_better=False)
        lo, hi = sizes[0], sizes[-1]
        if hi > lo:
            res.add("memory", f"{mode}_slope_kib_per_image", max((peaks[hi] - peaks[lo]) * 1e6 / 1024 / (hi - lo), 1e-3),
                    "KiB", higher_is_better=False)


def bench_scale(res: Results, work: str, build_rows: int, plan_rows: int):
    tiny = corpus_lib.ensure_tiny_images()
    peaks = {}
    for rows in (16, build_rows):
        man = os.path.join(work, f"manifest-{rows}.csv")
        if not os.path.exists(man):
            write_manifest(man, rows, tiny)
        out = os.path.join(work, f"scale-{rows}")
        wall, peaks[rows] = run_watched(build_cmd(man, out))
        shutil.rmtree(out, ignore_errors=True)
        if rows != 16:
            res.add("scale", f"build_rows{rows}_wall", wall, "s", higher_is_better=False)
            res.add("scale", f"build_rows{rows}_peak", peaks[rows], "MB", higher_is_better=False)
            res.add("scale", f"build_rows{rows}_bytes_per_row", (peaks[rows] - peaks[16]) * 1e6 / rows, "B",
                    higher_is_better=False, baseline="scale/promise_bytes_per_row")
    res.add("scale", "build_base_peak", peaks[16], "MB", higher_is_better=False)
    res.add("scale", "promise_bytes_per_row", 1024, "B", higher_is_better=False)
    man = os.path.join(work, f"manifest-{plan_rows}.csv")
    if not os.path.exists(man):
        write_manifest(man, plan_rows, tiny)
    js = os.path.join(work, "plan.json")
    run_watched([sys.executable, "-m", "benchmarks.bench_scale", "--manifest", man, "--json", js])
    os.remove(man)
    with open(js) as f:
        pl = json.load(f)
    for step in ("list", "assign", "plan", "take", "total"):
        res.add("scale", f"plan_rows{plan_rows}_{step}", pl[f"{step}_s"], "s", higher_is_better=False)
    res.add("scale", f"plan_rows{plan_rows}_peak_rss", pl["peak_rss_mb"], "MB", higher_is_better=False)
    res.add("scale", f"plan_rows{plan_rows}_bytes_per_row", pl["bytes_per_row"], "B", higher_is_better=False,
            baseline="scale/promise_bytes_per_row")
    res.notes.append(f"scale: planning pass of {pl['rows']:,} rows into {pl['shards']} shards, launcher base RSS "
                     f"{pl['base_rss_mb']:.0f} MB")


def bench_reader(res: Results, data: str, work: str, batches: int, repeats: int):
    js = os.path.join(work, "reader.json")
    run_watched([sys.executable, "-m", "benchmarks.workloads", "reader", "--data", data, "--json", js,
                 "--batches", str(batches), "--repeats", str(repeats)])
    with open(js) as f:
        rd = json.load(f)
    for name in ("decode_limit", "plain_train", "reader_train", "reader_train_uint8", "reader_eval"):
        for v in rd[f"{name}_img_s_runs"]:
            base = None if name == "decode_limit" else "reader/decode_limit_img_s"
            res.add("reader", f"{name}_img_s", v, "img/s", baseline=base)
    for v in rd["crop_resize_limit_img_s_runs"]:
        res.add("reader", "crop_resize_limit_img_s", v, "img/s", baseline="reader/decode_limit_img_s")
    for v in rd["reader_train_uint8_img_s_runs"]:
        res.add("reader", "reader_train_uint8_vs_crop_resize_limit", v, "img/s",
                baseline="reader/crop_resize_limit_img_s")
    for v in rd["reader_train_img_s_runs"]:
        res.add("reader", "reader_train_vs_plain", v, "img/s", baseline="reader/plain_train_img_s")
    for name in ("train", "eval"):
        res_base = f"reader/reader_{name}_interleave_img_s"
        for v in rd[f"reader_{name}_interleave_img_s_runs"]:
            res.add("reader", f"reader_{name}_interleave_img_s", v, "img/s")
        for v in rd[f"reader_{name}_img_s_runs"]:
            res.add("reader", f"reader_{name}_vs_interleave", v, "img/s", baseline=res_base)
        # CPU per image moves less with the neighbours' load than images per second do.
        for v in rd[f"reader_{name}_interleave_cpu_ms_per_img_runs"]:
            res.add("reader", f"reader_{name}_interleave_cpu_ms_per_img", v, "ms", higher_is_better=False)
        for v in rd[f"reader_{name}_cpu_ms_per_img_runs"]:
            res.add("reader", f"reader_{name}_cpu_ms_per_img_vs_interleave", v, "ms", higher_is_better=False,
                    baseline=f"reader/reader_{name}_interleave_cpu_ms_per_img")
    res.add("reader", "ttfb_train", rd["ttfb_train_s"], "s", higher_is_better=False)
    res.add("reader", "ttfb_train_make_dataset", rd["ttfb_train_make_dataset_s"], "s", higher_is_better=False)
    res.add("reader", "ttfb_eval", rd["ttfb_eval_s"], "s", higher_is_better=False)


def bench_train(res: Results, data: str, work: str, model: str, quick: bool, repeats: int):
    js = os.path.join(work, "train.json")
    size = ["--steps", "2", "--batch_size", "8", "--image_size", "64"] if quick else []
    run_watched([sys.executable, "-m", "benchmarks.workloads", "train", "--data", data, "--json", js,
                 "--model", model, "--repeats", str(repeats), *size])
    with open(js) as f:
        tr = json.load(f)
    res.notes.append(f"training step: {model}, batch {tr['batch_size']}, {tr['image_size']} px, {tr['steps']} steps, "
                     f"{tr['gpus']} GPU(s), {'mixed bfloat16' if tr['mixed_bfloat16'] else 'float32'}")
    for v in tr["plain_img_s_runs"]:
        res.add("train", "plain_img_s", v, "img/s")
    for v in tr["reader_img_s_runs"]:
        res.add("train", "reader_img_s", v, "img/s", baseline="train/plain_img_s")
    for name in ("reader", "plain"):
        for v in tr[f"{name}_input_wait_share_runs"]:
            res.add("train", f"{name}_input_wait_share", v, "share", higher_is_better=False)


def tfds_usable() -> Optional[str]:
    """None when TFDS's Beam path can run here, else the reason it is skipped."""
    try:
        import importlib.util

        if importlib.util.find_spec("tensorflow_datasets") is None:
            return "tensorflow_datasets is not installed"
    except ImportError as e:
        return f"tensorflow_datasets cannot be imported: {e}"
    return None


GROUPS = ("codec", "peers", "tfds", "build", "encodings", "arrays", "startup", "memory", "append", "scale", "reader", "flink",
          "web")
CORPUS_GROUPS = ("codec", "peers", "tfds", "build", "encodings", "startup", "reader", "flink", "web")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, help="corpus size (default 4000; --quick: 24)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    p.add_argument("--repeats", type=int, default=1, help="rounds of every measurement, interleaved")
    p.add_argument("--manifest_rows", help="row counts of the memory builds (default 20000,100000; --quick: 200,600)")
    p.add_argument("--memory_modes", default="default,multi_processing",
                   help="engines of the memory builds: default (local engine) and DirectRunner modes")
    p.add_argument("--float_rows", type=int, help="rows of the arrays group's float32 28x28 build (default 200000)")
    p.add_argument("--rgb_rows", type=int, help="rows of the arrays group's uint8 32x32x3 build (default 50000)")
    p.add_argument("--storage_rows", type=int, help="rows of the arrays group's raw and PNG storage builds against "
                   "their users' loops (default 200000)")
    p.add_argument("--scale_rows", type=int, help="rows of the scale group's build (default 1000000; --quick: 2000)")
    p.add_argument("--plan_rows", type=int, help="rows of the scale group's planning pass (default 10000000; "
                                                 "--quick: 5000)")
    p.add_argument("--reader_batches", type=int, help="batches per reader measurement (default 16; --quick: 1)")
    p.add_argument("--train_model", choices=("resnet50", "tiny"),
                   help="also time a training step of this model fed by the reader and by plain tf.data "
                        "(the train group; meant for a machine with an accelerator)")
    p.add_argument("--append_images", type=int,
                   help="images of the append group's dataset before 1,000 more are appended (default 20000; "
                        "--quick: 200)")
    p.add_argument("--append_added", type=int,
                   help="images the append group appends (default 1000; --quick: 50)")
    p.add_argument("--skip", default="", help="comma-separated groups to skip: " + ",".join(GROUPS))
    p.add_argument("--only", default="", help="comma-separated groups to run (the others are skipped)")
    p.add_argument("--flink_sizes", default="1000,4000", help="image counts of the flink group's builds (at most --images)")
    p.add_argument("--cache", default=corpus_lib.CACHE, help="where corpora are kept")
    p.add_argument("--json", help="write every figure here")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes and TFDS on in_memory DirectRunner: a smoke run of every figure")
    a = p.parse_args(argv)
    quick = {"images": 24, "manifest_rows": "200,600", "reader_batches": 1, "append_images": 200,
             "append_added": 50, "scale_rows": 2000, "plan_rows": 5000}
    full = {"images": 4000, "manifest_rows": "20000,100000", "reader_batches": 16, "append_images": 20000,
            "append_added": 1000, "scale_rows": 1000000, "plan_rows": 10000000}
    for key, value in (quick if a.quick else full).items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    skip = set(filter(None, a.skip.split(",")))
    if a.only:
        skip |= set(GROUPS) - set(filter(None, a.only.split(",")))
    sizes = [int(x) for x in a.manifest_rows.split(",")]
    res = Results()
    t0 = time.perf_counter()
    compile_package()
    # The groups that read the --images corpus (the append group draws its own size).
    corpus = corpus_lib.ensure_corpus(a.images if set(CORPUS_GROUPS) - skip or a.train_model else 1, a.seed,
                                      a.classes, a.cache)
    res.notes.append(f"corpus: {len(corpus.files)} images in {corpus.classes} classes, {corpus.num_bytes / 1e6:.1f} MB "
                     f"(mean {corpus.mean_kb:.0f} KB), kinds {corpus.kinds}, at {corpus.root}")
    print(res.notes[-1], f"(ready after {time.perf_counter() - t0:.0f} s)", flush=True)
    reason = tfds_usable() if "tfds" not in skip else "skipped with --skip tfds"
    if reason:
        res.notes.append(f"TFDS Beam writer not measured: {reason}")
    ray_python, ray_reason = raydata_usable()
    if ray_reason and "peers" not in skip:
        res.notes.append(f"Ray Data not measured ({ray_reason})")
    work = tempfile.mkdtemp(prefix="imagerecords-bench-")
    try:
        tiny_root = os.path.join(work, "tree16")
        for path in corpus.files[:16]:
            dst = os.path.join(tiny_root, os.path.relpath(path, corpus.root))
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copyfile(path, dst)
        blobs = []
        for path in corpus.files:
            with open(path, "rb") as f:
                blobs.append(f.read())
        data = os.path.join(work, "reader-ds")
        n = len(corpus.files)
        for r in range(a.repeats):
            if "codec" not in skip:
                bench_codec(res, blobs)
            raydata = False
            if "peers" not in skip:
                raydata = bench_peers(res, corpus.root, work, n, reason is None, a.quick, r, ray_python)
            if "build" not in skip:
                bench_builds(res, corpus.root, work, n, data, r, reason is None, raydata)
            if "encodings" not in skip:
                bench_encodings(res, corpus.root, work, n, r)
            if "arrays" not in skip:
                bench_arrays_group(res, work, a.quick, r, a.float_rows or 0, a.rgb_rows or 0, a.storage_rows or 0)
            if "startup" not in skip:
                bench_startup(res, tiny_root, work, r)
            if "web" not in skip:
                from benchmarks import bench_web

                bench_web.bench_web(res, corpus.files, corpus.root, work, r, run_watched, build_cmd)
                bench_web.bench_web_optouts(res, corpus.files, corpus.root, work, r, run_watched, build_cmd)
            if "memory" not in skip:
                bench_memory(res, work, sizes, r, a.memory_modes.split(","))
            if "append" not in skip:
                bench_append(res, work, a.append_images, a.append_added, a.seed, a.classes, a.cache, r)
            if "scale" not in skip and r == 0:  # once: minutes, and one figure is enough for a bound
                bench_scale(res, work, a.scale_rows, a.plan_rows)
            print(f"round {r + 1}/{a.repeats} done after {time.perf_counter() - t0:.0f} s", flush=True)
        if "flink" not in skip:
            from benchmarks import bench_flink

            sizes = [size for size in map(int, a.flink_sizes.split(",")) if size <= n] or [n]
            bench_flink.bench_flink(res, corpus.files, corpus.root, work, run_watched, build_cmd, sizes)
        if "reader" not in skip:
            if not os.path.exists(data):
                run_watched(build_cmd(corpus.root, data))
            bench_reader(res, data, work, a.reader_batches, max(a.repeats, 3))
        if a.train_model:
            if not os.path.exists(data):
                run_watched(build_cmd(corpus.root, data))
            bench_train(res, data, work, a.train_model, a.quick, max(a.repeats, 2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    res.notes.append(f"benchmark wall time {time.perf_counter() - t0:.0f} s")
    res.print()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res.to_json(), f, indent=1)
    return 0


if __name__ == "__main__":
    # A TERM (a timeout, a killed terminal) unwinds like Ctrl-C, so the Flink cluster and the
    # work folder are cleaned up by the same finally blocks.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.exit(main())
