"""The build command: argv to BuildOptions, the build session, the progress line, the summary."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import tempfile
import time
from typing import Iterator, Optional, Sequence, TextIO, Tuple

from imagerecords.format.manifest import DUPLICATES, ERRORS, Manifest
from imagerecords.builder import session
from imagerecords.builder.options import Progress
from imagerecords.cli import flags
from imagerecords.pipeline import errors, sources
from imagerecords.pipeline.naming import flag_names
from imagerecords.pipeline.plan.shard_plan import UNSIZED_IMAGE_BYTES
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import hosts

LOG_DIR = os.path.join(tempfile.gettempdir(), "imagerecords-logs")


class _ProgressLine:
    """The progress line of a local build: items done of all listed, rate, ETA, rejects so far,
    drawn from the Progress reports of the build session. The first report and the final one are
    always printed, whatever the build's length."""

    def __init__(self, rewrite: bool, unit: str = "images"):
        self.stream: TextIO = sys.stderr  # the terminal, once the engine's logs go to a file
        self._rewrite = rewrite  # a terminal: redraw one line; otherwise one line every 10 s
        self._unit = unit
        self._last_print: Optional[float] = None

    def line(self, p: Progress) -> str:
        if not p.planned:
            return f"[imagerecords] listing and planning shards ... {p.seconds:.0f} s"
        rate = p.done / max(p.seconds, 1e-9)
        left = p.total - p.done
        eta = "" if p.final or not p.done else f", ETA {_duration(left / max(rate, 1e-9))}"
        pct = 100.0 * p.done / max(p.total, 1)
        return (f"[imagerecords] {p.done}/{p.total} {self._unit} ({pct:.0f}%), {rate:.0f} {self._unit}/s{eta}, "
                f"{p.rejected} rejected so far, {_duration(p.seconds)} elapsed")

    def __call__(self, p: Progress) -> None:
        if p.final:
            self._show(self.line(p), end="\n")
        elif self._last_print is None or self._rewrite or time.monotonic() - self._last_print >= 10:
            self._show(self.line(p))

    def _show(self, line: str, end: str = "") -> None:
        self._last_print = time.monotonic()
        if self._rewrite:
            self.stream.write("\r" + line + "\033[K" + end)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


@contextlib.contextmanager
def _quiet_stderr(log_path: Optional[str]) -> Iterator[TextIO]:
    """Sends everything written to file descriptor 2 (Beam's logs, worker processes' tracebacks,
    TensorFlow's C++ notices) to `log_path` while the pipeline runs; yields a stream that still
    reaches the terminal, for progress. With log_path None nothing is redirected."""
    if log_path is None:
        yield sys.stderr
        return

    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    log_file = open(log_path, "ab", buffering=0)
    terminal = os.fdopen(os.dup(saved), "w", buffering=1)
    root = logging.getLogger()
    handler = logging.StreamHandler(open(log_path, "a", buffering=1))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handlers = root.handlers[:]
    level = root.level
    root.handlers = [handler]
    root.setLevel(logging.INFO)
    os.dup2(log_file.fileno(), 2)
    try:
        yield terminal
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        root.handlers = handlers
        root.setLevel(level)
        handler.stream.close()
        log_file.close()
        terminal.close()


def run(argv: Optional[Sequence[str]] = None) -> Optional[Manifest]:
    """Builds a dataset from command-line style arguments and publishes it: the command's path to
    the library (imagerecords.build takes keyword arguments instead).

    Example:
        from imagerecords import run
        manifest = run(["--input", "photos/", "--output", "/tmp/ds", "--splits", "train=0.9,validation=0.1"])
        print(manifest.split("train").num_examples)

    Any flag the build does not know must be one of Beam's pipeline options, so the same call runs
    on Flink (--runner=FlinkRunner --flink_master=...) or Dataflow (--runner=DataflowRunner ...).
    A local build without Beam options runs on the local engine (pipeline/engines/local.py, no
    Beam); --runner=DirectRunner runs the same build on Beam's DirectRunner, one worker per core.
    Both write the same bytes.

    Returns:
      The published manifest, or None when --template_location only staged a Dataflow template.

    Raises:
      errors.BuildError: an expected failure, one line (see README, "When things go wrong");
        errors.Interrupted for SIGINT, SIGTERM and SIGHUP.
    """
    with flag_names():  # command-line arguments: messages name settings as flags
        return _run(sys.argv[1:] if argv is None else argv)


def _run(argv: Sequence[str]) -> Optional[Manifest]:
    parsed = flags.parse_args(argv)
    launcher = parsed.launcher
    options = parsed.options
    unit = sources.of(options.config.input).unit
    # Progress is for people: shown when stderr is a terminal, in logs and pipes only if asked.
    on_terminal = sys.stderr.isatty()
    printer = None
    if not launcher.no_progress and (on_terminal or launcher.progress):
        printer = _ProgressLine(on_terminal, unit)
        options = dataclasses.replace(options, progress=printer)

    @contextlib.contextmanager
    def quiet(log_path: Optional[str]) -> Iterator[None]:
        with _quiet_stderr(log_path) as terminal:
            if printer is not None:
                printer.stream = terminal
            yield

    outcome = session.run(options, notify=lambda text: print(f"imagerecords build: {text}", file=sys.stderr),
                          log_dir=None if launcher.verbose else LOG_DIR, engine_context=quiet)
    if outcome.handed_off:
        print(outcome.handed_off)
        return None
    print_summary(outcome.manifest, options.config.output, outcome.seconds, engine=outcome.engine,
                  ignored=outcome.ignored_columns, unit=unit, by_count=outcome.planned_by_count,
                  failed_hosts=outcome.failed_hosts, near=outcome.near_groups)
    return outcome.manifest


def finish(output: str, break_lock: bool = False) -> Tuple[Manifest, Optional[publish.BuildResults]]:
    """`imagerecords finish`: session.finish, with its notes on stderr; returns the published manifest
    and the staged results it published, if readable (their failed hosts and near-duplicate counts
    are the summary's)."""
    try:
        staged = publish.read_results(output)
    except errors.BuildError:
        staged = None  # finish says why in its own words
    manifest = session.finish(output, break_lock,
                              notify=lambda text: print(f"imagerecords finish: {text}", file=sys.stderr))
    return manifest, staged


def print_summary(manifest: Manifest, output: str, seconds: float, stream=None, engine: str = "",
                  built: bool = True, ignored: Sequence[str] = (), unit: str = "images",
                  by_count: bool = False, failed_hosts: Sequence = (), near: Tuple[int, int] = (0, 0)) -> None:
    """Prints what was published; `built` False for `finish`, which only commits (no rate);
    `ignored`: the manifest columns nothing read, named so that none is dropped unseen; `unit`:
    what the rate counts ('rows' for an arrays input); `by_count`: the shards were planned by count;
    `failed_hosts`: the hosts with the most failed and opted-out URLs (hosts.HostRow); `near`: the
    near-duplicate groups in duplicates.jsonl, and those of them across splits."""
    stream = stream or sys.stdout  # looked up per call: a caller's redirect_stdout applies
    stream.write(f"imagerecords: wrote {output}\n")
    for split in manifest.splits:
        stream.write(f"  {split.name:<12} {split.num_examples:>9} records  {len(split.shards):>5} shards  "
                     f"{split.num_bytes / 1e6:>10.1f} MB\n")
    stream.write(f"  rejected     {manifest.num_rejected:>9} (see {ERRORS})\n")
    if manifest.num_skipped:
        stream.write(f"  skipped      {manifest.num_skipped:>9} (not images of a class; see {ERRORS})\n")
    if manifest.num_opted_out:
        stream.write(f"  opted out    {manifest.num_opted_out:>9} URLs whose sites said no (robots.txt, X-Robots-Tag, "
                     f"tdm-reservation); not downloaded (see {ERRORS})\n")
    if failed_hosts:
        stream.write(f"  hosts with the most failed or opted-out URLs (top {hosts.TOP}):\n")
        stream.writelines(f"    {line}\n" for line in hosts.lines(failed_hosts))
    if manifest.num_already_present > 0:
        stream.write(f"  unchanged    {manifest.num_already_present:>9} already in the dataset, not written again "
                     f"(see {DUPLICATES})\n")
    if manifest.num_duplicate_groups > 0:
        leaks = f", {manifest.num_leaking_groups} across splits" if manifest.num_leaking_groups else ""
        stream.write(f"  duplicates   {manifest.num_duplicate_groups:>9} groups of identical files{leaks} "
                     f"(see {DUPLICATES})\n")
    if near[0]:
        leaks = f", {near[1]} across splits" if near[1] else ""
        stream.write(f"  near-duplicates {near[0]:>6} groups of resized, recompressed or cropped copies{leaks} "
                     f"(see {DUPLICATES})\n")
    if manifest.num_label_conflicts > 0:
        stream.write(f"  label conflicts {manifest.num_label_conflicts:>6} groups of identical files with different "
                     f"labels (see {DUPLICATES})\n")
    if ignored:
        stream.write(f"  ignored columns: {', '.join(ignored)} (no setting or feature reads them; declare one "
                     "with --feature NAME=DTYPE)\n")
    if by_count:
        stream.write(f"  shards planned by count: no input size was known (URL rows, or --skip_stat), so each "
                     f"image counted as {UNSIZED_IMAGE_BYTES // 1000} KB against --target_shard_mb; a size "
                     "column plans them by bytes\n")
    if not built:
        stream.write(f"  {seconds:.1f} s to publish the staged build\n")
        return
    on = f" ({engine})" if engine else ""
    stream.write(f"  {seconds:.1f} s, {manifest.num_examples / max(seconds, 1e-9):.1f} {unit}/s{on}\n")
