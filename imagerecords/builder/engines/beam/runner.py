"""The Beam engine: the graph on a runner, with each runner's specifics (DirectRunner's modes, Flink's
detached submit and REST polling, Dataflow templates) kept here."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import urllib.error
import urllib.request
from typing import List, Optional, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import (DirectOptions, FlinkRunnerOptions, GoogleCloudOptions, PipelineOptions,
                                                  PortableOptions, StandardOptions)

from imagerecords.builder.engines.beam.graph import build_pipeline
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.errors import PipelineFailed, UsageError
from imagerecords.pipeline.lock import is_zombie
from imagerecords.pipeline.sources import InputInfo
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.publish.build import Build


class BeamEngine:
    """Runs build_pipeline on the runner the Beam options choose."""

    reports_progress = False  # the runner has its own UI for that

    def __init__(self, config: BuildConfig, beam_args: Sequence[str], detached: bool):
        self.config = config
        self.detached = detached
        self.options = PipelineOptions(list(beam_args))
        _direct_defaults(self.options, beam_args)
        if detached:
            _check_detached(self.options)
        self.template = self.options.view_as(GoogleCloudOptions).template_location
        self.flink_job: Optional[str] = None
        self.description = runner_name(self.options)

    def name_job(self, build_id: str) -> None:
        if self.detached:
            cloud = self.options.view_as(GoogleCloudOptions)
            if not cloud.job_name:
                cloud.job_name = f"imagerecords-{build_id.lower()}"

    def run(self, build: Build, *, input_info: InputInfo, progress_dir: Optional[str] = None) -> None:
        self._before = set(_descendants(os.getpid()))  # the caller's own processes, which stop() spares
        p = beam.Pipeline(options=self.options)
        # A job that runs on without this process ends with the commit itself.
        build_pipeline(p, build, input_info=input_info, commit=bool(self.detached or self.template))
        result = p.run()
        if self.detached:
            self.flink_job = _wait_until_on_flink(self.options, result)
        else:
            result.wait_until_finish()

    def stop(self) -> None:
        end_child_processes(spare=getattr(self, "_before", ()))

    def handoff(self, lock) -> Optional[str]:
        output = self.config.output
        if self.detached:
            lock.hand_over_to_detached_job()
            return (f"imagerecords: submitted build {lock.info.build_id} as Flink job {self.flink_job}; follow it in "
                    f"the Flink UI or REST API ({_flink_rest(self.options)}/jobs/{self.flink_job}); its last step "
                    f"publishes the dataset in {output} (if that step is cut short, `imagerecords finish {output}` "
                    "completes it)")
        if self.template:
            return (f"imagerecords: wrote the Dataflow template {self.template}; nothing was built yet. Its job's "
                    f"last step publishes the dataset in {output} (if that step is cut short, `imagerecords finish "
                    f"{output}` completes it)")
        return None


def _direct_defaults(options, beam_args: Sequence[str]) -> None:
    """DirectRunner: one worker per core, in worker processes (in memory with one worker)."""
    runner = options.view_as(StandardOptions).runner
    if runner is not None and "direct" not in str(runner).lower():
        return
    direct = options.view_as(DirectOptions)
    if not any(a.startswith("--direct_num_workers") for a in beam_args):
        direct.direct_num_workers = os.cpu_count() or 1
    if not any(a.startswith("--direct_running_mode") for a in beam_args):
        # Processes, not multi_threading, which corrupts large bundles (README, "Running").
        direct.direct_running_mode = "in_memory" if direct.direct_num_workers == 1 else "multi_processing"


def runner_name(options) -> str:
    runner = options.view_as(StandardOptions).runner or "DirectRunner"
    return runner if isinstance(runner, str) else type(runner).__name__


def _flink_rest(options) -> str:
    master = options.view_as(FlinkRunnerOptions).flink_master.strip().rstrip("/")
    return master if "://" in master else "http://" + master


def _check_detached(options) -> None:
    """--detached: a Flink cluster whose SDK workers run on the cluster, so nothing needs this process."""
    runner = str(options.view_as(StandardOptions).runner or "")
    master = options.view_as(FlinkRunnerOptions).flink_master or ""
    if "flink" not in runner.lower() or master in ("", "[local]", "[auto]"):
        raise UsageError(f"{setting('detached')} needs {setting('runner')}=FlinkRunner and --flink_master=HOST:PORT of a Flink cluster")
    environment = (options.view_as(PortableOptions).environment_type or "").upper()
    if environment in ("", "LOOPBACK"):
        raise UsageError(f"{setting('detached')} needs SDK workers on the cluster (--environment_type=EXTERNAL, PROCESS or "
                         "DOCKER); with LOOPBACK they run inside this process")


def _wait_until_on_flink(options, result, timeout: float = 600.0) -> str:
    """Returns the Flink job id of a just-submitted build once the cluster lists the job. Beam's job
    server (a child of this process, stopped when it exits) submits asynchronously; the job runs on
    without it. Matched by the job name (--job_name, set here when not given)."""
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
    raise PipelineFailed(f"{setting('detached')}: Flink at {_flink_rest(options)} did not list job {name} within "
                         f"{timeout:.0f} s of the submit")


def end_child_processes(spare=()) -> None:
    """Ends every process this one started, and theirs (Beam's SDK workers and job servers), except
    those in `spare` and their own (a library caller's processes that were running before the build):
    SIGTERM, then SIGKILL for those still alive after a few seconds. Linux only (it reads /proc)."""
    children = _descendants(os.getpid(), skip=set(spare))
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.05)
    for pid in children:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    for pid in children:
        with contextlib.suppress(OSError):
            os.waitpid(pid, os.WNOHANG)


def _descendants(root: int, skip=frozenset()) -> List[int]:
    parents = {}
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
    found, frontier = [], [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found and pid not in skip:
                found.append(pid)
                frontier.append(pid)
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return not is_zombie(pid)
