"""The `imagerecords` command: build, verify, inspect and demo."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import warnings
from typing import List, Optional, Sequence

USAGE = """imagerecords COMMAND [ARGS]

commands:
  build    build a sharded TFRecord dataset (imagerecords build --help)
  verify   check every shard's size and sha256 against manifest.json
  inspect  print a dataset's splits, shards and labels
  demo     generate a small image tree and build it (the README's first command)
"""


def verify(output: str) -> List[str]:
    """Returns the problems found comparing the shards in `output` with its manifest (none = [])."""
    from apache_beam.io.filesystems import FileSystems

    from imagerecords import metadata
    from imagerecords.records import HashingReader
    from imagerecords.transforms.common import read_bytes

    manifest = json.loads(read_bytes(FileSystems.join(output, metadata.MANIFEST)))
    problems = []
    for split, entry in sorted(manifest["splits"].items()):
        for shard in entry["shards"]:
            path = FileSystems.join(output, shard["filename"])
            if not FileSystems.exists(path):
                problems.append(f"{path}: missing")
                continue
            with FileSystems.open(path) as f:  # streamed: a shard can be hundreds of MB
                stream = HashingReader(f).drain()
            if stream.num_bytes != shard["num_bytes"]:
                problems.append(f"{path}: {stream.num_bytes} bytes, manifest says {shard['num_bytes']}")
            elif stream.sha256() != shard["sha256"]:
                problems.append(f"{path}: sha256 differs from the manifest")
    return problems


def _inspect(output: str) -> None:
    from imagerecords import reader

    info = reader.load_info(output)
    print(f"{info.name}: schema {info.schema}, {len(info.label_names)} labels, offset {info.label_offset}")
    for split, s in sorted(info.splits.items()):
        print(f"  {split}: {s.num_examples} records in {len(s.files)} shards")
    print(f"  labels: {', '.join(info.label_names[:20])}{' ...' if len(info.label_names) > 20 else ''}")


def _demo(argv: Sequence[str]) -> int:
    from imagerecords import example_images
    from imagerecords.pipeline.build import run

    p = argparse.ArgumentParser(prog="imagerecords demo", description="Generate example images and build them.")
    p.add_argument("output", nargs="?", default="example_output", help="folder for images/ and dataset/ (default: example_output)")
    known, beam_args = p.parse_known_args(argv)
    images = os.path.join(known.output, "images")
    dataset = os.path.join(known.output, "dataset")
    example_images.write_tree(images, per_class=16, broken=True)
    print(f"imagerecords demo: wrote {sum(1 for _ in _walk(images))} example images (one deliberately truncated) to {images}")
    run(["--input", images, "--output", dataset, "--splits", "train=0.75,validation=0.25", "--overwrite",
         "--max_reject_fraction", "0.05", *beam_args])
    print(f"read it back:  python -c \"from imagerecords import reader; print(reader.load_info('{dataset}'))\"")
    return 0


def _walk(root: str):
    for dirpath, _, files in os.walk(root):
        yield from (os.path.join(dirpath, f) for f in files)


def _quiet_libraries() -> None:
    """Keeps library start-up chatter off the user's terminal: TensorFlow's C++ info logs and the
    Google client libraries' FutureWarnings about Python and grpcio support dates, which Beam's
    GCP extras trigger on import. Real warnings and errors still show."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
    # Local worker processes inherit this (their warnings cannot be filtered by module here).
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    # The local job service relays every worker's start-up notices at WARNING; errors still show.
    logging.getLogger("apache_beam.runners.portability.local_job_service").setLevel(logging.ERROR)


def main(argv: Optional[Sequence[str]] = None) -> int:
    _quiet_libraries()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "build":
        from imagerecords.pipeline.build import OutputNotEmpty, run

        try:
            run(rest)
        except (ValueError, FileNotFoundError, OutputNotEmpty) as e:
            print(f"imagerecords build: error: {e}", file=sys.stderr)
            return 1
        except Exception as e:  # the runner wraps a worker's exception; show ours without its traceback
            marker = "RejectBudgetExceeded: "
            if marker not in str(e):
                raise
            print(f"imagerecords build: error: {str(e).split(marker, 1)[1].splitlines()[0]}", file=sys.stderr)
            return 1
        return 0
    if command == "verify":
        if len(rest) != 1:
            print("usage: imagerecords verify OUTPUT", file=sys.stderr)
            return 2
        problems = verify(rest[0])
        for problem in problems:
            print(problem)
        print("ok" if not problems else f"{len(problems)} problem(s)")
        return 1 if problems else 0
    if command == "inspect":
        if len(rest) != 1:
            print("usage: imagerecords inspect OUTPUT", file=sys.stderr)
            return 2
        _inspect(rest[0])
        return 0
    if command == "demo":
        return _demo(rest)
    print(f"imagerecords: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
    return 2
