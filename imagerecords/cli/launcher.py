"""The launcher: parse, check, lock, run the engine, decide the budget, commit, summarise."""

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

from imagerecords import __version__
from imagerecords.build import _hooks, engines, errors, publish, storage
from imagerecords.build import refs as refs_lib
from imagerecords.build.config import BuildConfig
from imagerecords.format.manifest import DUPLICATES, ERRORS, LOCK, MANIFEST, STAGING, Manifest

if TYPE_CHECKING:
    from imagerecords.cli.preflight import InputInfo
    from imagerecords.cli.flags import Parsed

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


def _claim_output(config: BuildConfig) -> int:
    """Refuses an output folder that holds files unless --overwrite; with it, clears the staging
    areas of killed builds (the lock is ours, so no live build owns them), except that --resume
    keeps them to take their complete shards from. Returns the staged shards a resume can reuse."""
    names = [n for n in storage.list_names(config.output) if n != LOCK]
    staged = publish.staged_builds(config.output)
    published = storage.exists(storage.join(config.output, MANIFEST))
    if config.resume:
        if published and not config.overwrite:
            raise errors.OutputError(f"{config.output} holds a published dataset; pass --overwrite with --resume to "
                                     "replace it")
        return sum(1 for b in staged for p in storage.list_tree(publish.staging_dir(config.output, b))
                   if p.endswith(publish.STAGED_RECORD))
    if config.overwrite:
        if staged:
            publish.remove_staging(config.output)
        return 0
    if staged:
        if publish.holds_only_reasons(config.output):
            raise errors.OutputError(f"{config.output} holds only the reject reasons of a build that failed its "
                                     f"budget ({STAGING}/{ERRORS}; nothing was published); rerun with --overwrite "
                                     "to replace them")
        if not publish.results_staged(config.output):
            raise errors.OutputError(f"{config.output} holds the staging area of a build that failed or was stopped "
                                     f"before its shards were all written ({STAGING}); rerun with --resume to reuse "
                                     "its complete shards, or --overwrite to start over")
        raise errors.OutputError(f"{config.output} holds an unfinished build in {STAGING}; rerun with --overwrite "
                                 f"to replace it, or `imagerecords finish {config.output}` to publish it")
    if names or published:
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        raise errors.OutputError(f"output folder {config.output} is not empty ({len(names)} files: {shown}); pass "
                                 "--overwrite to replace a dataset this tool wrote there (other files are left alone)")
    return 0


def _read_label_map(config: BuildConfig) -> Optional[refs_lib.LabelMap]:
    if not config.label_map:
        return None
    try:
        text = storage.read_bytes(config.label_map).decode("utf-8")
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
                data = json.loads(storage.read_bytes(os.path.join(self._dir, name)))
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


def run(argv: Optional[Sequence[str]] = None) -> Optional[Manifest]:
    """Builds a dataset from command-line style arguments and publishes it.

    Example:
        from imagerecords import run
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
      errors.BuildError: an expected failure, one line (see README, "When things go wrong");
        errors.Interrupted for SIGINT, SIGTERM and SIGHUP.
    """
    from imagerecords.cli import flags, preflight

    parsed = flags.parse_args(sys.argv[1:] if argv is None else argv)
    config = parsed.config
    if config.writer == "beam" and config.write_index:
        raise errors.UsageError("--write_index needs --writer shards (the Beam sink reports no record offsets)")
    if config.writer == "beam" and config.resume:
        raise errors.UsageError("--resume needs --writer shards (the Beam sink's shards have no fingerprints)")
    input_info = preflight.check_input(config, ignore_split_column=parsed.launcher.ignore_split_column)
    created = preflight.check_output(config)
    try:
        return _build(parsed, input_info)
    except errors.BuildError:
        preflight.remove_created_output(created)  # only a folder that nothing was written into
        raise


def _build(parsed: "Parsed", input_info: "InputInfo") -> Optional[Manifest]:
    """run() from a checked input and output on: engine, lock, stages, verdict, commit, summary."""
    config = parsed.config
    label_map = _read_label_map(config)
    engine = engines.choose(config, parsed.beam_args, detached=parsed.launcher.detached,
                            local_workers=parsed.launcher.local_workers)
    build_id = publish.new_build_id()
    engine.name_job(build_id)
    log_path = None if parsed.launcher.verbose else os.path.join(LOG_DIR, f"{build_id}.log")
    start = time.monotonic()
    stage = _Stage()
    with _signals_as_interrupts(), publish.OutputLock(config.output, build_id,
                                                      break_lock=parsed.launcher.break_lock) as lock:
        try:
            if lock.took_over:
                print(f"imagerecords build: note: {lock.take_over_note()}", file=sys.stderr)
            reusable = _claim_output(config)
            if config.resume:
                print(f"imagerecords build: resuming: {reusable} staged shards of earlier builds can be reused if "
                      "their fingerprints match", file=sys.stderr)
            stage.now = "engine"
            _run_engine(engine, parsed, build_id=build_id, label_map=label_map, csv_header=input_info.header,
                        log_path=log_path)
            handed_off = engine.handoff(lock)
            if handed_off:
                print(handed_off)
                return None
            stage.now = "verdict"
            results = _verdict(config, build_id)
            if config.resume:
                print(f"imagerecords build: resumed: {_reused_count(config.output, build_id, results)} of "
                      f"{len(results.shards)} shards reused", file=sys.stderr)
            _hooks.pause("before_commit")
            stage.now = "commit"
            manifest = _commit(config, results)
            stage.now = "done"
        except KeyboardInterrupt as e:
            raise _interrupted(e, stage.now, config, build_id) from None
    if log_path and os.path.exists(log_path):
        os.remove(log_path)
    from imagerecords.cli import preflight

    print_summary(manifest, config.output, time.monotonic() - start, engine=engine.description,
                  ignored=preflight.ignored_columns(config, input_info))
    return manifest


def _run_engine(engine: engines.Engine, parsed, *, build_id: str, label_map, csv_header,
                log_path: Optional[str]) -> None:
    """Runs the engine with Beam's and the workers' logs in `log_path` and, for the local engine, the
    progress line on the terminal; a runner's error becomes one line, a signal stays a signal."""
    launcher = parsed.launcher
    # Progress is for people: shown when stderr is a terminal, in logs and pipes only if asked.
    on_terminal = sys.stderr.isatty()
    show_progress = engine.reports_progress and not launcher.no_progress and (on_terminal or launcher.progress)
    progress_dir = tempfile.mkdtemp(prefix="imagerecords-progress-") if show_progress else None
    try:
        with _quiet_stderr(log_path) as terminal:
            progress = _Progress(progress_dir, terminal, on_terminal) if progress_dir else contextlib.nullcontext()
            try:
                with progress:
                    engine.run(build_id=build_id, versions=versions(), label_map=label_map, csv_header=csv_header,
                               progress_dir=progress_dir)
            except KeyboardInterrupt:
                engine.stop()
                raise
            except Exception as e:  # the runner's wrapper of a worker error: reported in one line
                if _SIGNALLED:
                    engine.stop()
                    raise errors.Stopped(_SIGNALLED[0]) from None
                raise _failure(e, parsed.config, log_path) from None
    finally:
        if progress_dir:
            shutil.rmtree(progress_dir, ignore_errors=True)


class _Stage:
    """Where the build is, for the message a signal gets: engine, verdict, commit or done."""

    now = "lock"


def _verdict(config: BuildConfig, build_id: str) -> publish.BuildResults:
    results = publish.read_results(config.output, build_id)
    if results is None:
        raise errors.PipelineFailed(f"the pipeline ended without writing its results to {STAGING}; nothing was "
                                    "published")
    try:
        results.verdict(config.output)
    except errors.BudgetExceeded:
        publish.discard_staged_shards(config.output, results)  # errors.jsonl stays, for the reasons
        raise
    return results


def _commit(config: BuildConfig, results: publish.BuildResults) -> Manifest:
    try:
        return publish.commit(config.output, results, keep_versions=config.keep_versions)
    except OSError as e:
        if publish.is_no_space(e):
            raise _failure(e, config, None) from None
        raise


def _reused_count(output: str, build_id: str, results: publish.BuildResults) -> int:
    """Shards of this build that an earlier build wrote (their staged record says so)."""
    staging = publish.staging_dir(output, build_id)
    count = 0
    for r in results.shards:
        try:
            record = json.loads(storage.read_bytes(storage.join(staging, r.filename + publish.STAGED_RECORD)))
        except (OSError, ValueError):
            continue
        count += record.get("reused", False)
    return count


def _interrupted(e: KeyboardInterrupt, stage: str, config: BuildConfig, build_id: str) -> errors.Interrupted:
    """The one line for a build stopped by a signal, saying what is left and the command that mends it."""
    import signal

    signum = getattr(e, "signum", signal.SIGINT)
    what = f"stopped by {signal.Signals(signum).name}"
    out = config.output
    if stage == "commit":
        return errors.Interrupted(f"{what} during the commit: {out} still publishes its previous dataset (if any) "
                                  f"unchanged; run `imagerecords finish {out}` to publish this build", signum)
    if stage == "done":
        return errors.Interrupted(f"{what} after the commit: {out} is published", signum)
    staged = 0
    if publish.staged_builds(out):
        staged = sum(1 for p in storage.list_tree(publish.staging_dir(out, build_id)) if p.endswith(publish.STAGED_RECORD))
    resume = (f"; {staged} complete shards are staged: rerun the same command with --resume to reuse them"
              if staged else "; rerun the same command")
    return errors.Interrupted(f"{what}; nothing was published and {out} is as it was{resume}", signum)


# The signal that stopped this build, if one did: a runner that ran the shard writer in this thread
# (DirectRunner in memory) hands the Stopped it raised back wrapped in its own error.
_SIGNALLED: list = []


@contextlib.contextmanager
def _signals_as_interrupts() -> Iterator[None]:
    """SIGTERM and SIGHUP (a scheduler, `timeout`, a closed terminal) stop the build as Ctrl-C does:
    shard writers are cancelled, worker processes ended, the lock released. The first one raises
    errors.Stopped; later ones are ignored, so the cleanup it starts runs to the end."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = _SIGNALLED
    fired.clear()

    def stop(signum, _frame):
        if fired:
            return
        fired.append(signum)
        raise errors.Stopped(signum)

    saved = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def finish(output: str, break_lock: bool = False) -> Manifest:
    """Publishes the build staged in `output` (a build whose launcher was not there at the end, or
    a commit cut short). Same lock and commit as a build.

    Raises:
      errors.BuildError: nothing to finish, over budget, or the lock is held.
    """
    if storage.exists(storage.join(output, MANIFEST)) and not publish.staged_builds(output):
        raise errors.UnfinishedBuild(f"nothing to finish: {output} is published and has no staging area")
    with publish.OutputLock(output, publish.new_build_id(), command="finish", break_lock=break_lock) as lock:
        if lock.took_over:
            print(f"imagerecords finish: note: {lock.take_over_note()}", file=sys.stderr)
        return publish.commit(output)


def print_summary(manifest: Manifest, output: str, seconds: float, stream=None, engine: str = "",
                  built: bool = True, ignored: Sequence[str] = ()) -> None:
    """Prints what was published; `built` False for `finish`, which only commits (no image rate);
    `ignored`: the manifest columns nothing read, named so that none is dropped unseen."""
    stream = stream or sys.stdout  # looked up per call: a caller's redirect_stdout applies
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
    if manifest.num_label_conflicts > 0:
        stream.write(f"  label conflicts {manifest.num_label_conflicts:>6} groups of identical files with different "
                     f"labels (see {DUPLICATES})\n")
    if ignored:
        stream.write(f"  ignored columns: {', '.join(ignored)} (no setting or feature reads them; declare one "
                     "with --feature NAME=DTYPE)\n")
    if not built:
        stream.write(f"  {seconds:.1f} s to publish the staged build\n")
        return
    on = f" ({engine})" if engine else ""
    stream.write(f"  {seconds:.1f} s, {manifest.num_examples / max(seconds, 1e-9):.1f} images/s{on}\n")
