"""The launcher: check flags and paths, take the output's lock, run the graph, decide, commit, report."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Dict, Iterator, Optional, Sequence, TextIO

from imagerecords import __version__, errors, publish, storage
from imagerecords import refs as refs_lib
from imagerecords.config import BuildConfig
from imagerecords.manifest import DUPLICATES, ERRORS, LOCK, STAGING, Manifest

if TYPE_CHECKING:
    from imagerecords.pipeline.checks import InputInfo
    from imagerecords.pipeline.flags import Parsed

LOG_DIR = os.path.join(tempfile.gettempdir(), "imagerecords-logs")


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


def _local_options(options, beam_args: Sequence[str]) -> bool:
    """Picks DirectRunner's mode for local runs; returns whether the run is local."""
    from apache_beam.options.pipeline_options import DirectOptions, StandardOptions

    runner = options.view_as(StandardOptions).runner
    if runner is not None and "direct" not in str(runner).lower():
        return False
    direct = options.view_as(DirectOptions)
    if not any(a.startswith("--direct_num_workers") for a in beam_args):
        direct.direct_num_workers = os.cpu_count() or 1
    if not any(a.startswith("--direct_running_mode") for a in beam_args):
        # Worker processes. Worker threads start faster (6.6 vs 12.2 s for 16 images) but
        # multi_threading corrupts large bundles: a 100,000-row manifest build failed with
        # "Error decoding input stream with coder ..." / "unexpected value for null indicator"
        # (Beam 2.62; the symptom of Beam issue 22321), where multi_processing built it in 29 s.
        # Quick local builds run on the local engine anyway. One worker runs in memory.
        direct.direct_running_mode = "in_memory" if direct.direct_num_workers == 1 else "multi_processing"
    return True


def uses_local_engine(config: BuildConfig, beam_args: Sequence[str], detached: bool = False) -> bool:
    """Whether a build runs on the local engine (pipeline/local.py) rather than Beam.

    It does when there is nothing for Beam to do: local input and output, no Beam option at all
    (`--runner DirectRunner`, `--direct_num_workers`, a preset's beam_options all choose Beam) and
    the default shard writer (`--writer beam` is Beam's own sink). Both engines write the same bytes.
    """
    return (not beam_args and not detached and config.writer == "shards"
            and storage.is_local(config.input) and storage.is_local(config.output))


def _claim_output(config: BuildConfig) -> None:
    """Refuses an output folder that holds files unless --overwrite; with it, clears a killed
    build's staging area (the lock is ours, so no live build owns it)."""
    names = [n for n in storage.list_names(config.output) if n != LOCK]
    staged = bool(storage.list_tree(publish.staging_dir(config.output)))
    if config.overwrite:
        if staged:
            publish.remove_staging(config.output)
        return
    if staged:
        if publish.holds_only_reasons(config.output):
            raise errors.OutputError(f"{config.output} holds only the reject reasons of a build that failed its "
                                     f"budget ({STAGING}/{ERRORS}; nothing was published); rerun with --overwrite "
                                     "to replace them")
        if not publish.results_staged(config.output):
            raise errors.OutputError(f"{config.output} holds the staging area of a build that failed or was stopped "
                                     f"before its shards were all written ({STAGING}); rerun with --overwrite to "
                                     "replace it")
        raise errors.OutputError(f"{config.output} holds an unfinished build in {STAGING}; rerun with --overwrite "
                                 f"to replace it, or `imagerecords finish {config.output}` to publish it")
    if names:
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        raise errors.OutputError(f"output folder {config.output} is not empty ({len(names)} files: {shown}); pass "
                                 "--overwrite to replace a dataset this tool wrote there (other files are left alone)")


def _read_label_map(config: BuildConfig) -> Optional[refs_lib.LabelMap]:
    if not config.label_map:
        return None
    try:
        text = publish.read_bytes(config.label_map).decode("utf-8")
    except OSError as e:
        raise errors.UsageError(f"--label_map {config.label_map}: {publish.os_reason(e)}") from None
    try:
        return refs_lib.read_label_map(text, config.label_map, config.label_offset)
    except ValueError as e:
        raise errors.UsageError(str(e)) from None


class _Progress:
    """The progress line of a local build: images done of all listed, rate, ETA, rejects so far.

    Shard writers report {done, rejected, total} per shard and the shuffle reports each split's
    image count (files in `progress_dir`); this sums them once a second. A line is printed when the
    build starts and when it ends, whatever its length.
    """

    def __init__(self, progress_dir: str, stream: TextIO, rewrite: bool):
        self._dir = progress_dir
        self._stream = stream
        self._rewrite = rewrite  # a terminal: redraw one line; otherwise one line every 10 s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start = time.monotonic()
        self._last_print = 0.0

    def state(self) -> Dict[str, int]:
        out = {"done": 0, "rejected": 0, "total": 0, "planned": 0}
        for name in os.listdir(self._dir):
            try:
                with open(os.path.join(self._dir, name)) as f:
                    data = json.load(f)
            except (OSError, ValueError):
                continue
            if name.endswith(".plan"):
                out["total"] += data["count"]
                out["planned"] += 1
            elif name.endswith(".json"):
                out["done"] += data["done"]
                out["rejected"] += data.get("rejected", 0)
        return out

    def line(self, final: bool = False) -> str:
        s = self.state()
        elapsed = time.monotonic() - self._start
        if not s["planned"]:
            return f"[imagerecords] listing and planning shards ... {elapsed:.0f} s"
        rate = s["done"] / max(elapsed, 1e-9)
        left = s["total"] - s["done"]
        eta = "" if final or not s["done"] else f", ETA {_duration(left / max(rate, 1e-9))}"
        pct = 100.0 * s["done"] / max(s["total"], 1)
        return (f"[imagerecords] {s['done']}/{s['total']} images ({pct:.0f}%), {rate:.0f} images/s{eta}, "
                f"{s['rejected']} rejected so far, {_duration(elapsed)} elapsed")

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            if self._rewrite or time.monotonic() - self._last_print >= 10:
                self._show(self.line())

    def _show(self, line: str, end: str = "") -> None:
        self._last_print = time.monotonic()
        if self._rewrite:
            self._stream.write("\r" + line + "\033[K" + end)
        else:
            self._stream.write(line + "\n")
        self._stream.flush()

    def __enter__(self) -> "_Progress":
        self._show(self.line())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._show(self.line(final=True), end="\n")


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
    import logging

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


def _failure(e: BaseException, config: BuildConfig, log_path: Optional[str]) -> errors.BuildError:
    """Turns an exception from the runner into one line."""
    if publish.is_no_space(e):
        return errors.OutputError(f"no space left on device while writing {config.output}; the published dataset "
                                  "(if any) is untouched; free space and rerun with --overwrite")
    from concurrent.futures.process import BrokenProcessPool  # here: it imports multiprocessing

    where = f"; full log: {log_path}" if log_path else ""
    if isinstance(e, BrokenProcessPool):  # the local engine lost a worker (SIGKILL, OOM killer)
        return errors.PipelineFailed("a worker process of the local engine ended abruptly (killed by a signal, or "
                                     "by the system when memory ran out); nothing was published; rerun, or build "
                                     f"in this process with --local_workers 0{where}")
    text = str(e).strip().splitlines()
    # The runner wraps the worker's exception; its last line names it ("ValueError: ...").
    detail = next((line.strip() for line in reversed(text) if line.strip()), type(e).__name__)
    return errors.PipelineFailed(f"the pipeline failed ({type(e).__name__}): {detail[:300]}; nothing was "
                                 f"published{where}")


def _flink_rest(options) -> str:
    from apache_beam.options.pipeline_options import FlinkRunnerOptions

    master = options.view_as(FlinkRunnerOptions).flink_master.strip().rstrip("/")
    return master if "://" in master else "http://" + master


def _check_detached(options) -> None:
    """--detached: a Flink cluster whose SDK workers run on the cluster, so nothing needs this process."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, PortableOptions, StandardOptions

    runner = str(options.view_as(StandardOptions).runner or "")
    master = options.view_as(FlinkRunnerOptions).flink_master or ""
    if "flink" not in runner.lower() or master in ("", "[local]", "[auto]"):
        raise errors.UsageError("--detached needs --runner=FlinkRunner and --flink_master=HOST:PORT of a Flink cluster")
    environment = (options.view_as(PortableOptions).environment_type or "").upper()
    if environment in ("", "LOOPBACK"):
        raise errors.UsageError("--detached needs SDK workers on the cluster (--environment_type=EXTERNAL, PROCESS or "
                                "DOCKER); with LOOPBACK they run inside this process")


def _wait_until_on_flink(options, result, timeout: float = 600.0) -> str:
    """Returns the Flink job id of a just-submitted build once the cluster lists the job. Beam's job
    server (a child of this process, stopped when it exits) submits asynchronously; the job runs on
    without it. Matched by the job name (--job_name, set here when not given)."""
    import json
    import urllib.error
    import urllib.request

    from apache_beam.options.pipeline_options import GoogleCloudOptions

    name = options.view_as(GoogleCloudOptions).job_name
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result.state in ("FAILED", "CANCELLED", "DONE"):
            result.wait_until_finish()  # raises the job's error, reported by the caller in one line
        try:
            with urllib.request.urlopen(_flink_rest(options) + "/jobs/overview", timeout=10) as response:
                jobs = json.load(response)["jobs"]
        except (urllib.error.URLError, OSError, ValueError):
            jobs = []
        for job in jobs:
            if job.get("name") == name:
                return job["jid"]
        time.sleep(1.0)
    raise errors.PipelineFailed(f"--detached: Flink at {_flink_rest(options)} did not list job {name} within "
                                f"{timeout:.0f} s of the submit")


def run(argv: Optional[Sequence[str]] = None) -> Optional[Manifest]:
    """Builds a dataset from command-line style arguments and publishes it.

    Example:
        from imagerecords.pipeline import run
        manifest = run(["--input", "photos/", "--output", "/tmp/ds", "--splits", "train=0.9,validation=0.1"])
        print(manifest.split("train").num_examples)

    Any flag the build does not know must be one of Beam's pipeline options, so the same call runs
    on Flink (--runner=FlinkRunner --flink_master=...) or Dataflow (--runner=DataflowRunner ...).
    A local build without Beam options runs on the local engine (pipeline/local.py, no Beam);
    --runner=DirectRunner runs the same build on Beam's DirectRunner, one worker thread per core.
    Both write the same bytes.

    Returns:
      The published manifest, or None when --template_location only staged a Dataflow template.

    Raises:
      errors.BuildError: an expected failure, one line (see README, "When things go wrong").
    """
    from imagerecords.pipeline import checks, flags

    parsed = flags.parse_args(sys.argv[1:] if argv is None else argv)
    config = parsed.config
    if config.writer == "beam" and config.write_index:
        raise errors.UsageError("--write_index needs --writer shards (the Beam sink reports no record offsets)")
    input_info = checks.check_input(config, ignore_split_column=parsed.launcher.ignore_split_column)
    created = checks.check_output(config)
    try:
        return _build(parsed, input_info)
    except errors.BuildError:
        checks.remove_created_output(created)  # only a folder that nothing was written into
        raise


def _build(parsed: "Parsed", input_info: "InputInfo") -> Optional[Manifest]:
    """run() from a checked input and output on: engine, lock, graph, verdict, commit, summary."""
    config = parsed.config
    label_map = _read_label_map(config)

    local_engine = uses_local_engine(config, parsed.beam_args, parsed.launcher.detached)
    if parsed.launcher.local_workers is not None and not local_engine:
        raise errors.UsageError("--local_workers is for the local engine (local paths, no Beam options); on Beam "
                                "use the runner's options (--direct_num_workers, ...)")
    options = template = flink_job = None
    engine = ""
    if local_engine:
        local = True
    else:
        from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions

        options = PipelineOptions(parsed.beam_args)
        local = _local_options(options, parsed.beam_args)
        if parsed.launcher.detached:
            _check_detached(options)
        template = options.view_as(GoogleCloudOptions).template_location
    build_id = publish.new_build_id()
    if parsed.launcher.detached and not options.view_as(GoogleCloudOptions).job_name:
        options.view_as(GoogleCloudOptions).job_name = f"imagerecords-{build_id.lower()}"
    log_path = None if parsed.launcher.verbose else os.path.join(LOG_DIR, f"{build_id}.log")
    start = time.monotonic()
    with publish.OutputLock(config.output, build_id, break_lock=parsed.launcher.break_lock) as lock:
        if lock.took_over:
            print(f"imagerecords build: note: {lock.take_over_note()}", file=sys.stderr)
        _claim_output(config)
        # Progress is for people: shown when stderr is a terminal, in logs and pipes only if asked.
        on_terminal = sys.stderr.isatty()
        show_progress = local and not parsed.launcher.no_progress and (on_terminal or parsed.launcher.progress)
        progress_dir = tempfile.mkdtemp(prefix="imagerecords-progress-") if show_progress else None
        graph_args = dict(build_id=build_id, versions=versions(), label_map=label_map, csv_header=input_info.header,
                          progress_dir=progress_dir)
        try:
            with _quiet_stderr(log_path) as terminal:
                progress = _Progress(progress_dir, terminal, on_terminal) if progress_dir else contextlib.nullcontext()
                try:
                    with progress:
                        if local_engine:
                            from imagerecords.pipeline import local as local_lib

                            _, workers = local_lib.build(config, workers=parsed.launcher.local_workers,
                                                         **graph_args)
                            engine = (f"local engine, {workers} worker processes" if workers else
                                      "local engine, in-process")
                        else:
                            import apache_beam as beam

                            from imagerecords.pipeline.graph import build_pipeline

                            p = beam.Pipeline(options=options)
                            build_pipeline(p, config, **graph_args)
                            result = p.run()
                            if parsed.launcher.detached:
                                flink_job = _wait_until_on_flink(options, result)
                            else:
                                result.wait_until_finish()
                except KeyboardInterrupt:
                    raise
                except Exception as e:  # the runner's wrapper of a worker error: reported in one line
                    raise _failure(e, config, log_path) from None
        finally:
            if progress_dir:
                shutil.rmtree(progress_dir, ignore_errors=True)
        if parsed.launcher.detached:
            lock.hand_over_to_detached_job()
            print(f"imagerecords: submitted build {build_id} as Flink job {flink_job}; follow it in the Flink UI or "
                  f"REST API ({_flink_rest(options)}/jobs/{flink_job}); when it is FINISHED, publish the dataset with "
                  f"`imagerecords finish {config.output}`")
            return None
        if template:
            print(f"imagerecords: wrote the Dataflow template {template}; nothing was built yet. When its job has "
                  f"run, publish the dataset with `imagerecords finish {config.output}`")
            return None
        results = publish.read_results(config.output)
        if results is None:
            raise errors.PipelineFailed(f"the pipeline ended without writing its results to {STAGING}; nothing was "
                                        "published")
        try:
            results.verdict(config.output)
        except errors.BudgetExceeded:
            publish.discard_staged_shards(config.output, results)  # errors.jsonl stays, for the reasons
            raise
        publish.test_pause("before_commit")
        try:
            manifest = publish.commit(config.output, results)
        except OSError as e:
            if publish.is_no_space(e):
                raise _failure(e, config, None) from None
            raise
    if log_path and os.path.exists(log_path):
        os.remove(log_path)
    print_summary(manifest, config.output, time.monotonic() - start, engine=engine or _runner(options))
    return manifest


def finish(output: str, break_lock: bool = False) -> Manifest:
    """Publishes the build staged in `output` (a build whose launcher was not there at the end, or
    a commit cut short). Same lock and commit as a build.

    Raises:
      errors.BuildError: nothing to finish, over budget, or the lock is held.
    """
    if storage.exists(storage.join(output, "manifest.json")) and not storage.list_tree(publish.staging_dir(output)):
        raise errors.UnfinishedBuild(f"nothing to finish: {output} is published and has no staging area")
    with publish.OutputLock(output, publish.new_build_id(), command="finish", break_lock=break_lock) as lock:
        if lock.took_over:
            print(f"imagerecords finish: note: {lock.take_over_note()}", file=sys.stderr)
        return publish.commit(output)


def _runner(options) -> str:
    from apache_beam.options.pipeline_options import StandardOptions

    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    return runner if isinstance(runner, str) else type(runner).__name__


def print_summary(manifest: Manifest, output: str, seconds: float, stream=sys.stdout, engine: str = "",
                  built: bool = True) -> None:
    """Prints what was published; `built` False for `finish`, which only commits (no image rate)."""
    stream.write(f"imagerecords: wrote {output}\n")
    for split in manifest.splits:
        stream.write(f"  {split.name:<12} {split.num_examples:>9} records  {len(split.shards):>5} shards  "
                     f"{split.num_bytes / 1e6:>10.1f} MB\n")
    stream.write(f"  rejected     {manifest.num_rejected:>9} (see {ERRORS})\n")
    if manifest.num_skipped:
        stream.write(f"  skipped      {manifest.num_skipped:>9} (not images of a class; see {ERRORS})\n")
    if manifest.num_duplicate_groups > 0:
        leaks = f", {manifest.num_leaking_groups} across splits" if manifest.num_leaking_groups else ""
        stream.write(f"  duplicates   {manifest.num_duplicate_groups:>9} groups of identical files{leaks} "
                     f"(see {DUPLICATES})\n")
    if not built:
        stream.write(f"  {seconds:.1f} s to publish the staged build\n")
        return
    on = f" ({engine})" if engine else ""
    stream.write(f"  {seconds:.1f} s, {manifest.num_examples / max(seconds, 1e-9):.1f} images/s{on}\n")
