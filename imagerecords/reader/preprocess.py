"""Image preprocessing: crop on the encoded JPEG's shape, decode only the crop, flip, resize, scale."""

from __future__ import annotations

from typing import Sequence, Tuple, Union

import numpy as np
import tensorflow as tf

from imagerecords.reader.config import normalization_constants

# ImageNet channel statistics on the 0..255 scale (the values torchvision and Model Garden use).
IMAGENET_MEAN, IMAGENET_STD = normalization_constants("imagenet")

# libjpeg's DCT scaling factors that TensorFlow's decoders take as `ratio`.
_RATIOS = (1, 2, 4, 8)


def train_image(encoded: tf.Tensor, image_size: int, seed: tf.Tensor, *,
                area_range: Tuple[float, float] = (0.08, 1.0),
                aspect_ratio_range: Tuple[float, float] = (3 / 4, 4 / 3),
                flip: bool = True, scaled_decode: bool = False, channels: int = 3) -> tf.Tensor:
    """Random-resized crop: samples a crop on the JPEG's header shape and decodes only that window.

    Decoding the crop alone skips the pixels a crop throws away, which on ImageNet-sized photos is
    most of the decode time. The randomness is stateless: equal seeds give equal crops.

    Args:
      encoded: scalar tf.string of JPEG bytes.
      image_size: side of the square output.
      seed: int64 tensor of shape [2] for tf.random stateless ops.
      area_range: range of the crop's share of the image area.
      aspect_ratio_range: range of the crop's width / height.
      flip: flip left-right with probability 1/2.
      scaled_decode: decode at 1/2, 1/4 or 1/8 scale when the crop is that many times image_size
        (see ReadConfig.scaled_decode).
      channels: 3 (RGB) or 1 (greyscale, libjpeg's conversion).

    Returns:
      float32 [image_size, image_size, channels] on the 0..255 scale.
    """
    begin, size = sample_crop(tf.image.extract_jpeg_shape(encoded), seed, area_range, aspect_ratio_range)
    offset_y, offset_x, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(size)
    image = decode_window(encoded, offset_y, offset_x, height, width, image_size, scaled_decode, channels)
    if flip:
        image = random_flip(image, seed)
    return resize(image, image_size, channels)


def sample_crop(shape: tf.Tensor, seed: tf.Tensor, area_range: Tuple[float, float],
                aspect_ratio_range: Tuple[float, float]) -> Tuple[tf.Tensor, tf.Tensor]:
    """train_image's random crop of an image of `shape` [h, w, c]: (begin, size) for tf.slice."""
    crop_seed, _ = _split(seed)
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], tf.float32, [1, 1, 4]),
        seed=crop_seed,
        min_object_covered=area_range[0],
        aspect_ratio_range=aspect_ratio_range,
        area_range=area_range,
        max_attempts=10,
        use_image_if_no_bounding_boxes=True,
    )
    return begin, size


def random_flip(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """train_image's left-right flip (probability 1/2, the same for the same seed), for any dtype.

    train_image flips the decoded crop, before the resize. For uint8 output make_dataset flips the
    finished image instead, which is smaller (224 x 224 x 1 byte against an average crop of about
    twice the pixels); flip commutes with the resize and the rounding up to float rounding.
    """
    return tf.image.stateless_random_flip_left_right(image, seed=_split(seed)[1])


def _split(seed: tf.Tensor):
    """(crop seed, flip seed) of one element's seed."""
    return tf.unstack(tf.random.experimental.stateless_split(seed, 2))


def eval_image(encoded: tf.Tensor, image_size: int, crop_fraction: float = 0.875,
               scaled_decode: bool = False, channels: int = 3) -> tf.Tensor:
    """Square center crop of `crop_fraction` of the shorter side, decoded alone, then resized.

    Args:
      encoded: scalar tf.string of JPEG bytes.
      image_size: side of the square output.
      crop_fraction: side of the crop over the shorter image side.
      scaled_decode: see train_image.
      channels: 3 (RGB) or 1 (greyscale).

    Returns:
      float32 [image_size, image_size, channels] on the 0..255 scale.
    """
    shape = tf.image.extract_jpeg_shape(encoded)
    offset_y, offset_x, side = center_crop(shape, crop_fraction)
    image = decode_window(encoded, offset_y, offset_x, side, side, image_size, scaled_decode, channels)
    return resize(image, image_size, channels)


def center_crop(shape: tf.Tensor, crop_fraction: float) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """eval_image's square crop of an image of `shape` [h, w, ...]: (offset_y, offset_x, side)."""
    height, width = shape[0], shape[1]
    side = tf.maximum(tf.cast(crop_fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32), 1)
    return (height - side + 1) // 2, (width - side + 1) // 2, side


def decode_window(encoded: tf.Tensor, offset_y: tf.Tensor, offset_x: tf.Tensor, height: tf.Tensor,
                  width: tf.Tensor, image_size: int, scaled: bool, channels: int = 3) -> tf.Tensor:
    """Decodes only the window of a JPEG, as RGB (or greyscale) uint8; scaled by 1/r (r in 1, 2, 4, 8) when `scaled`.

    r is the largest factor that keeps both sides of the window at least image_size after
    scaling, so the resize that follows still only shrinks. libjpeg then skips most of the inverse
    DCT work (its scaled IDCT averages each 8x8 block down), and the resize reads r^2 fewer pixels.
    With a ratio, TensorFlow takes the crop window in the scaled image's coordinates.
    """
    if not scaled:
        return tf.image.decode_and_crop_jpeg(encoded, tf.stack([offset_y, offset_x, height, width]), channels=channels)
    short = tf.minimum(height, width)
    branch = tf.add_n([tf.cast(short >= r * image_size, tf.int32) for r in _RATIOS[1:]])

    def decode(r):
        def fn():
            window = tf.stack([offset_y // r, offset_x // r, tf.maximum(height // r, 1), tf.maximum(width // r, 1)])
            return tf.image.decode_and_crop_jpeg(encoded, window, channels=channels, ratio=r)
        return fn

    return tf.switch_case(branch, [decode(r) for r in _RATIOS])


def resize(image: tf.Tensor, image_size: int, channels: int = 3) -> tf.Tensor:
    image = tf.image.resize(image, [image_size, image_size], method=tf.image.ResizeMethod.BILINEAR)
    image.set_shape([image_size, image_size, channels])
    return image


def _per_channel(image: tf.Tensor, mean: Sequence[float], std: Sequence[float]) -> tf.Tensor:
    """(image - mean) / std per channel, computed as image * (1 / std) + (-mean / std).

    When the image's shape is static the two constants are given that whole shape: TensorFlow's
    CPU kernels apply a 3-vector across an image several times slower than they combine two
    tensors of one shape (docs/reader.md, Speed).
    """
    scale = 1.0 / np.asarray(std, np.float32)
    offset = -np.asarray(mean, np.float32) * scale
    if image.shape.is_fully_defined() and image.shape.rank == 3 and image.shape[-1] == len(scale):
        scale = np.ascontiguousarray(np.broadcast_to(scale, image.shape))
        offset = np.ascontiguousarray(np.broadcast_to(offset, image.shape))
    return image * tf.constant(scale) + tf.constant(offset)


def finish(image: tf.Tensor, dtype: str,
           normalization: Union[str, Tuple[Sequence[float], Sequence[float]]], in_range: bool = False) -> tf.Tensor:
    """Scales a 0..255 image as `normalization` says and casts it to `dtype`.

    Args:
      image: numeric image on the 0..255 scale.
      dtype: "uint8", "float32" or "bfloat16".
      normalization: "none", "unit", "symmetric", "imagenet" or (mean, std) on the 0..255 scale.
      in_range: the float image is known to lie in [0, 255] (a bilinear resize of uint8 pixels
        does), so uint8 needs no clipping: it is rounded half up in one pass.

    Returns:
      The image in `dtype`; uint8 values are rounded and clipped to 0..255.
    """
    if dtype == "uint8":
        if image.dtype == tf.uint8:
            return image
        if in_range and image.dtype == tf.float32:
            return tf.cast(image + 0.5, tf.uint8)  # the cast truncates: floor(x + 0.5) for x >= 0
        return tf.saturate_cast(tf.round(tf.cast(image, tf.float32)), tf.uint8)
    image = tf.cast(image, tf.float32)
    if normalization == "unit":
        image = image / 255.0
    elif normalization == "symmetric":
        image = image / 127.5 - 1.0
    elif normalization == "imagenet":
        image = _per_channel(image, IMAGENET_MEAN, IMAGENET_STD)
    elif normalization != "none":
        image = _per_channel(image, *normalization)
    return tf.cast(image, tf.bfloat16) if dtype == "bfloat16" else image
