"""The build job: build_pipeline(p, config) wires the stages; run(argv) launches and reports."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Dict, Optional, Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, PipelineOptions, StandardOptions

from imagerecords import __version__, metadata
from imagerecords import refs as refs_lib
from imagerecords.config import BuildConfig, load_preset, make_config
from imagerecords.transforms import (AssignLabels, Finalize, GlobalShuffle, ListImages, ReadManifest,
                                     WriteShards, WriteWithBeamSink)
from imagerecords.transforms.common import REJECTED, read_bytes
from imagerecords.transforms.listing import is_manifest


def versions() -> Dict[str, str]:
    """Versions recorded in the manifest: a build is reproducible for equal versions."""
    from importlib import metadata as importlib_metadata

    out = {"imagerecords": __version__}
    for label, dists in (("apache-beam", ["apache-beam"]), ("tensorflow", ["tensorflow", "tensorflow-cpu"]),
                         ("pillow", ["pillow"]), ("numpy", ["numpy"])):
        for dist in dists:
            try:
                out[label] = importlib_metadata.version(dist)
                break
            except importlib_metadata.PackageNotFoundError:
                continue
    return out


def build_pipeline(p: beam.Pipeline, config: BuildConfig, progress_dir: Optional[str] = None):
    """Adds the whole build to pipeline `p`.

    Args:
      p: the pipeline.
      config: what to build.
      progress_dir: a local folder where shard writers report progress (local runs), or None.

    Returns:
      A PCollection holding the single manifest dict written.
    """
    label_map = None
    if config.label_map:
        text = read_bytes(config.label_map).decode("utf-8")
        label_map = refs_lib.read_label_map(text, config.label_map, config.label_offset)
    if is_manifest(config.input):
        columns = refs_lib.ManifestColumns(config.path_column, config.label_column, config.split_column, config.key_column)
        listed = p | "ReadManifest" >> ReadManifest(config.input, columns)
    else:
        listed = p | "ListImages" >> ListImages(config.input)
    labelled = listed.refs | "AssignLabels" >> AssignLabels(
        label_map, config.label_type, config.label_offset, config.splits, config.split_seed)
    # ImageRef with split and label_id set
    if config.writer == "shards":
        shuffled = labelled["refs"] | "GlobalShuffle" >> GlobalShuffle(
            config.seed, config.num_shards, config.target_shard_mb, config.min_shards)
        # (ShardKey, [ImageRef sorted by hash])
        written = shuffled["shards"] | "WriteShards" >> WriteShards(
            config.output, config.name, labelled["labels"], config.schema, config.image, config.threads,
            config.write_index, progress_dir)
    else:
        split_names = [n for n, _ in config.splits] if config.splits else list(config.split_names or ["train"])
        written = labelled["refs"] | "WriteWithBeamSink" >> WriteWithBeamSink(
            config.output, config.name, labelled["labels"], split_names, config.num_shards or config.min_shards,
            config.schema, config.image)
    rejected = (listed[REJECTED], labelled[REJECTED], written[REJECTED]) | "AllRejected" >> beam.Flatten()
    return {"results": written["results"], "rejected": rejected, "labels": labelled["labels"]} | "Finalize" >> Finalize(
        config.output, config.name, config.schema, config.seed, config.to_json(), versions(),
        config.max_reject_fraction, config.overwrite)


class OutputNotEmpty(RuntimeError):
    pass


def check_paths(config: BuildConfig) -> None:
    """Fails before the pipeline starts when the input is missing or the output holds data.

    Raises:
      FileNotFoundError: naming the input.
      OutputNotEmpty: naming the output folder and what is in it, unless config.overwrite.
    """
    if is_manifest(config.input):
        if not FileSystems.exists(config.input):
            raise FileNotFoundError(f"input manifest not found: {config.input}")
    elif not FileSystems.match([config.input.rstrip("/") + "/**"], limits=[1])[0].metadata_list:
        raise FileNotFoundError(f"input folder not found or empty: {config.input} (expected {config.input}/<label>/<image>)")
    existing = FileSystems.match([FileSystems.join(config.output, "*")])[0].metadata_list
    if existing and not config.overwrite:
        names = sorted(m.path.rsplit("/", 1)[-1] for m in existing)
        raise OutputNotEmpty(
            f"output folder {config.output} is not empty ({len(names)} files, e.g. {', '.join(names[:3])}); "
            "pass --overwrite to replace a dataset this tool wrote there (other files are left alone)")


def _progress_reporter(progress_dir: str, stop: threading.Event, stream=sys.stderr) -> None:
    """Prints 'images done/total' from the shard writers' progress files until `stop` is set."""
    start = time.monotonic()
    while not stop.wait(2.0):
        done = total = 0
        for name in os.listdir(progress_dir):
            if name.endswith(".json"):
                try:
                    with open(os.path.join(progress_dir, name)) as f:
                        state = json.load(f)
                except (OSError, ValueError):
                    continue
                done += state["done"]
                total += state["total"]
        if total:
            rate = done / max(time.monotonic() - start, 1e-9)
            stream.write(f"\r[imagerecords] {done}/{total} images written in the shards started so far "
                         f"({rate:.0f} images/s)   ")
            stream.flush()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="imagerecords build",
        description="Build a sharded TFRecord dataset from a class-folder tree or a CSV/JSONL manifest. "
                    "Flags not listed here are Apache Beam pipeline options (e.g. --runner, --project).")
    a = p.add_argument
    a("--input", help="class-folder root (root/<label>/**/<image>) or a .csv/.jsonl manifest; local or gs://, s3://")
    a("--output", help="output folder (local or gs://...)")
    a("--config", help="YAML preset (see configs/); flags given here override it")
    a("--name", help="dataset name, the shard file prefix (default: images)")
    a("--schema", choices=["tfds", "tf-models"], help="example schema preset (default: tfds)")
    a("--seed", type=int, help="shuffle seed (default: 0); same seed + input = same bytes")
    a("--splits", help="assign splits by key hash, e.g. train=0.8,validation=0.2 (default: manifest's split column or 'train')")
    a("--split_seed", type=int, help="salt of the split hash (default: 0)")
    a("--split_names", help="comma-separated split names; only --writer beam needs them, with a manifest split column")
    a("--num_shards", type=int, help="shards per split (default: from --target_shard_mb)")
    a("--target_shard_mb", type=float, help="wanted shard size in MB when --num_shards is not given (default: 192)")
    a("--min_shards", type=int, help="fewest shards per split when automatic, capped at the image count (default: 8)")
    a("--max_side", type=int, help="shrink so the longer side is at most this many pixels")
    a("--short_side", type=int, help="shrink so the shorter side is at most this many pixels")
    a("--quality", type=int, help="JPEG quality when re-encoding (default: 90)")
    a("--reencode", action="store_true", default=None, help="re-encode JPEGs that could pass through unchanged")
    a("--writer", choices=["shards", "beam"], help="shards (default, reproducible) or beam (WriteToTFRecord)")
    a("--label_map", help="label map file: .txt one name per line, or .json {name: id}")
    a("--label_type", choices=["auto", "name", "int"], help="how labels are read (default: auto)")
    a("--label_offset", type=int, help="added to every label id, e.g. 1 for ImageNet conventions (default: 0)")
    a("--path_column", help="manifest column with the image path (default: path, else uri)")
    a("--label_column", help="manifest column with the label (default: label)")
    a("--split_column", help="manifest column with the split (default: split)")
    a("--key_column", help="manifest column with a unique key (default: key, else the path)")
    a("--max_reject_fraction", type=float, help="fail without publishing above this rejected fraction (default: 0.01)")
    a("--threads", type=int, help="decode threads per shard writer (default: 4)")
    a("--write_index", action="store_true", default=None, help="also write <shard>.index record offsets")
    a("--overwrite", action="store_true", default=None, help="replace a dataset this tool wrote in --output")
    a("--no_progress", action="store_true", help="do not print progress on local runs")
    return p


def parse_args(argv: Sequence[str]):
    """Returns (BuildConfig, Beam args) from the command line and the optional YAML preset."""
    known, beam_args = parser().parse_known_args(list(argv))
    preset, preset_beam_args = ({}, [])
    if known.config:
        preset, preset_beam_args = load_preset(known.config)
    flags = {k: v for k, v in vars(known).items() if k not in ("config", "no_progress")}
    if flags.get("split_names"):
        flags["split_names"] = tuple(s.strip() for s in flags["split_names"].split(",") if s.strip())
    if not (flags.get("input") or preset.get("input")) or not (flags.get("output") or preset.get("output")):
        raise SystemExit("imagerecords build: --input and --output are required (see --help)")
    return make_config(preset, flags), preset_beam_args + beam_args, known.no_progress


def _is_local(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner
    return runner is None or "direct" in str(runner).lower()


def run(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Runs a build from command-line style arguments and returns the manifest written ({} when
    --template_location only staged a Dataflow template).

    Example:
        from imagerecords.pipeline import run
        manifest = run(["--input", "photos/", "--output", "/tmp/ds", "--splits", "train=0.9,validation=0.1"])
        print(manifest["splits"]["train"]["num_examples"])

    Any flag the build does not know is passed to Beam's PipelineOptions, so the same call runs on
    Flink (--runner=FlinkRunner --flink_master=...) or Dataflow (--runner=DataflowRunner ...).
    Locally it defaults to DirectRunner in multi-processing mode on every core.
    """
    config, beam_args, no_progress = parse_args(sys.argv[1:] if argv is None else argv)
    options = PipelineOptions(beam_args)
    local = _is_local(options)
    if local:
        direct = options.view_as(DirectOptions)
        if not any(a.startswith("--direct_running_mode") for a in beam_args):
            direct.direct_running_mode = "multi_processing"
        if not any(a.startswith("--direct_num_workers") for a in beam_args):
            direct.direct_num_workers = os.cpu_count() or 1
    check_paths(config)
    progress_dir = tempfile.mkdtemp(prefix="imagerecords-progress-") if local and not no_progress else None
    stop = threading.Event()
    reporter = None
    if progress_dir:
        reporter = threading.Thread(target=_progress_reporter, args=(progress_dir, stop), daemon=True)
        reporter.start()
    start = time.monotonic()
    try:
        with beam.Pipeline(options=options) as p:
            build_pipeline(p, config, progress_dir)
    finally:
        stop.set()
        if reporter:
            reporter.join()
            sys.stderr.write("\n")
        if progress_dir:
            shutil.rmtree(progress_dir, ignore_errors=True)
    seconds = time.monotonic() - start
    template = options.view_as(GoogleCloudOptions).template_location
    if template:
        # A classic Dataflow template was staged, nothing ran: there is no manifest yet.
        print(f"imagerecords: wrote the Dataflow template {template} ({seconds:.1f} s); nothing was built")
        return {}
    manifest = json.loads(read_bytes(FileSystems.join(config.output, metadata.MANIFEST)))
    print_summary(manifest, config.output, seconds)
    return manifest


def print_summary(manifest: Dict[str, object], output: str, seconds: float, stream=sys.stdout) -> None:
    total = sum(s["num_examples"] for s in manifest["splits"].values())
    stream.write(f"imagerecords: wrote {output}\n")
    for split, entry in sorted(manifest["splits"].items()):
        stream.write(f"  {split:<12} {entry['num_examples']:>9} records  {len(entry['shards']):>5} shards  "
                     f"{entry['num_bytes'] / 1e6:>10.1f} MB\n")
    stream.write(f"  rejected     {manifest['num_rejected']:>9} (see {metadata.ERRORS})\n")
    stream.write(f"  {seconds:.1f} s, {total / max(seconds, 1e-9):.1f} images/s\n")
