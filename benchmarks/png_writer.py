"""The PNG writer against Pillow's, in this process: filters and levels on photos, 32x32 crops and
flat pictures; prepare_image per photo; array rows of 32x32x3, one by one and with encode_many.
Min of interleaved rounds, so a machine shared with other jobs still shows the same-run ratios
(README, --png_level).

    python -m benchmarks.png_writer [--images 400] [--rounds 3] [--many_rows 50000]
"""

import argparse
import glob
import io
import os
import time

import numpy as np
from PIL import Image

from benchmarks import corpus as corpus_lib
from imagerecords.pipeline.encode import arrays as array_encode
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode import png as png_writer


def pillow_png(img, level=1):
    """What codec.png_bytes was before the writer: Pillow's, at a zlib level, no metadata."""
    if isinstance(img, np.ndarray):
        img = Image.fromarray(img[:, :, 0] if img.ndim == 3 and img.shape[2] == 1 else img)
    clean = img.copy()
    clean.info = {}
    out = io.BytesIO()
    clean.save(out, format="PNG", compress_level=level, optimize=False)
    return out.getvalue()


def _flat(c, i):
    """A 640x480 drawing-like picture: gradients and a solid square."""
    yy, xx = np.mgrid[0:480, 0:640]
    img = np.stack([(xx * 4 + c * 60) % 256, (yy * 5 + i * 20) % 256, ((xx + yy) * 2) % 256], -1).astype(np.uint8)
    img[100:300, 80:280] = (250, 40 * c, 30 * i)
    return img


def _best(fn, items, rounds, number=1):
    """Min over `rounds` of the mean seconds of fn(item), and the mean output length."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(number):
            for item in items:
                fn(item)
        times.append((time.perf_counter() - t0) / (number * len(items)))
    return min(times), sum(len(fn(item)) for item in items) / len(items)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=400, help="corpus size (the benchmark's corpus)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--many_rows", type=int, default=50000, help="32x32x3 rows for encode_many against encode")
    a = p.parse_args(argv)
    corpus = corpus_lib.ensure_corpus(a.images, 0, 10, corpus_lib.CACHE)
    files = sorted(corpus.files)
    photos = [np.asarray(Image.open(f).convert("RGB")) for f in files[::8][:50]]
    sets = {"photo": photos,
            "32x32": [np.ascontiguousarray(ph[y:y + 32, 100:132]) for ph in photos for y in (0, 32, 64)],
            "flat": [_flat(c, i) for c in range(2) for i in range(5)]}
    writers = [("Pillow, zlib 1 (before)", lambda x: pillow_png(x, 1)),
               ("Pillow, zlib 6", lambda x: pillow_png(x, 6))]
    for name, kind in (("Up", png_writer.UP), ("Average", png_writer.AVERAGE), ("Paeth", png_writer.PAETH),
                       ("per row of 4", png_writer.ADAPTIVE)):
        for level in ((1, 6) if kind == png_writer.ADAPTIVE else (1,)):
            writers.append((f"{name}, libdeflate {level}" + (" (default)" if kind == png_writer.FILTER and
                                                              level == codec.PNG_LEVEL else ""),
                            lambda x, k=kind, lv=level: png_writer.encode(x, lv, k)))
    print("| writer | photo ms | photo KB | 32x32 us | 32x32 KB | flat ms | flat KB |")
    print("|---|---|---|---|---|---|---|")
    for name, fn in writers:
        cells = []
        for key, items in sets.items():
            t, size = _best(fn, items, a.rounds, number=10 if key == "32x32" else 1)
            cells += [f"{t * (1e6 if key == '32x32' else 1e3):.1f}", f"{size / 1e3:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)

    # prepare_image per photo: the JPEG path, and PNG with either writer (interleaved rounds).
    blobs = []
    for f in files[::4][:100]:
        with open(f, "rb") as fh:
            blobs.append(fh.read())
    ours = codec.png_bytes
    runs = {}
    try:
        for _ in range(a.rounds):
            for name, enc, level, writer in (("jpeg path", "jpeg", 1, ours), ("png 1, Pillow", "png", 1, pillow_png),
                                             ("png 1, ours", "png", 1, ours), ("png 0, Pillow", "png", 0, pillow_png),
                                             ("png 0, ours", "png", 0, ours)):
                codec.png_bytes = writer
                options = codec.ImageOptions(image_encoding=enc, png_level=level)
                t0 = time.perf_counter()
                for b in blobs:
                    codec.prepare_image(b, options)
                runs.setdefault(name, []).append((time.perf_counter() - t0) / len(blobs))
    finally:
        codec.png_bytes = ours
    jpeg = min(runs["jpeg path"])
    for name, ts in runs.items():
        print(f"prepare_image, {name}: {min(ts) * 1e3:.2f} ms a photo, x{jpeg / min(ts):.2f} the JPEG path's speed")

    # uint8 array rows, 32x32x3 (CIFAR-like: gradients and noise), as array_encode.encode_image stores them.
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:32, 0:32]
    rows = []
    for i in range(200):
        base = np.stack([(xx * (i % 7 + 1) + yy * 3) % 256, (yy * (i % 5 + 2)) % 256, (xx + yy + i) % 256], -1)
        rows.append(np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8))
    old = new = None
    for _ in range(a.rounds):
        o = _best(lambda x: pillow_png(x, 1), rows, 1, number=5)
        n = _best(lambda x: array_encode.encode_image(x, "png", 90, codec.PNG_LEVEL), rows, 1, number=5)
        old = o if old is None or o[0] < old[0] else old
        new = n if new is None or n[0] < new[0] else new
    print(f"32x32x3 array row: Pillow {old[0] * 1e6:.1f} us, {old[1]:.0f} B; ours {new[0] * 1e6:.1f} us, "
          f"{new[1]:.0f} B; x{new[0] / old[0]:.2f} the time")
    _many(a.many_rows, a.rounds)
    print(f"(load average {os.getloadavg()[0]:.1f}; {len(glob.glob(os.path.join(corpus.root, '*', '*')))} corpus files)")


def _many(count, rounds, block=1000):
    """encode_many over blocks of `block` rows against encode row by row: uniform noise and smooth
    gradients, 32x32x3 uint8; min of interleaved rounds, in microseconds a row."""
    rng = np.random.default_rng(1)
    yy, xx = np.mgrid[0:32, 0:32]
    sets = {"noise": rng.integers(0, 256, (count, 32, 32, 3), dtype=np.uint8),
            "gradients": np.stack([np.stack([(xx * (i % 7 + 1) + yy * 3) % 256, (yy * (i % 5 + 2)) % 256,
                                             (xx + yy + i) % 256], -1) for i in range(count)]).astype(np.uint8)}
    level = codec.PNG_LEVEL
    for name, rows in sets.items():
        one = many = None
        for _ in range(rounds):
            t0 = time.perf_counter()
            single = [png_writer.encode(row, level) for row in rows]
            t1 = time.perf_counter()
            bulk = [data for top in range(0, count, block) for data in png_writer.encode_many(rows[top:top + block], level)]
            t2 = time.perf_counter()
            one, many = min(one or 1e9, t1 - t0), min(many or 1e9, t2 - t1)
        if bulk != single:
            raise RuntimeError("encode_many's bytes differ from encode's")
        print(f"{count} 32x32x3 rows, {name}: encode {one / count * 1e6:.1f} us a row, encode_many "
              f"{many / count * 1e6:.1f} us a row (x{one / many:.2f} as fast), {sum(map(len, bulk)) / count:.0f} B a row")


if __name__ == "__main__":
    main()
