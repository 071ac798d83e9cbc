"""The near-duplicate check's cost: a pass-through build with --near_duplicates report against off.

Usage:
    python -m benchmarks.bench_near --images 400 [--repeats 5] [--json out.json]

Builds the benchmark corpus (benchmarks/corpus.py: photo-like JPEGs, a few PNG, grey and CMYK ones)
in this process through the launcher (imports paid once, before the first timing), alternating
report and off so that a noisy shared machine weighs on both alike; prints each setting's median
[min-max] wall time, the CPU time ratio (steadier where other processes share the cores), the
hash's cost per image inside codec.prepare_image alone, and the near groups found in the corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

from benchmarks.corpus import ensure_corpus


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _build(root: str, out: str, setting: str, workers: Optional[int]) -> Tuple[float, float]:
    """(wall seconds, CPU seconds of this process and its ended workers) of one build."""
    from imagerecords.cli.launcher import run

    shutil.rmtree(out, ignore_errors=True)
    extra = ["--local_workers", str(workers)] if workers is not None else []
    start, cpu = time.perf_counter(), _cpu()
    run(["--input", root, "--output", out, "--no_progress", "--near_duplicates", setting, *extra])
    return time.perf_counter() - start, _cpu() - cpu


def codec_cost(files: Sequence[str]) -> Dict[str, float]:
    """CPU seconds per image of codec.prepare_image without and with the hash, in one thread: the
    hash's own cost, free of the build's I/O and of other processes on a shared machine."""
    from imagerecords.pipeline.encode import image_codec as codec

    data = []
    for path in files:
        with open(path, "rb") as f:
            data.append(f.read())
    out = {}
    for perceptual in (False, True, False, True):
        start = time.process_time()
        for d in data:
            try:
                codec.prepare_image(d, codec.ImageOptions(), perceptual)
            except codec.ImageError:
                pass
        out[str(perceptual)] = min(out.get(str(perceptual), 1e9), (time.process_time() - start) / len(data))
    return {"plain_ms": 1e3 * out["False"], "hashed_ms": 1e3 * out["True"], "ratio": out["True"] / out["False"]}


def measure(images: int, repeats: int, workers: Optional[int] = None) -> Dict[str, object]:
    corpus = ensure_corpus(images)
    times: Dict[str, List[float]] = {"off": [], "report": []}
    cpu: Dict[str, List[float]] = {"off": [], "report": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        _build(corpus.root, out, "off", workers)  # warm-up: imports, page cache
        for i in range(repeats):
            for setting in (("off", "report") if i % 2 == 0 else ("report", "off")):
                wall, used = _build(corpus.root, out, setting, workers)
                times[setting].append(wall)
                cpu[setting].append(used)
        with open(os.path.join(out, "duplicates.jsonl"), encoding="utf-8") as f:
            near = [json.loads(line) for line in f if '"kind": "near"' in line]
    median = {k: statistics.median(v) for k, v in times.items()}
    cpu_median = {k: statistics.median(v) for k, v in cpu.items()}
    return {"images": len(corpus.files), "repeats": repeats, "seconds": times, "median": median,
            "ratio": median["report"] / median["off"], "cpu_seconds": cpu, "cpu_median": cpu_median,
            "cpu_ratio": cpu_median["report"] / cpu_median["off"], "codec": codec_cost(corpus.files),
            "near_groups": len(near),
            "near_members": sum(len(r["members"]) for r in near)}


def main(argv: Optional[Sequence[str]] = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--local_workers", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    figures = measure(args.images, args.repeats, args.local_workers)
    for k in ("off", "report"):
        v = figures["seconds"][k]
        print(f"{k:>7}: {figures['median'][k]:.2f} s [{min(v):.2f}-{max(v):.2f}], "
              f"{figures['images'] / figures['median'][k]:.0f} images/s")
    print(f"  ratio report/off: wall {figures['ratio']:.3f}, CPU {figures['cpu_ratio']:.3f} "
          f"({figures['cpu_median']['off']:.2f} s against {figures['cpu_median']['report']:.2f} s)")
    c = figures["codec"]
    print(f"  prepare_image per image, one thread: {c['plain_ms']:.2f} ms, with the hash {c['hashed_ms']:.2f} ms "
          f"({c['ratio']:.3f}x)")
    print(f"  near groups found: {figures['near_groups']} ({figures['near_members']} images)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2, sort_keys=True)


if __name__ == "__main__":
    main()
