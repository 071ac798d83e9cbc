"""A near-duplicate corpus made by code: distinct photo-like pictures and edited copies of some.

Each picture is a seeded sum of smooth random fields (colour gradients, soft blobs, a few shaded
rectangles and ellipses, low-amplitude texture), so two pictures share no structure; the copies are
what a scrape finds twice: resized 0.5x and 0.8x, recompressed at quality 60, cropped 2-4%.
"""

import io
import os
from typing import Dict, Tuple

import numpy as np
from PIL import Image, ImageDraw, ImageFilter

EDITS = ("half", "fourfifths", "q60", "crop")


def picture(seed: int, size: Tuple[int, int] = (320, 240)) -> Image.Image:
    """A distinct photo-like RGB picture fixed by `seed`."""
    rng = np.random.default_rng(seed)
    w, h = size
    yy, xx = (np.mgrid[0:h, 0:w] / max(w, h)).astype(np.float32)
    img = np.zeros((h, w, 3), dtype=np.float32)
    for c in range(3):  # a tilted colour gradient per channel
        a, b = rng.uniform(-1, 1, 2)
        img[..., c] = 128 + 90 * (a * xx + b * yy) + rng.uniform(-40, 40)
    for _ in range(rng.integers(4, 9)):  # soft blobs of random colour
        cx, cy, r = rng.uniform(0, w / max(w, h)), rng.uniform(0, h / max(w, h)), rng.uniform(0.05, 0.3)
        blob = np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / np.float32(2 * r * r))
        img += blob[..., None] * rng.uniform(-120, 120, 3).astype(np.float32)
    pic = Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(pic)
    for _ in range(rng.integers(3, 7)):  # shapes with hard edges, like objects
        x0, y0 = int(rng.integers(0, w - 20)), int(rng.integers(0, h - 20))
        x1, y1 = x0 + int(rng.integers(15, w // 2)), y0 + int(rng.integers(15, h // 2))
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.rectangle if rng.random() < 0.5 else draw.ellipse)([x0, y0, x1, y1], fill=fill)
    noise = rng.standard_normal((h, w, 3), dtype=np.float32) * 6  # sensor-like texture
    out = np.clip(np.asarray(pic.filter(ImageFilter.GaussianBlur(1)), dtype=np.float32) + noise, 0, 255)
    return Image.fromarray(out.astype(np.uint8))


def edited(img: Image.Image, edit: str, seed: int = 0) -> Tuple[Image.Image, int]:
    """(the copy, the JPEG quality to save it at) for one of EDITS."""
    w, h = img.size
    if edit == "half":
        return img.resize((w // 2, h // 2), Image.Resampling.LANCZOS), 90
    if edit == "fourfifths":
        return img.resize((w * 4 // 5, h * 4 // 5), Image.Resampling.LANCZOS), 90
    if edit == "q60":
        return img, 60
    if edit == "crop":
        f = 0.02 + 0.02 * (seed % 3) / 2  # 2%, 3% or 4% of each side, off centre
        dx, dy = round(w * f), round(h * f)
        return img.crop((dx, dy // 2, w - dx // 2, h - dy)), 90
    raise ValueError(f"unknown edit {edit!r}")


def jpeg(img: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=quality)
    return out.getvalue()


def write(folder: str, originals: int = 40, copied: int = 20) -> Dict[str, object]:
    """Writes train/<label>/o<i>.jpg (originals) and validation/<label>/c<i>_<edit>.jpg (an edit of
    original i, one edit per copy, cycling through EDITS) under `folder`, as a manifest CSV too.

    The first copy's label differs from its original's (a label disagreement); the rest agree.
    Returns {"pairs": [(train key, validation key)], "csv": path, "keys": [every key]}.
    """
    rows, pairs, keys = ["path,label,split,key"], [], []
    labels = ("lake", "road", "tree", "wall")
    pictures = [picture(1000 + i) for i in range(originals)]
    for i in range(originals):
        label = labels[i % len(labels)]
        path = os.path.join(folder, "train", label, f"o{i}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(jpeg(pictures[i]))
        key = f"train/{label}/o{i}.jpg"
        rows.append(f"{path},{label},train,{key}")
        keys.append(key)
    for j in range(copied):
        i = j * max(1, originals // copied)
        edit = EDITS[j % len(EDITS)]
        label = labels[i % len(labels)] if j else labels[(i + 1) % len(labels)]
        copy, quality = edited(pictures[i], edit, j)
        path = os.path.join(folder, "validation", label, f"c{i}_{edit}.jpg")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(jpeg(copy, quality))
        key = f"validation/{label}/c{i}_{edit}.jpg"
        rows.append(f"{path},{label},validation,{key}")
        keys.append(key)
        pairs.append((f"train/{labels[i % len(labels)]}/o{i}.jpg", key))
    csv = os.path.join(folder, "list.csv")
    with open(csv, "w") as f:
        f.write("\n".join(rows) + "\n")
    return {"pairs": pairs, "csv": csv, "keys": keys}
