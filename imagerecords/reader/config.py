"""ReadConfig: every knob of the reader in one frozen dataclass, checked with all conflicts at once."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from imagerecords.reader.hosts import REMAINDER_POLICIES
from imagerecords.format.errors import ReadError

DTYPES = ("uint8", "float32", "bfloat16")
NORMALIZATIONS = ("none", "unit", "symmetric", "imagenet")
CORRUPT_POLICIES = ("fail", "skip")
PREPROCESSORS = ("train", "eval")
AUTOTUNE = -1

# A user preprocessing function: (encoded image bytes as a scalar tf.string: JPEG, or PNG in a build
# with --image_encoding png/keep; image_size; seed as an int64 tensor of shape [2] for
# tf.random.stateless_* ops) -> [image_size, image_size, channels] image, any numeric dtype, pixel
# values on the 0..255 scale.
PreprocessFn = Callable[[Any, int, Any], Any]


@dataclasses.dataclass(frozen=True)
class ReadConfig:
    """How make_dataset reads. None means "the usual choice for training or evaluation".

    make_dataset reads one order, the resumable one (imagerecords.reader.resume), unless `cache`
    is set: shuffle_files, shuffle_buffer, cycle_length and block_length shape only the cache
    pipeline's interleave and buffer; for the one order they only say whether it shuffles
    (shuffle_files=False with shuffle_buffer=0 reads the split in shard order).

    Attributes:
      shuffle_files: shuffle the order of this host's shards each epoch (seeded). None: when training.
      shuffle_buffer: records in the shuffle buffer; 0 turns it off. None: 10_000 when training,
        0 otherwise. Memory is about buffer x mean record size (JPEG bytes, not pixels).
      cycle_length: shards read at once by the interleave. None: min(16, shards of this host).
      block_length: consecutive records taken from one shard before moving to the next.
      deterministic: keep the element order independent of thread timing (parallel stages emit in
        input order). None: True when a seed is given or when not training.
      num_parallel_calls: parallelism of the interleave and of the decode (fused with the batch); -1 is AUTOTUNE.
      dtype: image dtype, "uint8", "float32" or "bfloat16". "uint8" moves a quarter of float32's
        bytes to the accelerator and leaves normalisation to it (see normalization_constants).
      normalization: "none" (0..255), "unit" (0..1), "symmetric" (-1..1), "imagenet" (ImageNet mean
        and standard deviation), or (mean, std) with three values each on the 0..255 scale. None:
        "unit" for float dtypes, "none" for uint8 (which takes no other).
      preprocess: "train" (random-resized crop decoded with decode_and_crop_jpeg, random flip,
        resize), "eval" (center crop decoded with decode_and_crop_jpeg, resize) or a function, see
        PreprocessFn. None: "train" when training, else "eval".
      crop_area_range: "train": range of the crop's share of the image area.
      crop_aspect_ratio_range: "train": range of the crop's width / height.
      random_flip: "train": flip left-right with probability 1/2.
      eval_crop_fraction: "eval": side of the square center crop over the shorter image side
        (0.875 is the usual 224/256).
      scaled_decode: "train" and "eval": when the crop is at least 2, 4 or 8 times image_size on
        both sides, let libjpeg decode it at 1/2, 1/4 or 1/8 scale (DCT scaling, an area average)
        before the bilinear resize. The decode and the resize then touch up to 64x fewer pixels;
        the image differs from a full decode + bilinear resize by about as much as two resize
        filters differ (it is less aliased, not blurrier). Never applies when the crop is
        smaller than 2 x image_size (most ImageNet crops at 224 px).
      zero_based_labels: subtract the dataset's label offset, so ids run from 0.
      with_filename: yield (images, labels, filenames) instead of (images, labels).
      cache: keep one epoch of this host's serialized records after the first epoch: True in
        memory, a path string on disk. Later epochs keep the first epoch's shard order but are still
        shuffled by the buffer, and crops are drawn afresh. It reads through the streaming interleave
        pipeline (the former default order), not the one resumable order, and takes no start_step.
      repeat: epochs to yield; -1 repeats forever. None: forever when training, once otherwise.
      drop_remainder: drop a last, smaller batch. None: True when training, False otherwise.
      prefetch: batches to prefetch; -1 is AUTOTUNE, 0 turns it off.
      host_remainder: how hosts get equal record counts, "drop" or "pad" (see
        imagerecords.reader.hosts). None: "drop" when training, "pad" otherwise.
      corrupt_records: "fail" refuses a shard file of another size than the manifest lists
        when the dataset is made (ShardSizeError, naming it), and raises an error naming the
        shard at the first bad record or a shard holding fewer records than the manifest says;
        "skip" drops bad records, reads a short shard's records and a long one's up to its
        count, counts the rest in ReadStats, logs the shard and carries on.
      check_files: before reading, fail naming every shard of the split that is missing.
      private_threadpool_size: threads of a tf.data pool private to this dataset, so a trainer's
        own TensorFlow ops do not queue behind decode work (and the reverse); 0 uses TensorFlow's
        shared pool.
      autotune_ram_budget_mb: cap on the memory tf.data's autotuner may spend on buffers (prefetch,
        parallel map outputs) in MB; 0 keeps tf.data's default (half the machine's RAM).
      channels: 3 (RGB) or 1 (greyscale) in every image yielded, whatever the records hold: grey
        records become RGB, RGB ones grey (the decoder's luma), and alpha (in PNG records) is
        composited over white. 16-bit records are scaled to the 0..255 scale (value * 255 / 65535);
        float dtypes keep their 16-bit precision, uint8 rounds. 1 takes normalization "none",
        "unit" or "symmetric" (the others are three per-channel values).
      options: tf.data.Options applied after the reader's own (they win where both are set).
      order_block: the resumable order (make_dataset's start_step or start_example given):
        records per block, consecutive records of one shard that the epoch's seeded block
        permutation moves together. Ignored otherwise.
      order_window: the resumable order: positions per window; each window of the permuted
        blocks is permuted again (seeded by seed, epoch and window), as a shuffle buffer of this
        size would mix it. It costs no memory: records are read one by one at their offsets.
    """

    shuffle_files: Optional[bool] = None
    shuffle_buffer: Optional[int] = None
    cycle_length: Optional[int] = None
    block_length: int = 1
    deterministic: Optional[bool] = None
    num_parallel_calls: int = AUTOTUNE
    dtype: str = "float32"
    normalization: Union[None, str, Tuple[Sequence[float], Sequence[float]]] = None
    preprocess: Union[None, str, PreprocessFn] = None
    crop_area_range: Tuple[float, float] = (0.08, 1.0)
    crop_aspect_ratio_range: Tuple[float, float] = (3 / 4, 4 / 3)
    random_flip: bool = True
    eval_crop_fraction: float = 0.875
    scaled_decode: bool = True
    zero_based_labels: bool = False
    with_filename: bool = False
    cache: Union[bool, str] = False
    repeat: Optional[int] = None
    drop_remainder: Optional[bool] = None
    prefetch: int = AUTOTUNE
    host_remainder: Optional[str] = None
    corrupt_records: str = "fail"
    check_files: bool = True
    private_threadpool_size: int = 0
    autotune_ram_budget_mb: int = 0
    channels: int = 3
    options: Any = None
    order_block: int = 64
    order_window: int = 16384

    def __post_init__(self):
        problems = self.problems()
        if problems:
            raise ReadError("ReadConfig: " + "; ".join(problems))

    def problems(self) -> List[str]:
        """Returns every invalid or conflicting setting, one message each (none = [])."""
        out = []
        if self.shuffle_buffer is not None and self.shuffle_buffer < 0:
            out.append(f"shuffle_buffer must be >= 0, got {self.shuffle_buffer}")
        if self.cycle_length is not None and self.cycle_length < 1:
            out.append(f"cycle_length must be >= 1, got {self.cycle_length}")
        if self.block_length < 1:
            out.append(f"block_length must be >= 1, got {self.block_length}")
        if self.num_parallel_calls != AUTOTUNE and self.num_parallel_calls < 1:
            out.append(f"num_parallel_calls must be >= 1 or -1 (AUTOTUNE), got {self.num_parallel_calls}")
        if self.dtype not in DTYPES:
            out.append(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        norm = self.normalization
        if isinstance(norm, str):
            if norm not in NORMALIZATIONS:
                out.append(f"normalization must be one of {', '.join(NORMALIZATIONS)} or (mean, std), got {norm!r}")
        elif norm is not None:
            try:
                mean, std = norm
                ok = len(mean) == 3 and len(std) == 3 and all(float(s) > 0 for s in std)
            except (TypeError, ValueError):
                ok = False
            if not ok:
                out.append(f"normalization as (mean, std) needs three values each and std > 0, got {norm!r}")
        if self.dtype == "uint8" and norm not in (None, "none"):
            out.append(f"dtype='uint8' holds only unnormalized pixels, but normalization={norm!r}; "
                       "use a float dtype or normalization='none'")
        if isinstance(self.preprocess, str) and self.preprocess not in PREPROCESSORS:
            out.append(f"preprocess must be 'train', 'eval', a function or None, got {self.preprocess!r}")
        elif self.preprocess is not None and not isinstance(self.preprocess, str) and not callable(self.preprocess):
            out.append(f"preprocess must be 'train', 'eval', a function or None, got {self.preprocess!r}")
        lo, hi = self.crop_area_range
        if not 0 < lo <= hi <= 1:
            out.append(f"crop_area_range must satisfy 0 < low <= high <= 1, got {self.crop_area_range}")
        lo, hi = self.crop_aspect_ratio_range
        if not 0 < lo <= hi:
            out.append(f"crop_aspect_ratio_range must satisfy 0 < low <= high, got {self.crop_aspect_ratio_range}")
        if not 0 < self.eval_crop_fraction <= 1:
            out.append(f"eval_crop_fraction must be in (0, 1], got {self.eval_crop_fraction}")
        if self.repeat is not None and (self.repeat == 0 or self.repeat < -1 or isinstance(self.repeat, bool)):
            out.append(f"repeat must be a number of epochs >= 1, -1 (forever) or None, got {self.repeat!r}")
        if self.prefetch < AUTOTUNE:
            out.append(f"prefetch must be >= 0 or -1 (AUTOTUNE), got {self.prefetch}")
        if self.host_remainder is not None and self.host_remainder not in REMAINDER_POLICIES:
            out.append(f"host_remainder must be one of {', '.join(REMAINDER_POLICIES)} or None, got {self.host_remainder!r}")
        if self.corrupt_records not in CORRUPT_POLICIES:
            out.append(f"corrupt_records must be one of {', '.join(CORRUPT_POLICIES)}, got {self.corrupt_records!r}")
        if self.private_threadpool_size < 0 or isinstance(self.private_threadpool_size, bool):
            out.append(f"private_threadpool_size must be >= 0 (0: the shared pool), got {self.private_threadpool_size!r}")
        if self.autotune_ram_budget_mb < 0 or isinstance(self.autotune_ram_budget_mb, bool):
            out.append(f"autotune_ram_budget_mb must be >= 0 (0: tf.data's default), got {self.autotune_ram_budget_mb!r}")
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            out.append(f"channels must be 1 (greyscale) or 3 (RGB), got {self.channels!r}")
        elif self.channels == 1 and not (norm is None or norm in ("none", "unit", "symmetric")):
            out.append(f"channels=1 takes normalization 'none', 'unit' or 'symmetric', not the per-channel {norm!r}")
        if self.order_block < 1 or isinstance(self.order_block, bool):
            out.append(f"order_block must be >= 1, got {self.order_block!r}")
        if self.order_window < 1 or isinstance(self.order_window, bool):
            out.append(f"order_window must be >= 1, got {self.order_window!r}")
        if self.cache is not True and self.cache is not False and not (isinstance(self.cache, str) and self.cache):
            out.append(f"cache must be True, False or a file path prefix, got {self.cache!r}")
        return out


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A ReadConfig with every None replaced for one make_dataset call (internal)."""

    shuffle_files: bool
    shuffle_buffer: int
    deterministic: bool
    random_crop: bool
    normalization: Union[str, Tuple[Sequence[float], Sequence[float]]]
    preprocess: Union[str, PreprocessFn]
    repeat: int
    drop_remainder: bool
    host_remainder: str

    @property
    def shuffles(self) -> bool:
        return self.shuffle_files or self.shuffle_buffer > 0


def normalization_constants(
        normalization: Union[str, Tuple[Sequence[float], Sequence[float]]]) -> Tuple[Tuple[float, ...], Tuple[float, ...]]:
    """Returns (mean, std), three values each on the 0..255 scale, of a ReadConfig normalization.

    For normalising uint8 batches on the accelerator: image = (uint8 - mean) / std.

    Raises:
      ValueError: naming an unknown normalization.
    """
    if isinstance(normalization, str):
        table = {"none": ((0.0,) * 3, (1.0,) * 3), "unit": ((0.0,) * 3, (255.0,) * 3),
                 "symmetric": ((127.5,) * 3, (127.5,) * 3),
                 "imagenet": ((0.485 * 255, 0.456 * 255, 0.406 * 255), (0.229 * 255, 0.224 * 255, 0.225 * 255))}
        if normalization not in table:
            raise ReadError(f"normalization must be one of {', '.join(NORMALIZATIONS)} or (mean, std), "
                            f"got {normalization!r}")
        return table[normalization]
    mean, std = normalization
    return tuple(float(m) for m in mean), tuple(float(s) for s in std)


def resolve(config: ReadConfig, training: bool, seed_given: bool) -> Resolved:
    """Fills the config's None fields with the training or evaluation defaults (the only place that does).

    Args:
      config: a valid ReadConfig.
      training: make_dataset's `training`.
      seed_given: whether the caller passed a seed; an unseeded training order need not be
        repeatable, so only then may parallel stages emit out of order.
    """

    def pick(value, train, other):
        return value if value is not None else (train if training else other)

    return Resolved(
        shuffle_files=pick(config.shuffle_files, True, False),
        shuffle_buffer=pick(config.shuffle_buffer, 10_000, 0),
        deterministic=config.deterministic if config.deterministic is not None else (seed_given or not training),
        random_crop=pick(config.preprocess, "train", "eval") == "train",
        normalization=config.normalization if config.normalization is not None else (
            "none" if config.dtype == "uint8" else "unit"),
        preprocess=pick(config.preprocess, "train", "eval"),
        repeat=pick(config.repeat, -1, 1),
        drop_remainder=pick(config.drop_remainder, True, False),
        host_remainder=pick(config.host_remainder, "drop", "pad"),
    )
