"""Records that are not all RGB JPEGs (built with --image_encoding png or keep): each record is
decoded by what its bytes are, PNG in full and cropped, JPEG through the crop-only JPEG path."""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Tuple

import tensorflow as tf

from imagerecords.reader import preprocess as preprocess_lib

_PNG_MAGIC = b"\x89PNG"
# 255 / 65535: a 16-bit value on the 0..255 scale (8-bit values decoded as 16-bit, x * 257, come back exact).
_SIXTEEN_TO_EIGHT = 255.0 / 65535.0


def decode_png(encoded: tf.Tensor, channels: int, image_kinds: Mapping[str, int]) -> tf.Tensor:
    """Decodes a PNG record to float32 [h, w, channels] on the 0..255 scale.

    16-bit records keep their precision as fractions of the 0..255 scale; alpha (when any record of
    the dataset has it) is composited over white, as the JPEG builder does, so transparent pixels
    are white and not whatever colour they hid.
    """
    alpha = any(k.startswith("png:") and k.split(":")[1] in ("2", "4") for k in image_kinds)
    sixteen = any(k.endswith(":uint16") for k in image_kinds)
    dtype = tf.uint16 if sixteen else tf.uint8
    image = tf.io.decode_png(encoded, channels=4 if alpha else channels, dtype=dtype)
    image = tf.cast(image, tf.float32)
    if sixteen:
        image = image * _SIXTEEN_TO_EIGHT
    if alpha:
        rgb, a = image[..., :3], image[..., 3:] / 255.0
        image = rgb * a + 255.0 * (1.0 - a)
        if channels == 1:
            image = tf.image.rgb_to_grayscale(image)
    return image


def _is_png(encoded: tf.Tensor) -> tf.Tensor:
    return tf.equal(tf.strings.substr(encoded, 0, len(_PNG_MAGIC)), _PNG_MAGIC)


def raw_pixels(encoded: tf.Tensor, shape: Tuple[int, int, int], channels: int) -> tf.Tensor:
    """A raw uint8 record ([H, W, C] pixels as bytes, features.raw_pixels_shape) as uint8 [H, W, channels]."""
    image = tf.reshape(tf.io.decode_raw(encoded, tf.uint8), shape)
    if shape[2] == channels:
        return image
    if channels == 3:
        return tf.image.grayscale_to_rgb(image)
    return tf.cast(tf.round(tf.image.rgb_to_grayscale(tf.cast(image, tf.float32))), tf.uint8)


def image_fn(preprocess: str, channels: int, image_kinds: Mapping[str, int], *, area_range: Tuple[float, float],
             aspect_ratio_range: Tuple[float, float], flip: bool, scaled_decode: bool,
             crop_fraction: float, raw_shape: Optional[Tuple[int, int, int]] = None
             ) -> Callable[[tf.Tensor, int, tf.Tensor], tf.Tensor]:
    """The built-in 'train' or 'eval' preprocessing for a dataset holding these image kinds.

    A JPEG record takes preprocess.train_image / eval_image (crop decoded alone); a PNG record is
    decoded whole (zlib cannot skip rows) and then cropped the same way, with the same random crop
    for the same seed and shape. Both give float32 [image_size, image_size, channels], 0..255.
    """
    has_jpeg = any(k.startswith("jpeg:") for k in image_kinds)
    has_png = any(k.startswith("png:") for k in image_kinds)

    def png(encoded, image_size, seed):
        if raw_shape is not None:  # raw pixels take the PNG path from their decode on
            image = tf.cast(raw_pixels(encoded, raw_shape, channels), tf.float32)
        else:
            image = decode_png(encoded, channels, image_kinds)
        shape = tf.shape(image)
        if preprocess == "train":
            begin, size = preprocess_lib.sample_crop(shape, seed, area_range, aspect_ratio_range)
            image = tf.slice(image, begin, size)
            if flip:
                image = preprocess_lib.random_flip(image, seed)
        else:
            offset_y, offset_x, side = preprocess_lib.center_crop(shape, crop_fraction)
            image = tf.slice(image, tf.stack([offset_y, offset_x, 0]), tf.stack([side, side, channels]))
        return preprocess_lib.resize(image, image_size, channels)

    def jpeg(encoded, image_size, seed):
        if preprocess == "train":
            return preprocess_lib.train_image(encoded, image_size, seed, area_range=area_range,
                                              aspect_ratio_range=aspect_ratio_range, flip=flip,
                                              scaled_decode=scaled_decode, channels=channels)
        return preprocess_lib.eval_image(encoded, image_size, crop_fraction, scaled_decode, channels)

    def fn(encoded, image_size, seed):
        if raw_shape is not None or not has_jpeg:
            return png(encoded, image_size, seed)
        if not has_png:
            return jpeg(encoded, image_size, seed)
        return tf.cond(_is_png(encoded), lambda: png(encoded, image_size, seed),
                       lambda: jpeg(encoded, image_size, seed))

    return fn
