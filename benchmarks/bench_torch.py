"""PyTorch loaders on the same images and worker count: imagerecords.torch against its peers, as ratios.

Usage:
    python -m benchmarks.bench_torch [--images 1000] [--workers 2] [--batch 32] [--repeats 3] [--json F]

The benchmark corpus (benchmarks/corpus.py: seeded, photo-like, ImageNet-sized JPEGs and a few
PNG, grey and CMYK files in class folders) is built once with `imagerecords build --write_index`,
then one training epoch (random-resized crop to --size, flip, uint8 CHW batches) is read by:

  records      imagerecords.torch: RecordDataset + Loader (global shuffle; its own crop, which
               decodes JPEGs DCT-scaled when the crop allows)
  records_tv   the same dataset with the peers' torchvision transform (full decode), which
               separates the reader from the crop
  tfrecord     the `tfrecord` package: one tfrecord.torch.dataset.TFRecordDataset per shard (with
               its index, so each worker reads its slice), chained, shuffle queue 256, Pillow
               decode + the torchvision transform
  imagefolder  torchvision.datasets.ImageFolder over the source tree, shuffled, same transform

Every loader has --workers DataLoader workers and batch --batch. A figure is images per second
over the whole epoch (worker start included), and each round measures every loader once, in turn,
so the ratios (records / peer) pair figures taken side by side: the machines are shared and noisy
and only ratios travel between them (benchmarks/run.py's convention). Medians [min-max] over rounds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List

from benchmarks import corpus as corpus_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOADERS = ("records", "records_tv", "tfrecord", "imagefolder")
PEERS = ("tfrecord", "imagefolder", "records_tv")


def build_dataset(images_root: str, out: str, shards: int) -> None:
    cmd = [sys.executable, "-m", "imagerecords", "build", "--input", images_root, "--output", out, "--splits",
           "train=1.0", "--num_shards", str(shards), "--write_index", "--no_progress", "--max_reject_fraction", "0.05"]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)


def torchvision_crop(size: int):
    from torchvision import transforms

    return transforms.Compose([transforms.RandomResizedCrop(size), transforms.RandomHorizontalFlip(),
                               transforms.PILToTensor()])


def make_loaders(data: str, images_root: str, args) -> Dict[str, Callable[[], object]]:
    """{name: a function that returns a fresh DataLoader for one epoch}."""
    import torch
    from PIL import Image
    from tfrecord.torch.dataset import TFRecordDataset
    from torchvision.datasets import ImageFolder

    from imagerecords import torch as irt
    from imagerecords.format import schema

    crop = torchvision_crop(args.size)
    common = {"num_workers": args.workers}
    ours = irt.RecordDataset(data, "train", image_size=args.size, training=True)
    ours_tv = irt.RecordDataset(data, "train", transform=crop)
    keys = schema.keys(ours.manifest.schema)
    folder = os.path.join(data, ours.manifest.version or "")

    def decode(example):
        image = Image.open(io.BytesIO(example[keys.image])).convert("RGB")
        return crop(image), int(example[keys.label][0])

    def tfrecord_loader():
        parts = []
        for shard in ours.manifest.split("train").shards:
            name = shard.filename.rsplit("/", 1)[-1]
            parts.append(TFRecordDataset(os.path.join(folder, name), os.path.join(folder, "index", name + ".idx"),
                                         {keys.image: "byte", keys.label: "int"}, shuffle_queue_size=256,
                                         transform=decode))
        return torch.utils.data.DataLoader(torch.utils.data.ChainDataset(parts), batch_size=args.batch, **common)

    folder_ds = ImageFolder(images_root, transform=crop)
    epoch = {"n": 0}

    def records(ds):
        def make():
            epoch["n"] += 1
            loader = irt.Loader(ds, args.batch, seed=0, remainder="pad", **common)
            loader.set_epoch(epoch["n"])
            return loader
        return make

    return {
        "records": records(ours),
        "records_tv": records(ours_tv),
        "tfrecord": tfrecord_loader,
        "imagefolder": lambda: torch.utils.data.DataLoader(folder_ds, batch_size=args.batch, shuffle=True, **common),
    }


def epoch_rate(make_loader) -> Dict[str, float]:
    """Images per second over one epoch, and seconds to the first batch."""
    start = time.perf_counter()
    first, count = None, 0
    for images, labels in make_loader():
        if first is None:
            first = time.perf_counter() - start
        count += int((labels >= 0).sum())
    wall = time.perf_counter() - start
    return {"img_s": count / wall, "first_batch_s": first, "images": count}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache", default=corpus_lib.CACHE)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)

    corpus = corpus_lib.ensure_corpus(args.images, cache=args.cache)
    runs: Dict[str, List[dict]] = {name: [] for name in LOADERS}
    with tempfile.TemporaryDirectory(prefix="bench-torch-") as tmp:
        data = os.path.join(tmp, "ds")
        build_dataset(corpus.root, data, args.shards)
        loaders = make_loaders(data, corpus.root, args)
        for _ in range(args.repeats):
            for name in LOADERS:
                runs[name].append(epoch_rate(loaders[name]))
    figures = {}
    for name in LOADERS:
        rates = [r["img_s"] for r in runs[name]]
        figures[name] = {"img_s": statistics.median(rates), "img_s_min": min(rates), "img_s_max": max(rates),
                         "first_batch_s": statistics.median(r["first_batch_s"] for r in runs[name]),
                         "images": runs[name][0]["images"]}
    ratios = {}
    for peer in PEERS:
        per_round = [a["img_s"] / b["img_s"] for a, b in zip(runs["records"], runs[peer])]
        ratios[f"records_vs_{peer}"] = {"ratio": statistics.median(per_round), "min": min(per_round),
                                        "max": max(per_round)}
    print(f"{corpus.mean_kb:.0f} KB mean, {len(corpus.files)} images, {args.workers} workers, batch {args.batch}, "
          f"{args.size} px, {args.repeats} rounds (cores: {os.cpu_count()})")
    for name, fig in figures.items():
        print(f"  {name:<12} {fig['img_s']:8.1f} img/s [{fig['img_s_min']:.1f}-{fig['img_s_max']:.1f}]  "
              f"first batch {fig['first_batch_s']:.2f} s  ({fig['images']} images)")
    for name, r in ratios.items():
        print(f"  {name:<28} {r['ratio']:.2f} [{r['min']:.2f}-{r['max']:.2f}]")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "figures": figures, "ratios": ratios}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
