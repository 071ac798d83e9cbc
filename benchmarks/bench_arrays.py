"""NumPy input against the seed's serial loop, both measured in this run (only ratios travel).

Usage:
    python -m benchmarks.bench_arrays [--float_rows 60000] [--rgb_rows 50000] [--json out.json]

Workloads: float32 (N, 28, 28) with int labels (stored raw, as the seed does) and uint8
(N, 32, 32, 3) with int labels (we store PNG; the seed stores raw bytes). Build: `imagerecords build
--input X.npz` (the CLI in a subprocess, imports included) against the seed's loop
(tf.train.Example + tf.io.TFRecordWriter over the arrays, one file) and the same loop in one
process per core (each imports TensorFlow, loads the .npz and writes its share of the rows). Read: plain tf.data over each
output (TFRecordDataset, parse_single_example, decode_raw or decode_png, batch 256), one pass.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def seed_loop(x, y, path):
    import tensorflow as tf

    started = time.perf_counter()
    with tf.io.TFRecordWriter(path) as w:
        for i in range(len(x)):
            ex = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[x[i].tobytes()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])]))}))
            w.write(ex.SerializeToString())
    return time.perf_counter() - started


def pillow_png_loop(x, y, path):
    """The loop a user writes to store uint8 images as PNG: Pillow encodes each row (its default
    compression), then the seed's Example and TFRecordWriter."""
    import io

    import tensorflow as tf
    from PIL import Image

    started = time.perf_counter()
    with tf.io.TFRecordWriter(path) as w:
        for i in range(len(x)):
            buf = io.BytesIO()
            Image.fromarray(x[i]).save(buf, format="PNG")
            ex = tf.train.Example(features=tf.train.Features(feature={
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[buf.getvalue()])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(y[i])]))}))
            w.write(ex.SerializeToString())
    return time.perf_counter() - started


def per_core_loop(npz, path, cores):
    """The seed loop in one process per core, each over its share of the rows into its own file,
    as the tutorials advise for more than one core: each process imports TensorFlow and loads the
    arrays itself, as a user's script would."""
    started = time.perf_counter()
    script = ("import sys, numpy as np; from benchmarks.bench_arrays import seed_loop; k, n = map(int, sys.argv[2:4]); "
              "z = np.load(sys.argv[1]); x, y = z['image'], z['label']; lo, hi = len(x) * k // n, len(x) * (k + 1) // n; "
              "seed_loop(x[lo:hi], y[lo:hi], sys.argv[4])")
    procs = [subprocess.Popen([sys.executable, "-c", script, npz, str(k), str(cores), f"{path}-{k:05d}"], cwd=REPO,
                              env=dict(os.environ, PYTHONPATH=REPO, TF_CPP_MIN_LOG_LEVEL="2"))
             for k in range(cores)]
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"per-core seed loop exited with {p.returncode}")
    return time.perf_counter() - started


def ours(npz, out, *extra):
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import sys; from imagerecords.cli.main import main; sys.exit(main())",
                    "build", "--input", npz, "--output", out, "--no_progress", *extra], check=True, cwd=REPO,
                   env=dict(os.environ, PYTHONPATH=REPO), stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def launcher(npz):
    """Seconds the local engine's launcher spends listing, assigning, planning and pickling the
    shards of `npz` (the arrays already open), (ref path, columnar path): a ref per row
    (engines.local.list_inputs, assign_lib.assign, plan) against array_rows' NumPy columns."""
    import pickle

    from imagerecords.builder.engines import local
    from imagerecords.builder.options import BuildOptions
    from imagerecords.pipeline.plan import assign as assign_lib
    from imagerecords.pipeline import refs as refs_lib
    from imagerecords.pipeline.read import array_files as arrays

    config = BuildOptions.make(npz, npz + ".unused-out").config
    arrays.forget_if_changed(npz)
    arrays.open_arrays(npz)
    started = time.perf_counter()
    listed = [pair for pair in local.list_inputs(config, None) if not isinstance(pair[1], refs_lib.Rejected)]
    labels = refs_lib.vocabulary(sorted({r.label for _, r in listed}), arrays.label_type(config), 0)
    assigned = [(h, assign_lib.assign(r, labels, None, 0)) for h, r in listed]
    del listed
    shards = local.plan(config, assigned)
    for key in shards.keys():
        pickle.dumps(shards.take(key), protocol=pickle.HIGHEST_PROTOCOL)
    refs_s = time.perf_counter() - started
    started = time.perf_counter()
    shards = local._Shards(local._list_rows(config, None)[2], config.shards)
    for key in shards.keys():
        pickle.dumps(shards.take(key), protocol=pickle.HIGHEST_PROTOCOL)
    return refs_s, time.perf_counter() - started


def read(files, decode):
    import tensorflow as tf

    spec = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}

    def parse(r):
        ex = tf.io.parse_single_example(r, spec)
        return decode(ex["image"]), ex["label"]

    ds = tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=tf.data.AUTOTUNE).batch(256)
    started, n = time.perf_counter(), 0
    for images, _ in ds:
        n += int(images.shape[0])
    return n, time.perf_counter() - started


def workload(name, x, y, work, decode_ours, decode_seed):
    npz = os.path.join(work, f"{name}.npz")
    np.savez(npz, image=x, label=y)
    seed_s = seed_loop(x, y, os.path.join(work, f"{name}.seed.tfrecord"))
    cores = os.cpu_count() or 1
    per_core_s = per_core_loop(npz, os.path.join(work, f"{name}.percore.tfrecord"), cores)
    ours_s = ours(npz, os.path.join(work, f"{name}-out"))
    launcher_refs_s, launcher_rows_s = launcher(npz)
    files = sorted(glob.glob(os.path.join(work, f"{name}-out", "*", "*.tfrecord-*")))
    n1, ours_read = read(files, decode_ours)
    n2, seed_read = read([os.path.join(work, f"{name}.seed.tfrecord")], decode_seed)
    assert n1 == n2 == len(x), (n1, n2)
    return {"rows": len(x), "seed_build_s": seed_s, "ours_build_s": ours_s, "build_speedup": seed_s / ours_s,
            "per_core_build_s": per_core_s, "per_core_speedup": per_core_s / ours_s,
            "launcher_refs_s": launcher_refs_s, "launcher_rows_s": launcher_rows_s,
            "seed_read_per_s": n2 / seed_read, "ours_read_per_s": n1 / ours_read,
            "read_ratio": (n1 / ours_read) / (n2 / seed_read)}


def storages(x, y, work):
    """uint8 images stored each way against the loop a user writes for that storage, same run:
    --image_encoding raw against the seed's tobytes() loop, the default PNG against a Pillow PNG loop."""
    npz = os.path.join(work, "storages.npz")
    np.savez(npz, image=x, label=y)
    # Each timing starts with no dirty pages from the one before (600 MB a storage): the kernel's
    # write-back of an earlier output would otherwise be billed to whichever runs next.
    os.sync()
    seed_s = seed_loop(x, y, os.path.join(work, "storages.seed.tfrecord"))
    os.sync()
    pillow_s = pillow_png_loop(x, y, os.path.join(work, "storages.pillow.tfrecord"))
    os.sync()
    raw_s = ours(npz, os.path.join(work, "storages-raw"), "--image_encoding", "raw")
    os.sync()
    png_s = ours(npz, os.path.join(work, "storages-png"))
    return {"rows": len(x), "seed_raw_loop_s": seed_s, "ours_raw_s": raw_s, "raw_speedup": seed_s / raw_s,
            "pillow_png_loop_s": pillow_s, "ours_png_s": png_s, "png_speedup": pillow_s / png_s}


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--float_rows", type=int, default=60000)
    p.add_argument("--rgb_rows", type=int, default=50000)
    p.add_argument("--json")
    args = p.parse_args(argv)
    from benchmarks.run import compile_package

    compile_package()
    import tensorflow as tf

    r = np.random.default_rng(0)
    out = {"cores": os.cpu_count()}
    with tempfile.TemporaryDirectory() as work:
        x = r.random((args.float_rows, 28, 28), dtype=np.float32)
        out["float32_28x28"] = workload("float", x, r.integers(0, 10, len(x)), work,
                                        lambda b: tf.reshape(tf.io.decode_raw(b, tf.float32), (28, 28)),
                                        lambda b: tf.reshape(tf.io.decode_raw(b, tf.float32), (28, 28)))
        x = r.integers(0, 256, (args.rgb_rows, 32, 32, 3), dtype=np.uint8)
        out["uint8_32x32x3"] = workload("rgb", x, r.integers(0, 10, len(x)), work,
                                        lambda b: tf.io.decode_png(b, channels=3),
                                        lambda b: tf.reshape(tf.io.decode_raw(b, tf.uint8), (32, 32, 3)))
    for name in ("float32_28x28", "uint8_32x32x3"):
        w = out[name]
        print(f"{name:15} {w['rows']:6} rows  build: ours {w['ours_build_s']:.1f} s vs seed loop "
              f"{w['seed_build_s']:.1f} s (x{w['build_speedup']:.2f}), per-core loop {w['per_core_build_s']:.1f} s "
              f"(x{w['per_core_speedup']:.2f})  read: ours {w['ours_read_per_s']:.0f}/s vs "
              f"seed {w['seed_read_per_s']:.0f}/s (x{w['read_ratio']:.2f})  launcher: {w['launcher_rows_s']:.2f} s "
              f"vs {w['launcher_refs_s']:.2f} s a ref per row")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()
