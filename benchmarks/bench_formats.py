"""Record formats on the same photos: an ArrayRecord build against the TFRecord build, and Grain reading each.

Usage:
    python -m benchmarks.bench_formats [--images 4000] [--repeats 3] [--json F]

The benchmark corpus (benchmarks/corpus.py) is built by the real CLI (`python -m imagerecords
build`, local engine, pass-through) with `--record_format tfrecord --write_index` and with
`--record_format array_record`, in turn, each round: wall time (imports included), images/s and the
peak RSS of the build's process tree. Then each dataset's train split is read once in a shuffled
order by Grain in one process (so images/s is per core):

  records   the serialized records: imagerecords.grain.RecordSource.record(i) over TFRecord (one
            ranged read per record, both CRCs checked) against grain.sources.ArrayRecordDataSource
            over the ArrayRecord files (nothing of ours)
  decoded   the same plus the Example parsed and its JPEG decoded to an RGB array: RecordSource[i]
            against ArrayRecordDataSource + the same Example parser (imagerecords.format.schema, no
            TensorFlow) + Pillow, so that only the record format differs

with the reading process's peak RSS. Figures are medians [min-max] over rounds, and the ratios
(ArrayRecord / TFRecord) pair figures taken side by side: the machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List

from benchmarks import corpus as corpus_lib
from benchmarks.bench_build import run_build

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("tfrecord", "array_record")

# One read of a split in one process: prints {"seconds", "records", "peak_mb"}.
_READ = r"""
import io, json, os, resource, sys, time
import grain
import numpy as np

out, fmt, mode = sys.argv[1], sys.argv[2], sys.argv[3]
if fmt == "tfrecord":
    from imagerecords.grain import RecordSource
    source = RecordSource(out, "train")
    get = source.record if mode == "records" else source.__getitem__
else:
    from PIL import Image
    from imagerecords.format import schema  # the parser RecordSource uses: only the format differs
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    source = grain.sources.ArrayRecordDataSource(
        [os.path.join(out, s["filename"]) for s in manifest["splits"]["train"]["shards"]])

    def decoded(i):
        example = schema.parse_example(source[i])
        return {"image": np.asarray(Image.open(io.BytesIO(example["image"][0])).convert("RGB")),
                "label": example["label"][0]}

    get = source.__getitem__ if mode == "records" else decoded
order = list(grain.MapDataset.range(len(source)).shuffle(seed=0))
start = time.perf_counter()
for i in order:
    get(i)
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "records": len(order),
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def build(images_root: str, out: str, fmt: str, shards: int):
    extra = ["--write_index"] if fmt == "tfrecord" else []
    return run_build(["--input", images_root, "--output", out, "--splits", "train=1.0", "--num_shards", str(shards),
                      "--no_progress", "--max_reject_fraction", "0.05", "--overwrite", "--record_format", fmt,
                      *extra])


def read(out: str, fmt: str, mode: str) -> Dict[str, float]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-c", _READ, out, fmt, mode], capture_output=True, text=True, env=env,
                          cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"reading {fmt} ({mode}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _summary(values: List[float]) -> str:
    return f"{statistics.median(values):9.1f} [{min(values):.1f}-{max(values):.1f}]"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=4000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    corpus = corpus_lib.ensure_corpus(args.images)
    n = len(corpus.files)
    figures: Dict[str, List[float]] = {}

    def add(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for fmt in FORMATS:
                seconds, peak = build(corpus.root, os.path.join(tmp, fmt), fmt, args.shards)
                add(f"build {fmt} images/s", n / seconds)
                add(f"build {fmt} peak MB", peak)
            for mode in ("records", "decoded"):
                for fmt in FORMATS:
                    got = read(os.path.join(tmp, fmt), fmt, mode)
                    add(f"read {mode} {fmt} images/s", got["records"] / got["seconds"])
                    add(f"read {mode} {fmt} peak MB", got["peak_mb"])
        sizes = {}  # the published version's shards (--overwrite keeps the earlier one beside it)
        for fmt in FORMATS:
            with open(os.path.join(tmp, fmt, "manifest.json")) as f:
                sizes[fmt] = sum(s["num_bytes"] for s in json.load(f)["splits"]["train"]["shards"])
    print(f"{n} images ({corpus.num_bytes / 1e6:.0f} MB), {args.shards} shards, {args.repeats} round(s); "
          "median [min-max]")
    for key, values in figures.items():
        print(f"  {key:<40} {_summary(values)}")
    ratios = {}
    for what in ("build {} images/s", "read records {} images/s", "read decoded {} images/s"):  # {}: the format
        pairs = [a / t for a, t in zip(figures[what.format("array_record")], figures[what.format("tfrecord")])]
        ratios[what.format("array_record / tfrecord")] = pairs
        print(f"  {what.format('array_record / tfrecord'):<40} {statistics.median(pairs):9.2f}x "
              f"[{min(pairs):.2f}-{max(pairs):.2f}]")
    print(f"  shard bytes: tfrecord {sizes['tfrecord'] / 1e6:.1f} MB, array_record {sizes['array_record'] / 1e6:.1f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"images": n, "figures": figures, "ratios": ratios, "shard_bytes": sizes}, f, indent=2)


if __name__ == "__main__":
    main()
