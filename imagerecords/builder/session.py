"""The build's lifecycle: check, claim the output, lock, run the engine, decide the budget, commit."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import traceback
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional, Tuple

from imagerecords.format.manifest import ERRORS, LOCK, MANIFEST, STAGING, Manifest
from imagerecords.pipeline import staging
from imagerecords.builder import checks, engines
from imagerecords.pipeline import errors, naming, storage
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.naming import setting
from imagerecords.builder.options import BuildOptions, Progress
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.publish import commit as publish
from imagerecords.pipeline.publish import lifecycle
from imagerecords.pipeline.publish.build import Build
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline.publish import appending

if TYPE_CHECKING:
    from imagerecords.builder.checks import InputInfo

__all__ = ["Outcome", "build", "finish", "run", "versions"]

versions = publish.versions  # the manifest's `versions` (publish.versions)


def _claim_output(config: BuildConfig) -> int:
    """Refuses an output folder that holds files unless --overwrite; with it, clears the staging
    areas of killed builds (the lock is ours, so no live build owns them), except that --resume
    keeps them to take their complete shards from. Returns the staged shards a resume can reuse."""
    # Another build's write probe is there for a moment (two builds started together): not content.
    names = [n for n in storage.list_names(config.output) if n != LOCK and not n.startswith(checks.PROBE_PREFIX)]
    staged = staging.staged_builds(config.output)
    published = storage.exists(storage.join(config.output, MANIFEST))
    if config.publish.resume:
        if published and not config.publish.overwrite and not config.publish.append:
            raise errors.OutputError(f"{config.output} holds a published dataset; pass {setting('overwrite')} with {setting('resume')} to "
                                     "replace it")
        return sum(1 for b in staged for p in storage.list_tree(staging.staging_dir(config.output, b))
                   if p.endswith(staging.STAGED_RECORD))
    if config.publish.overwrite or (config.publish.append and published and staged and publish.holds_only_reasons(config.output)):
        if staged:  # with --append: only the reasons an earlier delta left, none of them published
            staging.remove_staging(config.output)
        return 0
    if staged:
        if publish.holds_only_reasons(config.output):
            raise errors.OutputError(f"{config.output} holds only the reject reasons of a build that failed its "
                                     f"budget ({STAGING}/{ERRORS}; nothing was published); rerun with {setting('overwrite')} "
                                     "to replace them")
        if not publish.results_staged(config.output):
            raise errors.OutputError(f"{config.output} holds the staging area of a build that failed or was stopped "
                                     f"before its shards were all written ({STAGING}); rerun with {setting('resume')} to reuse "
                                     f"its complete shards, or {setting('overwrite')} to start over")
        # An --append user told to --overwrite would replace the dataset with only the new part.
        replace = "" if config.publish.append else f"rerun with {setting('overwrite')} to replace it, or "
        raise errors.OutputError(f"{config.output} holds an unfinished build in {STAGING}; {replace}"
                                 f"`imagerecords finish {config.output}` to publish it")
    if config.publish.append and published:
        return 0  # the published dataset stays; this build adds a version that lists its shards
    if names or published:
        shown = ", ".join(names[:3]) + (" ..." if len(names) > 3 else "")
        raise errors.OutputError(f"output folder {config.output} is not empty ({len(names)} files: {shown}); pass "
                                 f"{setting('overwrite')} to replace a dataset this tool wrote there (other files are left alone)")
    return 0


def _read_label_map(config: BuildConfig) -> Optional[refs_lib.LabelMap]:
    if not config.labels.label_map:
        return None
    try:
        text = storage.read_bytes(config.labels.label_map).decode("utf-8")
    except OSError as e:
        raise errors.UsageError(f"{setting('label_map', config.labels.label_map)}: {storage.os_reason(e)}") from None
    try:
        return refs_lib.read_label_map(text, config.labels.label_map, config.labels.label_offset)
    except ValueError as e:
        raise errors.UsageError(str(e)) from None


def _keep_traceback(log_path: Optional[str], e: BaseException) -> None:
    """Appends `e`'s traceback (with a worker's remote traceback, its cause) to the log the one-line
    message points at: the runner raised it in this process, so nothing else writes it there."""
    if not log_path:
        return

    try:
        with open(log_path, "a") as f:
            f.write("".join(traceback.format_exception(type(e), e, e.__traceback__)))
    except OSError:
        pass  # the one-line message still names the failure


def _failure(e: BaseException, config: BuildConfig, log_path: Optional[str]) -> errors.BuildError:
    """Turns an exception from the runner into one line."""
    if storage.is_no_space(e):
        return errors.OutputError(f"no space left on device while writing {config.output}; the published dataset "
                                  f"(if any) is untouched; free space and {naming.rerun_with('resume')} (it keeps the "
                                  "shards already written)")

    where = f"; full log: {log_path}" if log_path else ""
    if isinstance(e, BrokenProcessPool):  # the local engine lost a worker (SIGKILL, OOM killer)
        how = _worker_exits(getattr(e, "worker_exits", ()))
        return errors.PipelineFailed(f"a worker process of the local engine ended abruptly ({how}); nothing was "
                                     f"published; rerun, or build in this process with {setting('local_workers', 0)}{where}")
    text = str(e).strip().splitlines()
    # The runner wraps the worker's exception; its last line names it ("ValueError: ...").
    detail = next((line.strip() for line in reversed(text) if line.strip()), type(e).__name__)
    return errors.PipelineFailed(f"the pipeline failed ({type(e).__name__}): {detail[:300]}; nothing was "
                                 f"published{where}")


def _worker_exits(exits) -> str:
    """How the local engine's dead workers ended, from their (pid, exit code) pairs."""
    said = []
    for pid, code in exits:
        if code is not None and code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            said.append(f"worker {pid} killed by {name}" + (", as the kernel's out-of-memory killer does"
                                                            if -code == signal.SIGKILL else ""))
        elif code:
            said.append(f"worker {pid} exited with status {code}")
    return "; ".join(said) or "killed by a signal, or by the system when memory ran out"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a build session ended with, for whoever reports it.

    Attributes:
      manifest: the published manifest; None when the job went on without this process.
      seconds: from the lock to the end of the commit.
      engine: how the build ran ("local engine, 2 worker processes", "DirectRunner").
      ignored_columns: manifest columns that no setting or feature read.
      handed_off: when the job goes on without this process (a detached submit, a Dataflow
        template), the line saying so and how to publish it later; else None.
      planned_by_count: the shards were planned by count, as no input size was known (URL rows,
        --skip_stat without a size column) and no num_shards was given.
      failed_hosts: the hosts with the most URLs that failed or were opted out, by reason (hosts.HostRow).
      near_groups: (near-duplicate groups found, those of them across splits).
    """

    manifest: Optional[Manifest]
    seconds: float
    engine: str
    ignored_columns: Tuple[str, ...] = ()
    handed_off: Optional[str] = None
    planned_by_count: bool = False
    failed_hosts: Tuple = ()
    near_groups: Tuple[int, int] = (0, 0)


def _log_note(text: str) -> None:
    logging.getLogger("imagerecords").warning(text)


def run(options: BuildOptions, *, notify: Optional[Callable[[str], None]] = None,
        log_dir: Optional[str] = None,
        engine_context: Optional[Callable[[Optional[str]], ContextManager]] = None) -> Outcome:
    """Runs one build: pre-flight checks, claim and lock the output, engine, budget verdict, commit.

    Args:
      options: the build (BuildOptions).
      notify: called with each note worth a person's attention (a lock taken over, shards a resume
        reuses); by default they go to the `imagerecords` logger.
      log_dir: a folder for the build's log file (`<build id>.log`), named in a pipeline failure's
        message and removed after a success; None keeps no log file.
      engine_context: called with the log file's path (or None); the engine runs inside the
        context manager it returns (the command sends Beam's and the workers' output there).

    Returns:
      Outcome, whose manifest is the published one (None when the job was handed off).

    Raises:
      errors.BuildError: an expected failure, one line (errors.Interrupted for a signal).
    """
    if options.config.publish.append:  # the settings not given are the dataset's, read before anything checks them
        options = dataclasses.replace(options, config=appending.with_dataset_settings(options.config,
                                                                                      options.settings_given))
    config = options.config
    input_info = checks.check_input(config, ignore_split_column=options.ignore_split_column)
    if config.publish.append:
        appending.load_base(config)  # refused here, in one line, before the lock and the engine
    created = checks.check_output(config)
    try:
        return _build(options, input_info, notify=notify or _log_note, log_dir=log_dir,
                      engine_context=engine_context)
    except errors.BuildError:
        checks.remove_created_output(created)  # only a folder that nothing was written into
        raise


def build(input: str, output: str, **settings: Any) -> Optional[Manifest]:
    """Builds a dataset and publishes it; the library face of `imagerecords build`.

    Example:
        import imagerecords
        manifest = imagerecords.build("photos/", "/tmp/ds", splits={"train": 0.9, "validation": 0.1},
                                      num_shards=4, progress=lambda p: print(p.done, "of", p.total))
        print(manifest.split("train").num_examples)

    Args:
      input: a class-folder root, a CSV/JSONL manifest, or .npz/.npy arrays (local or a URI).
      output: the dataset folder.
      **settings: BuildConfig's and ImageOptions' fields by name (num_shards=4, overwrite=True,
        image_encoding="png") and BuildOptions' run fields (runner, pipeline_options,
        local_workers, progress, break_lock, detached, ignore_split_column).

    Returns:
      The published Manifest; None when the job went on without this process (detached, template).

    Raises:
      ValueError: an unknown setting or a bad value, before anything is read.
      imagerecords.Error: an expected failure of the build (errors.BuildError and its subclasses).
    """
    return run(BuildOptions.make(input, output, **settings)).manifest


def _build(options: BuildOptions, input_info: "InputInfo", *, notify: Callable[[str], None],
           log_dir: Optional[str], engine_context) -> Outcome:
    """run() from a checked input and output on: engine, lock, stages, verdict, commit."""
    config = options.config
    label_map = _read_label_map(config)
    engine = engines.choose(config, options.runner, options.pipeline_options, detached=options.detached,
                            local_workers=options.local_workers)
    build_id = output_lock.new_build_id()
    engine.name_job(build_id)
    log_path = os.path.join(log_dir, f"{build_id}.log") if log_dir else None
    start = time.monotonic()
    stage = _Stage()
    with _signals_as_interrupts(), lifecycle.hold(config.output, build_id, lifecycle.COMMAND,
                                                  break_lock=options.break_lock) as lock:
        try:
            if lock.took_over:
                notify(f"note: {lock.take_over_note()}")
            reusable = _claim_output(config)
            if config.publish.resume:
                notify(f"resuming: {reusable} staged shards of earlier builds can be reused if their fingerprints "
                       "match")
            stage.now = "engine"
            # With --append, the published dataset as it is now, under the lock (read once per manifest).
            base = appending.load_base(config) if config.publish.append else None
            _run_engine(engine, options, Build(config, build_id, versions(), label_map, base), input_info=input_info,
                        log_path=log_path, engine_context=engine_context)
            handed_off = engine.handoff(lock)
            if handed_off:
                return Outcome(None, time.monotonic() - start, engine.description, handed_off=handed_off)
            stage.now = "verdict"
            results = _staged_results(config, build_id)

            def committing() -> None:
                if config.publish.resume:
                    notify(f"resumed: {_reused_count(config.output, build_id, results)} of {len(results.shards)} "
                           "shards reused")
                stage.now = "commit"

            manifest = _conclude(config, results, committing)
            stage.now = "done"
        except KeyboardInterrupt as e:
            raise _interrupted(e, stage.now, config, build_id) from None
    if log_path and os.path.exists(log_path):
        os.remove(log_path)
    return Outcome(manifest, time.monotonic() - start, engine.description,
                   ignored_columns=tuple(checks.ignored_columns(config, input_info)),
                   planned_by_count=config.shards.num_shards is None and not input_info.sizes_known,
                   failed_hosts=results.failed_hosts, near_groups=results.near_groups)


def _run_engine(engine: engines.Engine, options: BuildOptions, build: Build, *, input_info, log_path: Optional[str],
                engine_context) -> None:
    """Runs the engine inside the caller's context (the command's log redirection), reporting
    progress for the local engine; a runner's error becomes one line, a signal stays a signal."""
    report = options.progress if engine.reports_progress else None
    progress_dir = tempfile.mkdtemp(prefix="imagerecords-progress-") if report else None
    try:
        with engine_context(log_path) if engine_context else contextlib.nullcontext():
            progress = _ProgressPoller(progress_dir, report) if report else contextlib.nullcontext()
            try:
                with progress:
                    engine.run(build, input_info=input_info, progress_dir=progress_dir)
            except KeyboardInterrupt:
                engine.stop()
                raise
            except Exception as e:  # the runner's wrapper of a worker error: reported in one line
                if _SIGNALLED:
                    engine.stop()
                    raise errors.Stopped(_SIGNALLED[0]) from None
                _keep_traceback(log_path, e)
                raise _failure(e, options.config, log_path) from None
    finally:
        if progress_dir:
            shutil.rmtree(progress_dir, ignore_errors=True)


class _ProgressPoller:
    """Sums what the shard writers report (files in `progress_dir`: {done, rejected, total} per
    shard, each split's planned count) and hands it to `report` at the start, once a second, and
    once more, final, when the engine has ended."""

    def __init__(self, progress_dir: str, report: Callable[[Progress], Any]):
        self._dir = progress_dir
        self._report = report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._start = time.monotonic()

    def state(self, final: bool = False) -> Progress:
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
        return Progress(seconds=time.monotonic() - self._start, final=final, **out)

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self._report(self.state())

    def __enter__(self) -> "_ProgressPoller":
        self._report(self.state())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._report(self.state(final=True))


class _Stage:
    """Where the build is, for the message a signal gets: engine, verdict, commit or done."""

    now = "lock"


def _staged_results(config: BuildConfig, build_id: str) -> publish.BuildResults:
    results = publish.read_results(config.output, build_id)
    if results is None:
        raise errors.PipelineFailed(f"the pipeline ended without writing its results to {STAGING}; nothing was "
                                    "published")
    return results


def _conclude(config: BuildConfig, results: publish.BuildResults, on_commit: Callable[[], None]) -> Manifest:
    try:
        return lifecycle.conclude(config.output, results, lifecycle.COMMAND, keep_versions=config.publish.keep_versions,
                                  on_commit=on_commit)
    except OSError as e:
        if storage.is_no_space(e):
            raise _failure(e, config, None) from None
        raise


def _reused_count(output: str, build_id: str, results: publish.BuildResults) -> int:
    """Shards of this build that an earlier build wrote (their staged record says so)."""
    staged_dir = staging.staging_dir(output, build_id)
    count = 0
    for r in results.shards:
        try:
            record = json.loads(storage.read_bytes(storage.join(staged_dir, r.filename + staging.STAGED_RECORD)))
        except (OSError, ValueError):
            continue
        count += record.get("reused", False)
    return count


def _interrupted(e: KeyboardInterrupt, stage: str, config: BuildConfig, build_id: str) -> errors.Interrupted:
    """The one line for a build stopped by a signal, saying what is left and the command that mends it."""
    signum = getattr(e, "signum", signal.SIGINT)
    what = f"stopped by {signal.Signals(signum).name}"
    out = config.output
    if stage == "commit":
        return errors.Interrupted(f"{what} during the commit: {out} still publishes its previous dataset (if any) "
                                  f"unchanged; run `imagerecords finish {out}` to publish this build", signum)
    if stage == "done":
        return errors.Interrupted(f"{what} after the commit: {out} is published", signum)
    staged = 0
    if staging.staged_builds(out):
        staged = sum(1 for p in storage.list_tree(staging.staging_dir(out, build_id)) if p.endswith(staging.STAGED_RECORD))
    held = "1 complete shard is" if staged == 1 else f"{staged} complete shards are"
    resume = (f"; {held} staged: {naming.rerun_with('resume')} "
              "to reuse them"
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


def finish(output: str, break_lock: bool = False, *, notify: Optional[Callable[[str], None]] = None) -> Manifest:
    """Publishes the build staged in `output` (a build whose launcher was not there at the end, or
    a commit cut short). Same lock and commit as a build.

    Args:
      output: the dataset folder.
      break_lock: take over a lock that another process left behind.
      notify: called with a note worth a person's attention (a lock taken over); by default it
        goes to the `imagerecords` logger.

    Returns:
      The published Manifest.

    Raises:
      errors.BuildError: nothing to finish, over budget, or the lock is held.
    """
    if storage.exists(storage.join(output, MANIFEST)) and not staging.staged_builds(output):
        raise errors.UnfinishedBuild(f"nothing to finish: {output} is published and has no staging area")
    return lifecycle.conclude(output, None, lifecycle.FINISH, break_lock=break_lock, notify=notify or _log_note)
