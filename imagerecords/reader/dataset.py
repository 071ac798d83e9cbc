"""make_dataset: manifest -> host's shards -> interleave -> shuffle -> parse and preprocess -> batch -> prefetch."""

from __future__ import annotations

import atexit
import functools
import hashlib
import logging
import numbers
import random
import threading
import time
from typing import Iterator, List, Optional, Union

import numpy as np
import tensorflow as tf

from imagerecords.format import features as features_lib
from imagerecords.format import schema
from imagerecords.reader import config as config_lib
from imagerecords.reader import formats as formats_lib
from imagerecords.reader import preprocess as preprocess_lib
from imagerecords.reader import resume as resume_lib
from imagerecords.reader.config import ReadConfig
from imagerecords.reader.info import DatasetInfo, check_tf_readable, load_info, missing_files
from imagerecords.reader.meta import examples_consumed, label_names, steps_per_epoch  # noqa: F401
from imagerecords.reader.meta import host_plan as _plan
from imagerecords.reader.shards import ReadStats, open_shards, shard_records
from imagerecords.format.errors import ReadError, FilesMissing, TooLate

log = logging.getLogger("imagerecords.reader")

PAD_LABEL = -1  # label of the padding elements the "pad" host remainder policy adds


class _PythonStages:
    """The resumable order's Python calls (epoch orders, record reads) in flight, and a stop at exit.

    A tf.data thread that calls Python after the interpreter began to finalize never returns, and
    the iterator's destructor then waits for it forever (the process hangs after its last line).
    So the pipeline holds no Python finalizer (no from_generator), and at exit the calls return at
    once, the epochs end, and the exit waits until none has run for a moment: the prefetching
    stages fill up and stop before the destructor runs.
    """

    def __init__(self):
        self.stopping = threading.Event()
        self.last_call = time.monotonic()
        atexit.register(self.drain)

    def touch(self) -> None:
        self.last_call = time.monotonic()

    def drain(self, quiet: float = 0.2, limit: float = 5.0) -> None:
        self.stopping.set()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and time.monotonic() - self.last_call < quiet:
            time.sleep(0.02)  # sleeping releases the GIL: waiting calls run, see the stop and return


_PYTHON = _PythonStages()


def make_dataset(
    path: Union[str, DatasetInfo],
    split: str = "train",
    *,
    batch_size: int,
    image_size: int,
    training: bool = False,
    seed: Optional[int] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
    num_hosts: Optional[int] = None,
    host_index: Optional[int] = None,
    config: Optional[ReadConfig] = None,
    stats: Optional[ReadStats] = None,
    start_step: Optional[int] = None,
    start_example: Optional[int] = None,
) -> tf.data.Dataset:
    """Returns this host's batches of (images, labels) from a dataset the builder wrote.

    Usage:
        from imagerecords import reader

        train = reader.make_dataset("gs://bucket/ds", "train", batch_size=256, image_size=224,
                                    training=True, seed=0)
        val = reader.make_dataset("gs://bucket/ds", "validation", batch_size=256, image_size=224)
        model.fit(train, epochs=90, validation_data=val,
                  steps_per_epoch=reader.steps_per_epoch("gs://bucket/ds", "train", 256, training=True))

        # tf.distribute: one pipeline per host, batch_size is what each pipeline yields.
        def dataset_fn(ctx):
            return reader.make_dataset(path, "train", batch_size=ctx.get_per_replica_batch_size(1024),
                                       image_size=224, training=True, seed=0, input_context=ctx)
        dist = strategy.distribute_datasets_from_function(dataset_fn)

    Stages: the split's shards from manifest.json (missing ones named in the error) -> the epoch's
    seeded global order of positions (blocks of records permuted, then windows) -> this host's
    positions -> records read at their offsets -> parse (schema preset from the manifest) and
    decode/preprocess in parallel -> batch -> prefetch. With config.cache: this host's shards ->
    shard order shuffled per epoch -> interleave -> cache -> repeat -> shuffle buffer -> the same.

    Args:
      path: dataset folder (local or gs://) or its DatasetInfo.
      split: split name.
      batch_size: elements per batch this dataset yields.
      image_size: side of the square images.
      training: training defaults (random crop and flip, shuffling, endless repeat, dropped last
        batch, "drop" host remainder) instead of evaluation ones; see ReadConfig.
      seed: seed of file order, shuffle buffer and augmentation. Equal seeds with deterministic
        order give equal batches. None draws one at random.
      input_context: tf.distribute.InputContext; this host reads input pipeline
        `input_pipeline_id` of `num_input_pipelines`.
      num_hosts: number of hosts, when there is no input_context (default 1).
      host_index: this host, in [0, num_hosts), when there is no input_context (default 0).
      config: the knobs; ReadConfig() when None.
      stats: a ReadStats to fill with the host plan and the counts of skipped and extra records.
      start_step: resume after this many batches of an earlier run with the same seed, host count
        and batch_size: yields exactly that run's batches from step `start_step` on, across epoch
        boundaries, images (crops and flips) included. Every call reads the resumable order
        (imagerecords.reader.resume): one global order per epoch that depends on the seed and the
        epoch only, consumed by the hosts in turn, read record by record at known offsets, so no
        record before the start is read; start_step and start_example only say where to start
        (None for both: step 0). A run started without them resumes with start_step=k. The one
        exception is config.cache, which keeps the interleave pipeline and takes no start.
        Each host yields steps_per_epoch(...) * batch_size records per epoch.
      start_example: resume at this global example count on any host count: epoch e begins at
        e * num_examples, and after s steps of a run on H hosts with batch B the count is
        examples_consumed(path, split, s, B, num_hosts=H) (within an epoch, s * B * H). The hosts
        then share the epoch's unconsumed examples (disjoint, complete up to host_remainder's
        drop or padding); later epochs are those of a fresh run on this host count. Crops and
        flips are seeded by (seed, epoch, position in the global order), never by the host, so
        they match the run that was interrupted. Not with start_step.

    Returns:
      A tf.data.Dataset of (images [B, image_size, image_size, config.channels], labels [B] int32), plus
      filenames [B] tf.string when config.with_filename. Padding elements (policy "pad") have label
      PAD_LABEL, an all-zero image and an empty filename.

    Raises:
      ValueError: listing every invalid or conflicting setting, or naming an unknown split.
      FileNotFoundError: naming the manifest or every missing shard file.
      imagerecords.format.access.ShardSizeError: (a ValueError; corrupt_records="fail") naming a
        shard file of another size than manifest.json lists, before anything is read.
    """
    config = config or ReadConfig()
    r = config_lib.resolve(config, training, seed is not None)
    problems = _call_problems(batch_size, image_size, seed, input_context, num_hosts, host_index, config, r)
    problems += _resume_problems(start_step, start_example, config, seed, r)
    if problems:
        raise ReadError("make_dataset: " + "; ".join(problems))
    # A NumPy int (a restored step counter) counts like a Python one.
    start_step = None if start_step is None else int(start_step)
    start_example = None if start_example is None else int(start_example)
    info = load_info(path)
    check_tf_readable(info, "make_dataset")
    image = features_lib.stored_image(info.manifest)
    if image is not None and image.dtype == "image" and image.encoding == "raw":
        raise ReadError(f"make_dataset: {info.path} was built with --image_encoding raw (float32 pixels, which "
                        "the classification pipeline does not crop or resize); read it with reader.as_dataset")
    if image is None or (image.dtype != "image" and features_lib.raw_pixels_shape(image) is None):
        what = f"a {features_lib.describe(image)} tensor" if image is not None else "no image feature"
        raise ReadError(f"make_dataset: {info.path}'s records hold {what} (an arrays build), not an encoded "
                        "image; read them with reader.as_dataset")
    split_info = info.split(split)
    if config.check_files:
        missing = missing_files(split_info)
        if missing:
            raise FilesMissing(f"{len(missing)} of {len(split_info.shards)} shard(s) of split {split!r} "
                               f"listed in manifest.json are missing: {', '.join(missing)}")
    plan = _plan(split_info, input_context, num_hosts, host_index, r)
    n_hosts, host = plan.num_hosts, plan.host_index
    if stats is None:
        stats = ReadStats()
    stats.plan = plan
    resumable = _reads_resumable(config, start_step, start_example)
    if resumable and start_example is None and start_step is None:
        start_step = 0
    per_host, dropped, padded = plan.records_per_epoch, plan.dropped_total, plan.padded_total
    if resumable:  # the resumable order deals positions, not shards: its own counts
        total = split_info.num_examples
        per_host = resume_lib.per_host_records(total, 0, n_hosts, r.host_remainder)
        dropped, padded = max(total - per_host * n_hosts, 0), max(per_host * n_hosts - total, 0)
    if dropped:
        log.info("%s/%s: %d records per host per epoch; %d record(s) over all %d hosts are left out each epoch "
                 "(host_remainder='drop')", info.path, split, per_host, dropped, n_hosts)
    if padded:
        log.info("%s/%s: %d records per host per epoch; %d padding element(s) with label %d over all %d hosts "
                 "(host_remainder='pad')", info.path, split, per_host, padded, PAD_LABEL, n_hosts)
    if seed is None:
        seed = random.SystemRandom().randrange(2**31)
        log.info("make_dataset(%s, %r): seed=None, drew seed %d", info.path, split, seed)

    if resumable:
        # (stream index, serialized record) of the global order's positions this host takes
        records = _resumable_records(split_info, seed, n_hosts, host, r, config, stats, batch_size,
                                     start_step, start_example, info.path)
        may_pad = (r.host_remainder == "pad" and n_hosts > 1) or config.corrupt_records == "skip"
        decode = _decoder(info, image_size, config, r, _derive(seed, -1, "augment"), may_pad)
        examples = records.map(decode, num_parallel_calls=config.num_parallel_calls, deterministic=True)
        return _finish(examples, batch_size, config, r, deterministic=True)

    # --- serialized records of one epoch, this host only
    slices = plan.slices
    files = slice_files(slices, split_info, policy=config.corrupt_records, stats=stats, dataset=info.path)
    if r.shuffle_files and len(slices) > 1:
        files = files.shuffle(len(slices), seed=_derive(seed, host, "files"), reshuffle_each_iteration=True)
    read = functools.partial(shard_records, policy=config.corrupt_records, stats=stats, dataset=info.path)
    records = files.interleave(
        read,
        cycle_length=min(config.cycle_length or 16, max(len(slices), 1)),
        block_length=config.block_length,
        num_parallel_calls=config.num_parallel_calls,
        deterministic=r.deterministic,
    )
    if plan.remainder == "pad" and n_hosts > 1:
        # Padding is an empty string (no Example the builder writes serializes to zero bytes). It
        # also stands in for records a "skip" policy dropped, so hosts stay in step.
        records = records.concatenate(tf.data.Dataset.from_tensors(tf.constant("")).repeat())
    records = records.take(plan.records_per_epoch)
    if config.cache:
        records = records.cache("" if config.cache is True else config.cache)
    records = records.repeat(None if r.repeat == -1 else r.repeat)
    if r.shuffle_buffer > 0:
        # At most one epoch of this host: the first batch waits for a full buffer, and more only re-reads records.
        buffer = max(min(r.shuffle_buffer, plan.records_per_epoch), 1)
        records = records.shuffle(buffer, seed=_derive(seed, host, "buffer"), reshuffle_each_iteration=True)

    # --- examples
    may_pad = plan.remainder == "pad" and n_hosts > 1
    decode = _decoder(info, image_size, config, r, _derive(seed, host, "augment"), may_pad)
    # (stream index, serialized record); the stream index seeds the augmentation
    examples = records.enumerate().map(decode, num_parallel_calls=config.num_parallel_calls,
                                       deterministic=r.deterministic)
    return _finish(examples, batch_size, config, r, r.deterministic)


def _reads_resumable(config: ReadConfig, start_step: Optional[int], start_example: Optional[int]) -> bool:
    """One order: the resumable one, from step 0 when no start is given; only cache keeps the
    interleave pipeline (it replays the first epoch's order, which no step count can resume)."""
    return start_step is not None or start_example is not None or not config.cache


def _finish(examples: tf.data.Dataset, batch_size: int, config: ReadConfig, r: config_lib.Resolved,
            deterministic: bool) -> tf.data.Dataset:
    """Batch, prefetch and the dataset options, after the decode map."""
    # A plain batch right after the parallel map: tf.data fuses the two (map_and_batch_fusion), so
    # each image is written straight into its batch and batches are built in parallel, in order.
    batches = examples.batch(batch_size, drop_remainder=r.drop_remainder)
    if config.prefetch:
        batches = batches.prefetch(config.prefetch)
    options = tf.data.Options()
    options.deterministic = deterministic
    if config.private_threadpool_size:
        options.threading.private_threadpool_size = config.private_threadpool_size
    if config.autotune_ram_budget_mb:
        options.autotune.ram_budget = config.autotune_ram_budget_mb * 2**20
    # This reader already gave each host its share; tf.distribute must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    batches = batches.with_options(options)
    if config.options is not None:
        batches = batches.with_options(config.options)
    return batches


def _resumable_records(split_info, seed: int, n_hosts: int, host: int, r: config_lib.Resolved, config: ReadConfig,
                       stats: ReadStats, batch_size: int, start_step: Optional[int],
                       start_example: Optional[int], dataset: str) -> tf.data.Dataset:
    """(stream index, serialized) of this host's positions of the resumable order, from the start position."""
    counts = split_info.shard_lengths
    total = sum(counts)
    if start_step is not None:
        start = resume_lib.position_of_step(start_step, batch_size, total, n_hosts, r.host_remainder)
    else:
        start = resume_lib.position_of_example(start_example, total) if total else resume_lib.Position(0, 0)
    if (start.epoch + 1) * total >= 2**63:  # the stream index (epoch * total + position) is an int64
        given = f"start_step={start_step}" if start_step is not None else f"start_example={start_example}"
        raise ReadError(f"make_dataset: {given} is epoch {start.epoch} of split {split_info.name!r} ({total} "
                        "examples), past the int64 range of the resumable order's example count; pass the step "
                        "or example count of the run you resume")
    # Offsets are looked up once here (index files, or a scan of the frame headers).
    table = resume_lib.RecordTable(split_info.files, counts, split_info.shards, config.corrupt_records, stats,
                                   dataset)
    shuffle = r.shuffles

    n_epochs = resume_lib.epochs_to_read(counts, start, r.repeat, n_hosts, r.host_remainder)

    def epoch_py(epoch):
        _PYTHON.touch()
        if _PYTHON.stopping.is_set():  # the process is exiting: end the epochs, so no more calls come
            return np.zeros(0, np.int64), np.zeros(0, np.int64), False
        ids, stream = resume_lib.host_epoch(counts, seed, start, int(epoch), n_hosts, host, r.host_remainder,
                                            config.order_block, config.order_window, shuffle)
        return ids, stream, True

    @tf.autograph.experimental.do_not_convert
    def epoch_positions(epoch):
        ids, stream, go = tf.py_function(epoch_py, [epoch], (tf.int64, tf.int64, tf.bool))
        ids.set_shape([None])
        stream.set_shape([None])
        go.set_shape([])
        return ids, stream, go

    # Epoch numbers -> this host's positions of each epoch, in TASK_RECORDS pieces. No generator:
    # from_generator's finalizer calls Python while the iterator is destroyed, which can hang a
    # process at exit. The next epoch's order is computed while this one is read (prefetch).
    epochs = tf.data.Dataset.range(start.epoch, start.epoch + n_epochs) if n_epochs >= 0 else \
        tf.data.Dataset.counter(start.epoch)
    positions = epochs.map(epoch_positions).prefetch(1).take_while(lambda ids, stream, go: go)
    # ([ids], [stream]) of up to TASK_RECORDS positions
    tasks = positions.flat_map(lambda ids, stream, go: tf.data.Dataset.from_tensor_slices((ids, stream))) \
        .batch(resume_lib.TASK_RECORDS)

    def read_py(ids):
        _PYTHON.touch()
        if _PYTHON.stopping.is_set():  # the process is exiting: nobody reads these
            return tf.constant([b""] * len(ids), tf.string, shape=[len(ids)]), tf.constant("")
        try:
            records, problem = table.read(ids.numpy()), ""
        except resume_lib.ReadProblem as e:  # raised here it would reach the user wrapped in a traceback
            records, problem = [b""] * len(ids), str(e)
        return tf.constant(records, tf.string, shape=[len(ids)]), tf.constant(problem)

    @tf.autograph.experimental.do_not_convert
    def read(ids, stream):
        records, problem = tf.py_function(read_py, [ids], (tf.string, tf.string))
        with tf.control_dependencies([tf.debugging.Assert(tf.equal(problem, ""), [problem])]):
            records = tf.identity(records)
        records.set_shape(ids.shape)
        return stream, records

    return tasks.map(read, num_parallel_calls=config.num_parallel_calls, deterministic=True).unbatch()


def _resume_problems(start_step, start_example, config: ReadConfig, seed, r: config_lib.Resolved) -> List[str]:
    out = []
    resumable = start_step is not None or start_example is not None
    if resumable and seed is None and (r.shuffles or r.random_crop):
        out.append("start_step/start_example resume the order and crops of a seed, but seed=None draws a new one; "
                   "pass the seed of the run you resume")
    if start_step is not None and start_example is not None:
        out.append(f"give start_step or start_example, not both (got {start_step} and {start_example})")
    for name, value in (("start_step", start_step), ("start_example", start_example)):
        if value is not None and (not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < 0):
            out.append(f"{name} must be an int >= 0, got {value!r}")
    if resumable and config.cache:
        out.append("cache keeps the first epoch's order, but the resumable order (start_step/start_example) "
                   "differs each epoch; drop cache")
    return out


def slice_files(slices, split_info, *, policy: str, stats: Optional[ReadStats], dataset: str) -> tf.data.Dataset:
    """The (path, count, num_bytes, stride, offset) elements shard_records reads, one per FileSlice,
    once the shards they name are checked against manifest.json (shards.open_shards: raises naming a
    shard of another size under "fail")."""
    wanted = {s.path for s in slices}
    sizes = {s.path: s.num_bytes for s in split_info.shards if s.path in wanted}
    open_shards([s for s in split_info.shards if s.path in wanted], dataset, policy, stats)
    return tf.data.Dataset.from_tensor_slices((
        tf.constant([s.path for s in slices], tf.string),
        tf.constant([s.count for s in slices], tf.int64),
        tf.constant([sizes[s.path] for s in slices], tf.int64),
        tf.constant([s.stride for s in slices], tf.int64),
        tf.constant([s.offset for s in slices], tf.int64),
    ))


def _decoder(info: DatasetInfo, image_size: int, config: ReadConfig, r: config_lib.Resolved, augment_seed: int,
             may_pad: bool):
    """Returns the map function (index, serialized) -> (image, label[, filename]).

    Parse, decode, crop, resize, scaling and flip run as one map function, so tf.data schedules one
    parallel stage and no intermediate element (the parsed dict, the decoded crop) is buffered.
    For uint8 output the built-in training flip comes last, on the finished image (the smallest
    form of it); for float output it flips the decoded crop. The check for padding elements is
    only built when padding can occur (several hosts, "pad"), and the filename is only parsed when
    it is yielded.
    """
    keys = schema.keys(info.schema)
    wanted = (keys.image, keys.label, keys.filename) if config.with_filename else (keys.image, keys.label)
    spec = {k: v for k, v in schema.parse_spec(info.schema).items() if k in wanted}
    flip_last = r.preprocess == "train" and config.random_flip and config.dtype == "uint8"
    channels = config.channels
    # A 'jpeg' build holds RGB JPEGs only: its graph is the JPEG one, with no per-record format test.
    lossless = info.manifest.image_encoding != "jpeg"
    raw_shape = features_lib.raw_pixels_shape(features_lib.stored_image(info.manifest))
    if raw_shape is not None and not isinstance(r.preprocess, str):
        def image_fn(encoded, size, seed):  # a user's preprocess gets the pixels as a PNG build's would
            return r.preprocess(tf.image.encode_png(formats_lib.raw_pixels(encoded, raw_shape, channels)), size, seed)
    elif lossless and isinstance(r.preprocess, str):
        image_fn = formats_lib.image_fn(r.preprocess, channels, info.manifest.image_kinds, raw_shape=raw_shape,
                                        area_range=config.crop_area_range,
                                        aspect_ratio_range=config.crop_aspect_ratio_range,
                                        flip=config.random_flip and not flip_last, scaled_decode=config.scaled_decode,
                                        crop_fraction=config.eval_crop_fraction)
    elif r.preprocess == "train":
        image_fn = functools.partial(preprocess_lib.train_image, area_range=config.crop_area_range,
                                     aspect_ratio_range=config.crop_aspect_ratio_range,
                                     flip=config.random_flip and not flip_last,
                                     scaled_decode=config.scaled_decode, channels=channels)
    elif r.preprocess == "eval":
        def image_fn(encoded, size, seed):
            return preprocess_lib.eval_image(encoded, size, config.eval_crop_fraction, config.scaled_decode, channels)
    else:
        image_fn = r.preprocess
    built_in = isinstance(r.preprocess, str)  # its float pixels are a bilinear resize of uint8: 0..255
    label_shift = info.label_offset if config.zero_based_labels else 0
    out_dtype = tf.dtypes.as_dtype(config.dtype)

    @tf.autograph.experimental.do_not_convert
    def real(index, serialized):
        example = tf.io.parse_single_example(serialized, spec)
        seed = tf.random.experimental.stateless_fold_in(tf.constant([augment_seed, 0], tf.int64), index)
        image = image_fn(example[keys.image], image_size, seed)
        image = tf.ensure_shape(image, [image_size, image_size, channels])
        image = preprocess_lib.finish(image, config.dtype, r.normalization, in_range=built_in)
        if flip_last:
            image = preprocess_lib.random_flip(image, seed)
        label = tf.cast(example[keys.label] - label_shift, tf.int32)
        return image, label, example[keys.filename] if config.with_filename else tf.constant("")

    def pad():
        return tf.zeros([image_size, image_size, channels], out_dtype), tf.constant(PAD_LABEL, tf.int32), tf.constant("")

    @tf.autograph.experimental.do_not_convert
    def decode(index, serialized):
        if may_pad:
            image, label, filename = tf.cond(tf.equal(tf.strings.length(serialized), 0), pad,
                                             lambda: real(index, serialized))
        else:
            image, label, filename = real(index, serialized)
        return (image, label, filename) if config.with_filename else (image, label)

    return decode


def _derive(seed: int, host: int, purpose: str) -> int:
    """A 31-bit seed for one use on one host, so hosts and stages do not share random streams."""
    digest = hashlib.sha256(f"{seed}/{host}/{purpose}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def _call_problems(batch_size, image_size, seed, input_context, num_hosts, host_index,
                   config: ReadConfig, r: config_lib.Resolved) -> List[str]:
    """Every invalid or conflicting argument of one make_dataset call, ReadConfig's own included.

    Settings left None are judged by their resolved values (r), so defaults are resolved once.
    """
    out = list(config.problems())
    if not isinstance(batch_size, int) or batch_size < 1:
        out.append(f"batch_size must be a positive int, got {batch_size!r}")
    if not isinstance(image_size, int) or image_size < 1:
        out.append(f"image_size must be a positive int, got {image_size!r}")
    if input_context is not None and (num_hosts is not None or host_index is not None):
        out.append("give input_context or num_hosts/host_index, not both "
                   f"(input_context says {input_context.num_input_pipelines} pipelines)")
    if (num_hosts is None) != (host_index is None):
        out.append(f"num_hosts and host_index go together, got num_hosts={num_hosts!r}, host_index={host_index!r}")
    elif num_hosts is not None:
        if num_hosts < 1:
            out.append(f"num_hosts must be >= 1, got {num_hosts}")
        elif not 0 <= host_index < num_hosts:
            out.append(f"host_index must be in [0, {num_hosts}), got {host_index}")
    if config.deterministic is True and seed is None and (r.shuffles or r.random_crop):
        out.append("deterministic=True promises a repeatable order, but seed=None draws a new seed per call; "
                   "pass a seed")
    return out


def hide_gpus_from_tensorflow() -> None:
    """Keeps TensorFlow off the GPUs, so a JAX or PyTorch trainer in the same process owns them.

    tf.data runs on the CPU anyway, but TensorFlow reserves most of every visible GPU's memory the
    moment it starts its runtime. Call this before TensorFlow creates any tensor (before
    make_dataset). Setting CUDA_VISIBLE_DEVICES would hide the GPUs from the trainer too.

    Raises:
      TooLate (a RuntimeError): when TensorFlow has already started on visible GPUs (too late to hide them).
    """
    if not tf.config.list_physical_devices("GPU"):
        return  # a CPU-only TensorFlow, or no GPU: nothing to hide
    try:
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError as e:
        raise TooLate("TensorFlow already started on the GPUs; call hide_gpus_from_tensorflow() "
                           "before anything creates a TensorFlow tensor") from e


def as_numpy(dataset: tf.data.Dataset) -> Iterator:
    """Yields the dataset's batches as tuples of NumPy arrays (bfloat16 as ml_dtypes.bfloat16).

    For JAX: `jax.device_put(batch)` or `jnp.asarray`; for PyTorch: `torch.from_numpy(images)`
    (PyTorch has no ml_dtypes bfloat16, so read float32 or uint8 for it).
    """
    return dataset.as_numpy_iterator()


def numpy_batches(path: Union[str, DatasetInfo], split: str = "train", *, hide_gpus: bool = True,
                  **kwargs) -> Iterator:
    """make_dataset(path, split, **kwargs) as NumPy batches, with TensorFlow kept off the GPUs.

    Usage (JAX):
        for images, labels in reader.numpy_batches(path, "train", batch_size=128, image_size=224,
                                                   training=True, seed=0):
            state = train_step(state, images, labels)

    Args:
      path: dataset folder or DatasetInfo.
      split: split name.
      hide_gpus: call hide_gpus_from_tensorflow() first.
      **kwargs: make_dataset's keyword arguments.
    """
    if hide_gpus:
        hide_gpus_from_tensorflow()
    return as_numpy(make_dataset(path, split, **kwargs))
