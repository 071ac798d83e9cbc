"""The engines that run the build's stages: the local engine (no Beam) and the Beam pipeline.

An engine is chosen once per build (`choose`) and run once (`Engine.run`): it writes every shard
into the build's staging area and, last, its results.json. Both engines hold the same
shard_writer.ShardWriter and write the same bytes.
"""

from __future__ import annotations

from typing import Optional, Protocol, Sequence

from imagerecords.builder.engines.local import LocalEngine
from imagerecords.pipeline import sources, storage
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.errors import UsageError
from imagerecords.pipeline.naming import setting
from imagerecords.pipeline.publish.build import Build
from imagerecords.pipeline.sources import InputInfo


class Engine(Protocol):
    """What the launcher needs of an engine.

    Attributes:
      description: how the build ran, for the summary ("local engine, 2 worker processes").
      reports_progress: whether its shard writers report to a progress folder (the local engine).
    """

    description: str
    reports_progress: bool

    def name_job(self, build_id: str) -> None:
        """Names the job after the build, where the runner has job names."""

    def run(self, build: Build, *, input_info: InputInfo, progress_dir: Optional[str]) -> None:
        """Runs the stages of `build` into its staging area; raises what the runner raised."""

    def stop(self) -> None:
        """Ends what the run left running (worker processes) after an interrupt."""

    def handoff(self, lock) -> Optional[str]:
        """When the job goes on without this process (a detached submit, a template): marks the
        lock and returns the line to print; None when the build is complete here."""


def uses_local_engine(config: BuildConfig, runner: Optional[str], detached: bool = False) -> bool:
    """Whether a build runs on the local engine rather than Beam.

    It does when no runner is named (runner None) and the local engine can do the build: local
    input and output, no detached submit and the default shard writer (`--writer beam` is Beam's
    own sink). Both engines write the same bytes.
    """
    return (runner is None and not detached and config.writer == "shards"
            and sources.of(config.input).local(config.input) and storage.is_local(config.output))


def choose(config: BuildConfig, runner: Optional[str], pipeline_options: Sequence[str] = (), *,
           detached: bool = False, local_workers: Optional[int] = None) -> Engine:
    """The engine for this build: local when no runner is named and the local engine can do it
    (uses_local_engine), else Beam on `runner` (Beam's default runner when None).

    Raises:
      UsageError: --local_workers for a Beam build, or a detached submit that cannot run detached.
    """
    if uses_local_engine(config, runner, detached):
        return LocalEngine(config, local_workers)
    if local_workers is not None:
        raise UsageError(f"{setting('local_workers')} is for the local engine (local paths, no Beam options); on Beam use the "
                         "runner's options (--direct_num_workers, ...)")
    from imagerecords.builder.engines.beam.runner import BeamEngine  # Beam: 1.2 s to import; a local build never loads it

    beam_args = list(pipeline_options)
    if runner is not None and not any(a == "--runner" or a.startswith("--runner=") for a in beam_args):
        beam_args.insert(0, f"--runner={runner}")  # the option names the runner; Beam reads it from its args
    return BeamEngine(config, beam_args, detached)
