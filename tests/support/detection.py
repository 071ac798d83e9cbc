"""A detection-style dataset for the declared-feature tests: images, boxes of varying count, class
lists, a float, a caption, a palette PNG mask and a 16-bit depth PNG per row."""

import numpy as np
from PIL import Image

CONFIG = """features:
  boxes:   {dtype: float32, shape: [null, 4]}
  tags:    {dtype: class_list}
  score:   {dtype: float32}
  caption: {dtype: string}
  mask:    {dtype: image, encoding: png}
  depth:   {dtype: image, encoding: keep, bits: 16}
max_reject_fraction: 0.5
"""


def write_rows(folder, n=12):
    """Writes the images of `n` rows into `folder` and returns the rows (manifest-relative paths)."""
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        Image.fromarray(rng.integers(0, 255, (18 + i, 22, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
        palette = Image.fromarray(rng.integers(0, 6, (18 + i, 22), dtype=np.uint8), "P")
        palette.putpalette([c for k in range(6) for c in (40 * k, 255 - 40 * k, 7 * k)])
        palette.save(folder / f"mask{i}.png")  # palette mask: its indices are the class ids
        Image.fromarray(rng.integers(0, 65535, (18 + i, 22), dtype=np.uint16)).save(folder / f"depth{i}.png")
        k = i % 4
        rows.append({"path": f"img{i}.png", "label": ["cat", "dog"][i % 2],
                     "boxes": [[0.125 * j, 0.2 + j, 0.3, 1 / 3] for j in range(k)],
                     "tags": ["sky", "tree", "car", "zebra"][:k][::-1], "score": i / 7,
                     "caption": f"picture {i}, naïve “quoted”", "mask": f"mask{i}.png", "depth": f"depth{i}.png",
                     "unused": i, "note": "x"})
    return rows


