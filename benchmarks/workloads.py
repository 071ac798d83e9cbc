"""The benchmark's TensorFlow-side workloads, each run in its own process by benchmarks.run.

    python -m benchmarks.workloads loop   --input ROOT --output DIR [--paths pass,reencode] --json PATH
    python -m benchmarks.workloads tfds   --input ROOT --output DIR [--paths pass,reencode] --json PATH [beam flags]
    RAY_PYTHON -m benchmarks.workloads raydata --input ROOT --output DIR --json PATH [--num_cpus N]
    python -m benchmarks.workloads reader --data DIR --json PATH [--batches N] [--repeats R]
    python -m benchmarks.workloads train  --data DIR --json PATH [--model resnet50|tiny] [--steps N]

`raydata` runs under another interpreter, one with ray[data] installed (its own environment: Ray
pins other numpy/pyarrow/protobuf versions than ours), so this module imports nothing at the top
that such an environment may lack.

Each writes a JSON object of its figures (seconds exclude the process's imports unless the name
says "wall"). A separate process per workload keeps TensorFlow's thread pools and memory out of
the other measurements, and lets the parent sum RSS over exactly this workload's process tree.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Tuple


def list_tree(root: str) -> List[Tuple[str, str]]:
    """(path, class name) of every image under the class-folder root, sorted."""
    out = []
    for cls in sorted(os.listdir(root)):
        folder = os.path.join(root, cls)
        if os.path.isdir(folder):
            out.extend((os.path.join(folder, n), cls) for n in sorted(os.listdir(folder)))
    return out


def reencode(data: bytes, quality: int = 90) -> bytes:
    from PIL import Image

    img = Image.open(io.BytesIO(data)).convert("RGB")
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


# --- a serial loop: what people write before they reach for Beam


def run_loop(root: str, output: str, recode: bool, tag: str = "loop") -> Dict[str, float]:
    """One process, one thread: read -> (re-encode) -> tf.train.Example -> TFRecordWriter."""
    import tensorflow as tf

    items = list_tree(root)
    names = sorted({c for _, c in items})
    label = {c: i for i, c in enumerate(names)}
    os.makedirs(output, exist_ok=True)
    start = time.perf_counter()
    with tf.io.TFRecordWriter(os.path.join(output, f"{tag}.tfrecord")) as writer:
        for path, cls in items:
            with open(path, "rb") as f:
                data = f.read()
            if recode:
                data = reencode(data)
            feature = {
                "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[data])),
                "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label[cls]])),
                "image/filename": tf.train.Feature(bytes_list=tf.train.BytesList(value=[os.path.basename(path).encode()])),
            }
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "images": len(items)}


def _paths(a) -> List[bool]:
    """--paths pass,reencode -> [False, True] (re-encode or not, in that order)."""
    return [{"pass": False, "reencode": True}[x] for x in a.paths.split(",")]


# --- TFDS's own Beam path: a GeneratorBasedBuilder whose _generate_examples returns a PTransform


def _tfds_example(item):
    """(path, class, recode) -> (key, example dict); module-level so Beam workers can unpickle it."""
    import io  # imported here: Beam pickles this function by value when the module runs as __main__
    import os

    path, cls, recode = item
    if recode:
        from PIL import Image

        with open(path, "rb") as f:
            image = Image.open(io.BytesIO(f.read())).convert("RGB")  # TFDS encodes it (PIL, JPEG)
        image.load()
    else:
        image = path  # TFDS reads the file's bytes and stores them as they are
    return os.path.relpath(path, os.path.dirname(os.path.dirname(path))), {"image": image, "label": cls}


def run_tfds(root: str, output: str, recode: bool, beam_args: List[str]) -> Dict[str, float]:
    import tensorflow_datasets as tfds
    from apache_beam.options.pipeline_options import PipelineOptions

    items = list_tree(root)
    names = sorted({c for _, c in items})

    class BenchImages(tfds.core.GeneratorBasedBuilder):
        """The benchmark corpus, built by TFDS with Beam."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
                "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(names=names),
            }))

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            beam = tfds.core.lazy_imports.apache_beam
            return beam.Create([(p, c, recode) for p, c in items]) | beam.Map(_tfds_example)

    start = time.perf_counter()
    builder = BenchImages(data_dir=output)  # one data_dir per call: TFDS would reuse a finished build
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
        beam_options=PipelineOptions(beam_args)))
    seconds = time.perf_counter() - start
    written = builder.info.splits["train"].num_examples
    if written != len(items):
        raise SystemExit(f"TFDS wrote {written} examples of {len(items)}")
    return {"seconds": seconds, "images": len(items)}


# --- Ray Data: the pipeline its docs show for files -> TFRecords


def run_raydata(root: str, output: str, num_cpus: int) -> Dict[str, float]:
    """read_binary_files(include_paths) -> map (one row per image: its bytes as they are, the class
    index of its parent folder, a key) -> random_shuffle -> write_tfrecords, on a local Ray started
    here with num_cpus CPUs and shut down before returning (its raylet, object store and workers
    are this process's descendants, so the parent measures them with the rest of the tree)."""
    import ray

    names = sorted(c for c in os.listdir(root) if os.path.isdir(os.path.join(root, c)))
    label = {c: i for i, c in enumerate(names)}

    def to_row(row):
        folder, name = os.path.split(row["path"])
        cls = os.path.basename(folder)
        return {"image": row["bytes"], "label": label[cls], "key": f"{cls}/{name}"}

    start = time.perf_counter()
    # A session folder of its own, so nothing is shared with any other Ray on the machine; short
    # (Ray's unix sockets live under it and a socket path has at most 107 bytes) and deleted after.
    session = tempfile.mkdtemp(prefix="ray-")
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, _temp_dir=session)
    try:
        ray.data.DataContext.get_current().enable_progress_bars = False
        started = time.perf_counter()
        (ray.data.read_binary_files(root, include_paths=True)
         .map(to_row)
         .random_shuffle()
         .write_tfrecords(output))  # one file per block, named *.tar by Ray, TFRecords inside
        seconds = time.perf_counter() - started
    finally:
        ray.shutdown()
        shutil.rmtree(session, ignore_errors=True)
    return {"seconds": seconds, "init_seconds": started - start, "images": len(list_tree(root)),
            "ray_version": ray.__version__}


# --- the reader against plain tf.data and the decode limit


def plain_pipeline(files: List[str], batch_size: int, size: int, divide_by):
    """The textbook tf.data pipeline the reader is measured against: interleave, shuffle, parse,
    full decode, bilinear resize to size x size (float32), divided by `divide_by` unless None, batch,
    prefetch."""
    import tensorflow as tf

    keys = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    AUTO = tf.data.AUTOTUNE

    def fn(x):
        ex = tf.io.parse_single_example(x, keys)
        img = tf.image.resize(tf.io.decode_jpeg(ex["image"], channels=3), [size, size])
        return (img if divide_by is None else img / divide_by), tf.cast(ex["label"], tf.int32)

    return (tf.data.Dataset.from_tensor_slices(files)
            .interleave(tf.data.TFRecordDataset, cycle_length=min(16, len(files)), num_parallel_calls=AUTO)
            .repeat().shuffle(10_000).map(fn, num_parallel_calls=AUTO)
            .batch(batch_size, drop_remainder=True).prefetch(AUTO))


def _former_default(make):
    """make() built with make_dataset's former default order (interleave + shuffle buffer, no cache)."""
    from imagerecords.reader import dataset as dataset_lib

    one_order = dataset_lib._reads_resumable
    dataset_lib._reads_resumable = lambda config, start_step, start_example: False
    try:
        return make()
    finally:
        dataset_lib._reads_resumable = one_order


def run_reader(data: str, batches: int, repeats: int, batch_size: int = 128, size: int = 224) -> Dict[str, float]:
    """The reader against plain tf.data and the decode limit, interleaved; plus time to first batch.

    Throughput (img/s) is wall time, which on a shared machine moves with the neighbours' load, so
    every pipeline also reports CPU milliseconds per image (all of this process's threads): a
    steadier measure of the work each one does per image.
    """
    t0 = time.perf_counter()
    import tensorflow as tf

    from imagerecords import reader

    out: Dict[str, float] = {}
    out["tf_import_s"] = time.perf_counter() - t0  # not a reader cost; reported apart
    # Time to first batch is measured in a warm process: TensorFlow imported and its runtime (eager
    # context, tf.data and grappler) started by a small unrelated pipeline, as in a trainer that
    # built its model first. What remains is the reader's own start: reading the manifest, planning,
    # building the graph, filling the shuffle buffer and decoding the first batch.
    start = time.perf_counter()
    next(iter(tf.data.Dataset.range(4).map(lambda x: x + 1, num_parallel_calls=2).batch(2).prefetch(1)))
    out["tf_runtime_start_s"] = time.perf_counter() - start
    start = time.perf_counter()
    train = reader.make_dataset(data, "train", batch_size=batch_size, image_size=size, training=True, seed=0)
    built = time.perf_counter()
    it = iter(train)
    next(it)
    out["ttfb_train_s"] = time.perf_counter() - start
    out["ttfb_train_make_dataset_s"] = built - start
    del it, train
    start = time.perf_counter()
    evald = reader.make_dataset(data, "train", batch_size=batch_size, image_size=size)
    next(iter(evald))
    out["ttfb_eval_s"] = time.perf_counter() - start
    del evald

    info = reader.load_info(data)
    files = info.split("train").files
    keys = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    AUTO = tf.data.AUTOTUNE

    def records():
        return tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=min(16, len(files)), num_parallel_calls=AUTO)

    def plain_train():
        return plain_pipeline(files, batch_size, size, divide_by=255.0)

    # Every image of the split, parsed into memory once: the decode limit reads no file.
    encoded = list(records().map(lambda x: tf.io.parse_single_example(x, keys)["image"]).as_numpy_iterator())

    def decode_limit():
        # tf.io.decode_jpeg of the whole image alone, on all cores, nothing else: the split's own
        # images from memory, no parse, no resize, no batch copy of pixels. The reader decodes only
        # its crops, so it may come close to this limit but does more work per image.
        # reduce_max reads every pixel: with only the shape used, grappler may skip the decode.
        ds = tf.data.Dataset.from_tensor_slices(encoded).repeat().map(
            lambda b: tf.reduce_max(tf.io.decode_jpeg(b, channels=3)), num_parallel_calls=AUTO)
        return ds.batch(batch_size).prefetch(AUTO)

    def crop_resize_limit():
        # The reader's unavoidable work per training image and nothing else, on all cores: sample the
        # crop on the header, decode only the crop, bilinear resize to size x size, round to uint8;
        # from memory, no parse, no batch copy of pixels. A crop decode saves little of a full
        # decode (the entropy decoding of every row above and beside the crop remains) and the
        # resize is added, so this is the most reader_train_uint8 can reach; its ratio to
        # decode_limit shows what the decode limit asks beyond it.
        from imagerecords.reader import preprocess

        def fn(i, b):
            seed = tf.stack([i, tf.constant(0, tf.int64)])
            image = preprocess.train_image(b, size, seed, flip=False, scaled_decode=True)
            return tf.reduce_max(tf.cast(image + 0.5, tf.uint8))

        ds = tf.data.Dataset.zip((tf.data.Dataset.range(len(encoded)), tf.data.Dataset.from_tensor_slices(encoded)))
        return ds.repeat().map(fn, num_parallel_calls=AUTO).batch(batch_size).prefetch(AUTO)

    pipelines = {
        "decode_limit": decode_limit,
        "crop_resize_limit": crop_resize_limit,
        "plain_train": plain_train,
        "reader_train": lambda: reader.make_dataset(data, "train", batch_size=batch_size, image_size=size,
                                                    training=True, seed=0),
        "reader_train_uint8": lambda: reader.make_dataset(data, "train", batch_size=batch_size, image_size=size,
                                                          training=True, seed=0,
                                                          config=reader.ReadConfig(dtype="uint8")),
        "reader_eval": lambda: reader.make_dataset(data, "train", batch_size=batch_size, image_size=size,
                                                   config=reader.ReadConfig(repeat=-1)),
        # The order make_dataset read without start_step before it had one order (shard interleave
        # + shuffle buffer, records streamed), kept only under cache now: the baseline of the above.
        "reader_train_interleave": lambda: _former_default(lambda: reader.make_dataset(
            data, "train", batch_size=batch_size, image_size=size, training=True, seed=0)),
        "reader_eval_interleave": lambda: _former_default(lambda: reader.make_dataset(
            data, "train", batch_size=batch_size, image_size=size, config=reader.ReadConfig(repeat=-1))),
    }
    for r in range(repeats):  # interleaved, so machine noise hits every pipeline alike
        for name, make in pipelines.items():
            # A fresh iterator per measurement, dropped after it: a live one would keep filling its
            # prefetch buffers while the others are timed, and then drain them at no cost.
            it = iter(make())
            for _ in range(2):  # warm: first batch, autotune's start
                next(it)
            start, cpu = time.perf_counter(), time.process_time()
            for _ in range(batches):
                next(it)
            images = batches * batch_size
            out.setdefault(f"{name}_img_s_runs", []).append(images / (time.perf_counter() - start))
            out.setdefault(f"{name}_cpu_ms_per_img_runs", []).append((time.process_time() - cpu) / images * 1e3)
            del it
    for name in pipelines:
        for what in ("img_s", "cpu_ms_per_img"):
            runs = out[f"{name}_{what}_runs"]
            out[f"{name}_{what}"] = sorted(runs)[len(runs) // 2]
    return out


# --- a real training step fed by the reader and by plain tf.data


def _model(name: str, size: int, classes: int):
    import tensorflow as tf

    if name == "resnet50":
        return tf.keras.applications.ResNet50(weights=None, input_shape=(size, size, 3), classes=classes,
                                              classifier_activation=None)
    if name == "tiny":  # a smoke-test model: checks the workload runs, measures nothing useful
        return tf.keras.Sequential([
            tf.keras.Input((size, size, 3)),
            tf.keras.layers.Conv2D(8, 3, strides=4, activation="relu"),
            tf.keras.layers.GlobalAveragePooling2D(),
            tf.keras.layers.Dense(classes),
        ])
    raise ValueError(f"unknown model {name!r}: resnet50 or tiny")


def run_train(data: str, model_name: str, steps: int, repeats: int, batch_size: int, size: int,
              precision: str) -> Dict[str, float]:
    """One model's SGD step fed by the reader (uint8, normalised inside the step, on the device)
    and by plain tf.data (interleave, shuffle, parse, full decode, resize; float32 0..255), in turns.

    Every step waits for its loss, so a step's wall time is the time spent waiting for the input
    batch plus the step itself; `input_wait_share` is the first over the total: the share of the
    time the accelerator sat idle for want of data (0: the input keeps up). Throughput is images
    per second of wall time over `steps` steps after 3 warm-up steps (the first traces and compiles).

    Args:
      precision: "mixed_bfloat16" (bfloat16 compute, float32 weights; no loss scaling needed),
        "float32", or "auto": mixed_bfloat16 when a GPU is visible, else float32.
    """
    import tensorflow as tf

    from imagerecords import reader

    gpus = tf.config.list_physical_devices("GPU")
    if precision == "auto":
        precision = "mixed_bfloat16" if gpus else "float32"
    tf.keras.mixed_precision.set_global_policy(precision)
    info = reader.load_info(data)
    model = _model(model_name, size, info.num_classes)
    optimizer = tf.keras.optimizers.SGD(0.01, momentum=0.9)
    mean, std = reader.normalization_constants("imagenet")
    mean, std = tf.constant(mean, tf.float32), tf.constant(std, tf.float32)

    @tf.function
    def step(images, labels):
        x = (tf.cast(images, tf.float32) - mean) / std  # on the device, as docs/reader.md shows
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    files = info.split("train").files

    def plain():
        return plain_pipeline(files, batch_size, size, divide_by=None)  # 0..255, normalised in the step

    def ours():
        return reader.make_dataset(data, "train", batch_size=batch_size, image_size=size, training=True, seed=0,
                                   config=reader.ReadConfig(dtype="uint8"))

    out: Dict[str, float] = {"steps": steps, "batch_size": batch_size, "image_size": size,
                             "gpus": len(gpus), "mixed_bfloat16": precision == "mixed_bfloat16"}
    for _ in range(repeats):
        for name, make in (("reader", ours), ("plain", plain)):
            it = iter(make())
            for _ in range(3):
                float(step(*next(it)))
            waited = 0.0
            start = time.perf_counter()
            for _ in range(steps):
                t = time.perf_counter()
                images, labels = next(it)
                waited += time.perf_counter() - t
                float(step(images, labels))
            total = time.perf_counter() - start
            out.setdefault(f"{name}_img_s_runs", []).append(steps * batch_size / total)
            out.setdefault(f"{name}_input_wait_share_runs", []).append(waited / total)
            del it
    for name in ("reader", "plain"):
        for what in ("img_s", "input_wait_share"):
            runs = out[f"{name}_{what}_runs"]
            out[f"{name}_{what}"] = sorted(runs)[len(runs) // 2]
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("loop", "tfds", "raydata", "reader", "train"))
    p.add_argument("--input")
    p.add_argument("--output")
    p.add_argument("--data")
    p.add_argument("--paths", default="pass", help="pass, reencode or pass,reencode: one run each, in order")
    p.add_argument("--batches", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", default="resnet50", help="train: resnet50, or tiny for a smoke run")
    p.add_argument("--steps", type=int, default=50, help="train: timed steps per measurement")
    p.add_argument("--batch_size", type=int, default=128, help="train: images per step")
    p.add_argument("--image_size", type=int, default=224, help="train: side of the square input")
    p.add_argument("--precision", default="auto", choices=("auto", "mixed_bfloat16", "float32"))
    p.add_argument("--num_cpus", type=int, default=os.cpu_count() or 1, help="raydata: Ray's CPUs")
    p.add_argument("--json", required=True)
    a, rest = p.parse_known_args(argv)
    result = {}
    if a.what in ("loop", "tfds"):
        for recode in _paths(a):
            tag = "reencode" if recode else "pass"
            out = os.path.join(a.output, tag)
            r = run_loop(a.input, out, recode, tag) if a.what == "loop" else run_tfds(a.input, out, recode, rest)
            result[f"{tag}_seconds"] = r["seconds"]
            result["images"] = r["images"]
    elif a.what == "raydata":
        r = run_raydata(a.input, a.output, a.num_cpus)
        result = {"pass_seconds": r["seconds"], "pass_init_seconds": r["init_seconds"], "images": r["images"],
                  "ray_version": r["ray_version"]}
    elif a.what == "train":
        result = run_train(a.data, a.model, a.steps, a.repeats, a.batch_size, a.image_size, a.precision)
    else:
        result = run_reader(a.data, a.batches, a.repeats)
    with open(a.json, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.exit(main())
