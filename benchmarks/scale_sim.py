"""Internet scale on paper: builds the manifest of N synthetic images and times the commit's and a reader's use of it.

Usage:
    python -m benchmarks.scale_sim --images 10000000,100000000,1000000000 --json sums.json

For each size the script works out the shard count at the default shard size (planning.choose_num_shards),
makes one synthetic shard result per shard (a count, a size, a sha256, a label histogram drawn
uniformly over --classes), turns them into manifest.json with the commit's own steps
(BuildResults.manifest, the commit record, TFDS's metadata files, Manifest.dumps), and loads that
file in a fresh process with the reader's loader (reader.load_info), reporting its wall time and
the RSS it added. A split of --columns_from shards or more is written as columns with its
histograms in a side file (format 3, as the commit does); such a manifest is always built, and where
the histograms would exceed --max_label_pairs (shard, label) pairs each shard gets a one-label
histogram instead (the summed histogram still spans every class; only the side file's size is then
extrapolated). Row-form manifests over --max_label_pairs are not built: their figures are
extrapolated, linearly in shards, from the largest built size, and marked so. Requests the commit makes per file on an object store are counted, and turned into
time with --request_ms (an assumption, printed beside the figure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a reader host runs: the loader alone, timed after its imports.
_LOAD = """
import json, sys, time
from imagerecords.reader.info import load_info
def status(field):
    # VmHWM is this process image's peak; ru_maxrss would carry the launcher's peak across exec.
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ':'))
base = status('VmRSS')
start = time.perf_counter()
info = load_info(sys.argv[1])
seconds = time.perf_counter() - start
peak = max(status('VmHWM'), status('VmRSS'))
print(json.dumps({"load_s": seconds, "added_mb": (peak - base) / 1e6,
                  "records": sum(s.num_examples for s in info.splits.values()),
                  "shards": sum(len(s.shards) for s in info.splits.values())}))
"""


def ref_bytes(uri_length: int = 60) -> int:
    """Bytes of one ref as the shuffle carries it: the registered ImageRefCoder's encoding of an
    ImageNet-like gs:// ref, plus its 64-bit shuffle hash (a varint, up to 10 bytes)."""
    from imagerecords.pipeline.refs import ImageRef
    from imagerecords.transforms.coders import ImageRefCoder

    uri = "gs://bucket/" + "x" * max(uri_length - 12, 1)
    ref = ImageRef(key=uri[12:], uri=uri, label="n01440764", split="train", size=110_000, label_id=0)
    return len(ImageRefCoder().encode(ref)) + 10


def shard_results(images: int, num_shards: int, image_bytes: int, classes: int, seed: int = 0,
                  one_label: bool = False):
    """One synthetic ShardResult per shard of one 'train' split, sizes as planning cuts them
    (`one_label`: each shard's records all under label `index % classes`, a histogram of one pair)."""
    import numpy as np

    from imagerecords.format.manifest import Shard
    from imagerecords.pipeline import planning
    from imagerecords.pipeline.dataset_files import ShardResult

    rng = np.random.default_rng(seed)
    out = []
    for i in range(num_shards):
        count = images * (i + 1) // num_shards - images * i // num_shards
        labels = ()
        if classes and one_label:
            labels = ((i % classes, count),)
        elif classes:
            hist = np.bincount(rng.integers(0, classes, count), minlength=classes)
            ids = np.flatnonzero(hist)
            labels = tuple(zip(ids.tolist(), hist[ids].tolist()))
        name = planning.shard_name("images", "train", i, num_shards)
        out.append(ShardResult("train", Shard(index=i, filename=name, count=count, num_bytes=count * (image_bytes + 16),
                                              sha256=hashlib.sha256(name.encode()).hexdigest(), labels=labels,
                                              passthrough=count)))
    return out


def build_manifest(folder: str, images: int, num_shards: int, image_bytes: int, classes: int,
                   columns_from: Optional[int] = None, one_label: bool = False) -> Dict[str, float]:
    """Writes `folder`/manifest.json (and a columnar split's side file) through the commit's own
    steps; returns their times and sizes."""
    from imagerecords.format.manifest import COLUMNS_FROM, dumps
    from imagerecords.pipeline import dataset_files, publish
    from imagerecords.pipeline.config import BuildConfig

    start = time.perf_counter()
    shards = shard_results(images, num_shards, image_bytes, classes, one_label=one_label)
    made = time.perf_counter()
    names = [f"c{i:05d}" for i in range(max(classes, 1))]
    config = BuildConfig(input="gs://bucket/in.csv", output=folder)
    results = publish.BuildResults(
        build_id="20260101-000000-sim", name="images", schema="tfds", seed=0, parameters=config.to_json(),
        versions={"imagerecords": "sim"}, max_reject_fraction=0.01,
        labels={"names": names, "offset": 0, "integer": False}, shards=shards, num_rejected=0, num_skipped=0)
    t0 = time.perf_counter()
    results_json = dumps(results.to_json())  # staging/results.json, which the commit reads back
    t1 = time.perf_counter()
    publish.BuildResults.from_json(json.loads(results_json))
    t2 = time.perf_counter()
    manifest = results.manifest(created="2026-01-01T00:00:00+00:00")
    manifest, side_files = manifest.with_side_files(COLUMNS_FROM if columns_from is None else columns_from)
    record = dumps({"manifest": manifest.to_json(), "build_id": results.build_id})
    t3 = time.perf_counter()
    meta = dataset_files.metadata_files(manifest)
    data = manifest.dumps()
    t4 = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    for name, content in [*side_files, *meta]:
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(content)
    with open(os.path.join(folder, "manifest.json"), "wb") as f:
        f.write(data)
    t5 = time.perf_counter()
    return {"synthesize_s": made - start, "results_write_s": t1 - t0, "results_read_s": t2 - t1,
            "manifest_and_record_s": t3 - t2, "metadata_and_dumps_s": t4 - t3, "write_s": t5 - t4,
            "commit_manifest_steps_s": (t5 - t4) + (t4 - t2), "results_mb": len(results_json) / 1e6,
            "record_mb": len(record) / 1e6, "manifest_mb": len(data) / 1e6,
            "metadata_mb": sum(len(c) for _, c in meta) / 1e6,
            "side_file_mb": sum(len(c) for _, c in side_files) / 1e6, "columns": bool(side_files),
            "label_pairs": sum(len(r.shard.labels) for r in shards)}


def load_in_reader(folder: str) -> Dict[str, float]:
    """A fresh process loads the manifest with the reader's loader: wall time and RSS it added."""
    out = subprocess.run([sys.executable, "-c", _LOAD, folder], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO}, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"loading {folder} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sums(images: int, image_bytes: int, classes: int, target_shard_mb: float, min_shards: int,
         request_ms: float, parallel_requests: int) -> Dict[str, float]:
    """The figures that need no build: shards, refs through the shuffle, object-store requests."""
    from imagerecords.pipeline import planning

    shards = planning.choose_num_shards(images, images * image_bytes, None, target_shard_mb, min_shards)
    per_ref = ref_bytes()
    # On an object store the commit, per shard: one check (a metadata read, or today a full read of
    # the shard) and a rename (copy + delete); renames run one after another today.
    renames = 2 * shards
    return {"images": images, "shards": shards, "images_per_shard": images / shards,
            "dataset_tb": images * image_bytes / 1e12, "ref_bytes": per_ref, "shuffle_gb": images * per_ref / 1e9,
            "commit_check_requests": shards, "commit_rename_requests": renames,
            "commit_renames_serial_h": renames * request_ms / 1e3 / 3600,
            "commit_renames_parallel_min": renames * request_ms / 1e3 / parallel_requests / 60,
            "commit_reads_today_tb": images * image_bytes / 1e12}


def simulate(sizes: List[int], image_bytes: int, classes: int, target_shard_mb: float, min_shards: int,
             request_ms: float, parallel_requests: int, max_label_pairs: int, work: Optional[str] = None,
             columns_from: Optional[int] = None) -> List[Dict[str, float]]:
    """Every size's figures; measured where the manifest is built, else extrapolated (marked)."""
    from imagerecords.format.manifest import COLUMNS_FROM

    columns_from = COLUMNS_FROM if columns_from is None else columns_from
    rows = []
    work = work or tempfile.mkdtemp(prefix="imagerecords-scale-")
    measured: Optional[Dict[str, float]] = None
    try:
        for images in sizes:
            row = sums(images, image_bytes, classes, target_shard_mb, min_shards, request_ms, parallel_requests)
            expected_pairs = row["shards"] * min(classes, row["images_per_shard"])
            full = expected_pairs <= max_label_pairs
            if full or measured is None or row["shards"] >= columns_from:
                folder = os.path.join(work, f"n{images}")
                row.update(build_manifest(folder, images, row["shards"], image_bytes, classes, columns_from,
                                          one_label=not full and row["shards"] >= columns_from))
                row.update(load_in_reader(folder))
                row["measured"] = True
                if not full and row["shards"] >= columns_from:
                    # The manifest is measured; what holds every histogram (the side file, the
                    # staged results) held one pair per shard, not ~825: extrapolated per shard.
                    row["one_label_histograms"] = True
                    row["label_pairs"] = expected_pairs
                    if measured is not None:
                        scale = row["shards"] / measured["shards"]
                        for key in ("side_file_mb", "results_mb", "label_pairs"):
                            row[key] = measured[key] * scale
                shutil.rmtree(folder, ignore_errors=True)
                if full:
                    measured = row
            else:
                scale = row["shards"] / measured["shards"]
                for key in ("manifest_mb", "results_mb", "record_mb", "metadata_mb", "commit_manifest_steps_s",
                            "load_s", "added_mb", "label_pairs"):
                    row[key] = measured[key] * scale
                row["measured"] = False
                row["extrapolated_from"] = measured["images"]
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def table(rows: List[Dict[str, float]], promise_s: float = 5.0, promise_mb: float = 1000.0) -> str:
    lines = [f"{'images':>14} {'shards':>8} {'shuffle GB':>10} {'manifest MB':>12} {'load s':>8} {'load MB':>9} "
             f"{'commit manifest s':>17} {'renames (h serial)':>18}  source"]
    for r in rows:
        verdict = "ok" if r["load_s"] <= promise_s and r["added_mb"] <= promise_mb else "BREAKS the reader promise"
        source = "measured" if r["measured"] else f"extrapolated from {r['extrapolated_from']:,}"
        source += ", columns + side file" if r.get("columns") else ", rows"
        if r.get("one_label_histograms"):
            source += " (side file of one-label histograms)"
        lines.append(f"{r['images']:>14,} {r['shards']:>8,} {r['shuffle_gb']:>10,.1f} {r['manifest_mb']:>12,.1f} "
                     f"{r['load_s']:>8,.2f} {r['added_mb']:>9,.0f} {r['commit_manifest_steps_s']:>17,.2f} "
                     f"{r['commit_renames_serial_h']:>18,.2f}  {source}; {verdict}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", default="10000000,100000000,1000000000", help="comma-separated dataset sizes")
    p.add_argument("--image_bytes", type=int, default=110_000, help="mean image size (ImageNet's JPEGs: ~110 KB)")
    p.add_argument("--classes", type=int, default=1000, help="label classes (0: no label histograms)")
    p.add_argument("--target_shard_mb", type=float, default=None, help="default: the builder's")
    p.add_argument("--request_ms", type=float, default=50.0, help="assumed latency of one object-store request")
    p.add_argument("--parallel_requests", type=int, default=32, help="assumed concurrent requests")
    p.add_argument("--max_label_pairs", type=int, default=20_000_000,
                   help="build manifests up to this many (shard, label) pairs; extrapolate larger ones")
    p.add_argument("--columns_from", type=int, default=None,
                   help="shards per split from which the manifest holds columns (default: the builder's "
                        "format.manifest.COLUMNS_FROM; a number above every size writes rows, as before format 3)")
    p.add_argument("--json", help="write every figure here")
    a = p.parse_args(argv)
    from imagerecords.pipeline.config import BuildConfig

    defaults = BuildConfig(input="in.csv", output="out")
    rows = simulate([int(float(x)) for x in a.images.split(",")], a.image_bytes, a.classes,
                    a.target_shard_mb or defaults.target_shard_mb, defaults.min_shards, a.request_ms,
                    a.parallel_requests, a.max_label_pairs, columns_from=a.columns_from)
    print(f"{a.image_bytes:,} B per image, {a.classes} classes, shards of "
          f"{a.target_shard_mb or defaults.target_shard_mb:g} MB, {rows[0]['ref_bytes']} B per ref, "
          f"object-store requests of {a.request_ms:g} ms (assumed)")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
