"""A cached, seeded, photo-like benchmark corpus in class folders (ImageNet-like sizes and qualities).

Every image is drawn from its own seeded RNG (seed, index), so a corpus is the same bytes on every
machine and no two files compress alike. Half the images start from one of scikit-learn's two
bundled photographs (`sklearn.datasets.load_sample_images`: a temple and a flower, 640x427), cropped
at a random place and scale, flipped, resized, colour-jittered and overlaid with a faint texture; the
other half are synthesized with natural-image statistics: 1/f^a ("pink") noise fields per channel,
channel-correlated, plus a smooth gradient. All get sensor-like noise. Sizes follow ImageNet:
short side 300-500 px, aspect 3:4 to 4:3 either way; JPEG quality 75-95. About 3% are PNG, 3%
greyscale JPEG and 2% CMYK JPEG, so the builder's conversion paths show up in its timings too.

The corpus lives in ~/.cache/imagerecords/bench-corpus-<params>/ and is reused when its
`corpus.json` (written last) is there.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
from concurrent.futures import ProcessPoolExecutor
from typing import Dict, List, Optional, Tuple

import numpy as np
from PIL import Image

VERSION = 1  # bump when the drawing changes, so old caches are not reused
CACHE = os.path.join(os.path.expanduser("~"), ".cache", "imagerecords")

PNG_FRACTION = 0.03
GREY_FRACTION = 0.03
CMYK_FRACTION = 0.02


@dataclasses.dataclass(frozen=True)
class Corpus:
    """A corpus on disk.

    Attributes:
      root: the class-folder root.
      files: every image path, sorted.
      num_bytes: total file size.
      kinds: {kind: count}: jpeg, png, grey, cmyk.
      classes: number of class folders.
    """

    root: str
    files: Tuple[str, ...]
    num_bytes: int
    kinds: Dict[str, int]
    classes: int

    @property
    def mean_kb(self) -> float:
        return self.num_bytes / max(len(self.files), 1) / 1e3


def corpus_dir(images: int, seed: int, classes: int, cache: str = CACHE) -> str:
    return os.path.join(cache, f"bench-corpus-v{VERSION}-n{images}-c{classes}-s{seed}")


def ensure_corpus(images: int, seed: int = 0, classes: int = 10, cache: str = CACHE,
                  workers: Optional[int] = None) -> Corpus:
    """Returns the corpus of `images` images, drawing it first if the cache does not hold it."""
    if images < 1 or classes < 1:
        raise ValueError(f"images and classes must be >= 1, got {images}, {classes}")
    root = corpus_dir(images, seed, classes, cache)
    meta_path = os.path.join(root, "corpus.json")
    if not os.path.exists(meta_path):
        shutil.rmtree(root, ignore_errors=True)  # a half-drawn corpus from an interrupted run
        tmp = root + ".partial"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        jobs = [(os.path.join(tmp, "images"), seed, i, classes) for i in range(images)]
        with ProcessPoolExecutor(workers or os.cpu_count() or 1) as pool:
            kinds = list(pool.map(_draw_one, jobs, chunksize=16))
        counts = {k: kinds.count(k) for k in ("jpeg", "png", "grey", "cmyk")}
        with open(os.path.join(tmp, "corpus.json"), "w") as f:
            json.dump({"version": VERSION, "images": images, "seed": seed, "classes": classes, "kinds": counts}, f)
        os.rename(tmp, root)
    with open(meta_path) as f:
        meta = json.load(f)
    images_root = os.path.join(root, "images")  # corpus.json stays outside the class-folder root
    files = []
    for dirpath, _, names in os.walk(images_root):
        files.extend(os.path.join(dirpath, n) for n in names)
    files.sort()
    return Corpus(images_root, tuple(files), sum(os.path.getsize(p) for p in files), meta["kinds"], classes)


def ensure_tiny_images(count: int = 64, cache: str = CACHE) -> List[str]:
    """Returns `count` distinct 32x32 JPEGs (for manifest builds where per-row overhead is measured)."""
    root = os.path.join(cache, f"bench-tiny-v{VERSION}-n{count}")
    files = [os.path.join(root, f"{i:04d}.jpg") for i in range(count)]
    if not all(os.path.exists(p) for p in files):
        os.makedirs(root, exist_ok=True)
        for i, p in enumerate(files):
            rng = np.random.default_rng([VERSION, 7, i])
            Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(p, quality=90)
    return files


_SAMPLES = None


def _samples() -> List[np.ndarray]:
    global _SAMPLES
    if _SAMPLES is None:
        from sklearn.datasets import load_sample_images

        _SAMPLES = [np.asarray(img, np.float32) for img in load_sample_images().images]
    return _SAMPLES


def _pink(rng: np.random.Generator, h: int, w: int, alpha: float) -> np.ndarray:
    """Three channels of 1/f^alpha noise (natural images have alpha near 2 in power), each ~N(0, 1)."""
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    f = np.sqrt(fx * fx + fy * fy)
    f[0, 0] = 1.0
    spectrum = (rng.standard_normal((3, h, fx.shape[1])) + 1j * rng.standard_normal((3, h, fx.shape[1]))) / f ** (alpha / 2)
    spectrum[:, 0, 0] = 0
    field = np.fft.irfft2(spectrum, s=(h, w))
    field /= field.std(axis=(1, 2), keepdims=True) + 1e-9
    return np.moveaxis(field, 0, -1)


def _size(rng: np.random.Generator) -> Tuple[int, int]:
    short = int(rng.integers(300, 501))
    aspect = rng.uniform(1.0, 4 / 3)
    long = int(round(short * aspect))
    return (short, long) if rng.random() < 0.7 else (long, short)  # (h, w): landscape mostly


def _from_photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    src = _samples()[int(rng.integers(len(_samples())))]
    sh, sw, _ = src.shape
    scale = rng.uniform(0.35, 1.0)
    ch = max(32, int(sh * scale))
    cw = max(32, min(sw, int(ch * w / h)))
    y = int(rng.integers(0, sh - ch + 1))
    x = int(rng.integers(0, sw - cw + 1))
    crop = Image.fromarray(src[y:y + ch, x:x + cw].astype(np.uint8)).resize((w, h), Image.Resampling.BICUBIC)
    img = np.asarray(crop, np.float32)
    if rng.random() < 0.5:
        img = img[:, ::-1]
    gain = rng.uniform(0.8, 1.2, 3)
    img = (img - 128) * rng.uniform(0.8, 1.2) * gain + 128 + rng.uniform(-20, 20)
    return img + _pink(rng, h, w, rng.uniform(1.8, 2.6)) * rng.uniform(6, 14)


def _synthetic(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    field = _pink(rng, h, w, rng.uniform(1.6, 2.4))
    mix = np.eye(3) * rng.uniform(0.2, 0.6) + rng.uniform(0.4, 0.8)  # channels correlate, as in photos
    img = field @ mix.T * rng.uniform(25, 45)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * x / w + np.sin(angle) * y / h)[..., None] * rng.uniform(-60, 60, 3)
    return img + ramp + rng.uniform(70, 180, 3)


def _draw_one(job) -> str:
    root, seed, index, classes = job
    rng = np.random.default_rng([VERSION, seed, index])
    h, w = _size(rng)
    img = _from_photo(rng, h, w) if rng.random() < 0.5 else _synthetic(rng, h, w)
    img = img + rng.normal(0, rng.uniform(1.5, 5.0), img.shape)  # sensor noise: no two files alike
    pixels = np.clip(img, 0, 255).astype(np.uint8)
    u = rng.random()
    quality = int(rng.integers(75, 96))
    folder = os.path.join(root, f"class_{index % classes:03d}")
    os.makedirs(folder, exist_ok=True)
    name = os.path.join(folder, f"img_{index:07d}")
    pil = Image.fromarray(pixels)
    if u < PNG_FRACTION:
        kind, path = "png", name + ".png"
        pil.save(path, format="PNG", compress_level=6)
    elif u < PNG_FRACTION + GREY_FRACTION:
        kind, path = "grey", name + ".jpg"
        pil.convert("L").save(path, format="JPEG", quality=quality)
    elif u < PNG_FRACTION + GREY_FRACTION + CMYK_FRACTION:
        kind, path = "cmyk", name + ".jpg"
        pil.convert("CMYK").save(path, format="JPEG", quality=quality)
    else:
        kind, path = "jpeg", name + ".jpg"
        buf = io.BytesIO()
        pil.save(buf, format="JPEG", quality=quality)
        with open(path, "wb") as f:
            f.write(buf.getvalue())
    return kind
