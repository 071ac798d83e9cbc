"""Pillow decode and the usual train/eval crops, each drawing from a generator the caller seeds.

Both crops ask the JPEG decoder for a DCT-scaled image (`Image.draft`: 1/2, 1/4 or 1/8 of the size)
when the crop still has at least the output's pixels at that scale, so a small crop of a large
photo is not decoded at full size; the result is then resized with Pillow's antialiasing filter.
"""

from __future__ import annotations

import io
import math
from typing import Optional, Tuple, Union

import numpy as np
from PIL import Image

from imagerecords.format.errors import ReadError

Box = Tuple[float, float, float, float]  # left, upper, right, lower, in source pixels


Source = Union[bytes, Image.Image]  # an encoded image, or pixels already in a Pillow image (raw builds)


def _open(data: Source) -> Image.Image:
    return data if isinstance(data, Image.Image) else Image.open(io.BytesIO(data))


def decode(data: Source) -> Image.Image:
    """Returns the encoded image `data` (or a Pillow image) as an RGB Pillow image (decoded in full)."""
    return _open(data).convert("RGB")


def from_pixels(data: bytes, shape: Tuple[int, int, int]) -> Image.Image:
    """A raw build's uint8 pixels ([H, W, C] as bytes, C 1 or 3) as a Pillow image."""
    pixels = np.frombuffer(data, np.uint8).reshape(shape)
    return Image.fromarray(pixels[:, :, 0] if shape[2] == 1 else pixels)


def _crop_resize(data: Source, box_of, size: int) -> Image.Image:
    """Opens `data`, picks the crop with `box_of(width, height)`, decodes it drafted, resizes it."""
    image = _open(data)
    width, height = image.size
    left, upper, right, lower = box_of(width, height)
    if image.format == "JPEG":
        # draft() picks the largest reduction that keeps the image at least this size.
        want = (math.ceil(width * size / (right - left)), math.ceil(height * size / (lower - upper)))
        image.draft("RGB", want)
    sx, sy = image.size[0] / width, image.size[1] / height
    image = image.convert("RGB")
    return image.resize((size, size), Image.BILINEAR, box=(left * sx, upper * sy, right * sx, lower * sy))


class RandomResizedCrop:
    """Training crop: a random area and aspect ratio (the Inception crop, torchvision's parameters),
    resized to `size` x `size`, then flipped left-right with probability 1/2.

    Attributes:
      size: output side in pixels.
      scale: range of the crop's share of the image area.
      ratio: range of the crop's width / height, sampled log-uniformly.
      flip: whether to flip at random.
    """

    def __init__(self, size: int, scale: Tuple[float, float] = (0.08, 1.0),
                 ratio: Tuple[float, float] = (3 / 4, 4 / 3), flip: bool = True):
        if size < 1:
            raise ReadError(f"size must be >= 1, got {size}")
        if not 0 < scale[0] <= scale[1] <= 1:
            raise ReadError(f"scale must satisfy 0 < low <= high <= 1, got {scale}")
        if not 0 < ratio[0] <= ratio[1]:
            raise ReadError(f"ratio must satisfy 0 < low <= high, got {ratio}")
        self.size, self.scale, self.ratio, self.flip = size, tuple(scale), tuple(ratio), flip

    def box(self, width: int, height: int, rng: np.random.Generator) -> Box:
        """The crop box, as torchvision's RandomResizedCrop.get_params draws it (10 tries, then a
        center crop at the nearest allowed ratio)."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
                return left, top, left + w, top + h
        in_ratio = width / height
        if in_ratio < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif in_ratio > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        left, top = (width - w) // 2, (height - h) // 2
        return left, top, left + w, top + h

    def __call__(self, data: Source, rng: np.random.Generator) -> Image.Image:
        image = _crop_resize(data, lambda w, h: self.box(w, h, rng), self.size)
        if self.flip and rng.random() < 0.5:
            image = image.transpose(Image.FLIP_LEFT_RIGHT)
        return image

    def __repr__(self) -> str:
        return f"RandomResizedCrop(size={self.size}, scale={self.scale}, ratio={self.ratio}, flip={self.flip})"


class CenterCrop:
    """Evaluation crop: the image resized so its shorter side is `resize`, then the center
    `size` x `size` (done as one resize of the matching source box).

    Attributes:
      size: output side in pixels.
      resize: shorter side before the crop; default size / 0.875 (256 for 224, ImageNet's).
    """

    def __init__(self, size: int, resize: Optional[int] = None):
        resize = round(size / 0.875) if resize is None else resize
        if not 1 <= size <= resize:
            raise ReadError(f"need 1 <= size <= resize, got size={size}, resize={resize}")
        self.size, self.resize = size, resize

    def box(self, width: int, height: int) -> Box:
        side = min(width, height) * self.size / self.resize  # the crop's side in source pixels
        left, upper = (width - side) / 2, (height - side) / 2
        return left, upper, left + side, upper + side

    def __call__(self, data: Source, rng: Optional[np.random.Generator] = None) -> Image.Image:
        return _crop_resize(data, self.box, self.size)

    def __repr__(self) -> str:
        return f"CenterCrop(size={self.size}, resize={self.resize})"
