"""Benchmarks: codec paths per image, and the two writers end to end; prints ratios to baselines.

Usage: python benchmarks/bench_build.py [--images 400] [--side 640] [--workers 2]

Every number is measured in this run, and each is printed next to a baseline measured in the same
run (the machines are shared and noisy, so only the ratios travel between machines).
"""

import argparse
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
from PIL import Image, ImageFilter

from imagerecords.pipeline.encode import image_codec as codec


def photo(rng, side):
    """A photo-like picture: smooth gradients plus blurred noise (compresses like a photo)."""
    h, w = int(side * 0.75), side
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 128 / (w + h)], -1)
    noise = rng.normal(0, 40, (h, w, 3))
    img = Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8)).filter(ImageFilter.GaussianBlur(1.5))
    return img


def make_tree(root, n, side):
    rng = np.random.RandomState(0)
    sizes = 0
    for i in range(n):
        cls = f"class_{i % 10}"
        os.makedirs(os.path.join(root, cls), exist_ok=True)
        path = os.path.join(root, cls, f"{i:05d}.jpg")
        photo(rng, side).save(path, quality=90)
        sizes += os.path.getsize(path)
    return sizes


def time_per_image(fn, items, repeat=1):
    start = time.perf_counter()
    for _ in range(repeat):
        for item in items:
            fn(item)
    return (time.perf_counter() - start) / (len(items) * repeat)


def bench_codec(side, n=40):
    rng = np.random.RandomState(1)
    jpegs = []
    for _ in range(n):
        buf = io.BytesIO()
        photo(rng, side).save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())

    def pillow_roundtrip(data):  # baseline: what a naive converter does for every image
        img = Image.open(io.BytesIO(data)).convert("RGB")
        out = io.BytesIO()
        img.save(out, format="JPEG", quality=90)

    def pillow_resize(data):  # baseline for resizing: full decode, then resize
        img = Image.open(io.BytesIO(data)).convert("RGB")
        img = img.resize((side // 4, int(side * 0.75) // 4), Image.Resampling.LANCZOS)
        img.save(io.BytesIO(), format="JPEG", quality=90)

    base = time_per_image(pillow_roundtrip, jpegs)
    rows = [
        ("decode+encode (baseline)", base),
        ("imagerecords pass-through", time_per_image(lambda d: codec.prepare_image(d), jpegs)),
        ("imagerecords --reencode", time_per_image(lambda d: codec.prepare_image(d, codec.ImageOptions(reencode=True)), jpegs)),
    ]
    resize_base = time_per_image(pillow_resize, jpegs)
    rows.append(("full decode+resize 1/4 (baseline 2)", resize_base))
    rows.append(("imagerecords --max_side 1/4 (draft)", time_per_image(
        lambda d: codec.prepare_image(d, codec.ImageOptions(max_side=side // 4)), jpegs)))
    print(f"\ncodec, {n} JPEGs of {side}x{int(side * 0.75)} (one core):")
    for name, t in rows:
        ref = resize_base if "1/4" in name else base
        print(f"  {name:<40} {t * 1e3:8.2f} ms/image   {ref / t:5.2f}x baseline speed")


def run_build(args):
    """Runs one build in a subprocess; returns (seconds, peak summed RSS of its process tree in MB)."""
    import psutil

    start = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen([sys.executable, "-m", "imagerecords", "build", *args], stdout=subprocess.DEVNULL, stderr=err)
        root, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            try:
                tree = [root] + root.children(recursive=True)
                peak = max(peak, sum(p.memory_info().rss for p in tree if p.is_running()))
            except psutil.Error:
                pass
            time.sleep(0.1)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            sys.exit(f"build failed:\n{err.read().decode()[-3000:]}")
    return seconds, peak / 1e6


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=400)
    p.add_argument("--side", type=int, default=640)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args(argv)
    bench_codec(a.side)
    tmp = tempfile.mkdtemp(prefix="imagerecords-bench-")
    try:
        root = os.path.join(tmp, "images")
        total = make_tree(root, a.images, a.side)
        print(f"\nbuild, {a.images} JPEGs ({total / 1e6:.1f} MB), DirectRunner multi_processing x{a.workers}:")
        common = ["--input", root, "--num_shards", "4", "--no_progress", f"--direct_num_workers={a.workers}"]
        results = {}
        for label, extra in (("--writer beam (baseline)", ["--writer", "beam"]),
                             ("--writer shards", []),
                             ("--writer beam --reencode", ["--writer", "beam", "--reencode"]),
                             ("--writer shards --reencode", ["--reencode"])):
            out = os.path.join(tmp, label.replace(" ", "_").replace("-", ""))
            results[label] = run_build(common + ["--output", out] + extra)
        base = results["--writer beam (baseline)"][0]
        base_mem = results["--writer beam (baseline)"][1]
        for label, (seconds, mem) in results.items():
            print(f"  {label:<32} {seconds:7.1f} s  {a.images / seconds:7.1f} images/s  {base / seconds:5.2f}x baseline speed"
                  f"   peak RSS {mem:7.0f} MB ({mem / base_mem:4.2f}x baseline)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
