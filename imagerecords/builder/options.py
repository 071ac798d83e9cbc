"""BuildOptions: everything one build needs, validated once, filled by imagerecords.build() or the command."""

from __future__ import annotations

import dataclasses
import numbers
from typing import Any, Callable, FrozenSet, Optional, Sequence, Tuple

from imagerecords.builder.engines.beam.names import runner_problem
from imagerecords.pipeline import config as config_lib
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline import naming
from imagerecords.pipeline.naming import setting

__all__ = ["BuildOptions", "Progress", "RUN_FIELDS"]


@dataclasses.dataclass(frozen=True)
class Progress:
    """What a local build has done so far, handed to BuildOptions.progress about once a second.

    Attributes:
      done: records written or rejected so far, over every split.
      rejected: inputs rejected so far.
      total: inputs planned into shards so far (grows while splits are still being planned).
      planned: splits whose shards are planned; 0 while the input is still being listed.
      seconds: seconds since the engine started.
      final: True for the last call, made once the engine has ended.
    """

    done: int = 0
    rejected: int = 0
    total: int = 0
    planned: int = 0
    seconds: float = 0.0
    final: bool = False


@naming.declare
@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """One build: what to write (the BuildConfig) and how to run it (engine, runner, lock).

    Example:
        options = BuildOptions.make("photos/", "/tmp/ds", splits={"train": 0.9, "validation": 0.1},
                                    num_shards=4, runner="DirectRunner")

    Attributes:
      config: the build settings: input, output, splits, shards, images, features (BuildConfig).
      runner: None runs the local engine (no Beam), or Beam's default runner where the local engine
        cannot go (gs:// or s3:// paths, writer 'beam'); otherwise a Beam runner's name
        ('DirectRunner', 'PrismRunner', 'FlinkRunner', 'DataflowRunner') or dotted class path.
      pipeline_options: Beam pipeline options as arguments (['--direct_num_workers=2']); they need a
        runner.
      local_workers: the local engine's worker processes (0: threads in this process); None picks
        by input size.
      progress: called with a Progress about once a second while a local build writes, and once
        at its end; None for no progress reports (Beam runners report none).
      break_lock: take over the output folder's lock that another build left behind.
      detached: on a Flink cluster, return once the job is submitted (`finish` publishes it later).
      ignore_split_column: with `splits`, reassign splits by hash although the manifest has a split
        column.
      settings_given: the names of the build settings the caller set (BuildConfig's and ImageOptions'
        fields, as `make` and the command fill it); with `config.publish.append`, every other setting is
        the dataset's (its manifest's parameters). None: the settings whose values are not their
        defaults.
    """

    config: BuildConfig
    runner: Optional[str] = None
    pipeline_options: Tuple[str, ...] = ()
    local_workers: Optional[int] = None
    progress: Optional[Callable[[Progress], Any]] = None
    break_lock: bool = False
    detached: bool = False
    ignore_split_column: bool = False
    settings_given: Optional[FrozenSet[str]] = None

    def __post_init__(self):
        if not isinstance(self.config, BuildConfig):
            raise ValueError(f"config must be a BuildConfig, got {type(self.config).__name__} {self.config!r:.80}")
        if self.runner is not None and (not isinstance(self.runner, str) or not self.runner.strip()
                                        or self.runner != self.runner.strip()):
            raise ValueError(f"runner must be None or a Beam runner's name, got {self.runner!r:.80}")
        args = self.pipeline_options
        if isinstance(args, (str, bytes)) or not isinstance(args, (list, tuple)):
            raise ValueError(f"pipeline_options must be a list of arguments such as ['--direct_num_workers=2'], "
                             f"got {args!r:.80}")
        bad = [a for a in args if not isinstance(a, str)]
        if bad:
            raise ValueError(f"pipeline_options: every argument must be a string, got {bad[0]!r:.80}")
        object.__setattr__(self, "pipeline_options", tuple(args))
        if args and self.runner is None:
            raise ValueError(f"pipeline_options {list(args)!r:.80} need a runner (runner='DirectRunner', ...); "
                             "runner=None is the local engine")
        given = runner_in(args)
        if given is not None and given != self.runner:
            raise ValueError(f"runner {self.runner!r} disagrees with --runner {given} in pipeline_options")
        if self.runner is not None:
            problem = runner_problem(self.runner)
            if problem:
                raise ValueError(f"runner {self.runner!r}: {problem}")
        workers = self.local_workers
        if workers is not None:
            if isinstance(workers, bool) or not isinstance(workers, numbers.Integral):
                raise ValueError(f"local_workers must be a whole number or None, got {workers!r:.80}")
            if workers < 0:
                raise ValueError(f"local_workers must be 0 or more, got {workers}")
            object.__setattr__(self, "local_workers", int(workers))  # a NumPy int becomes an int
        if self.progress is not None and not callable(self.progress):
            raise ValueError(f"progress must be a callable taking a Progress, or None, got {self.progress!r:.80}")
        given = self.settings_given
        if given is not None:
            if not isinstance(given, (set, frozenset, list, tuple)) or not all(isinstance(n, str) for n in given):
                raise ValueError(f"settings_given must be a set of setting names or None, got {given!r:.80}")
            object.__setattr__(self, "settings_given", frozenset(given))
        for name in ("break_lock", "detached", "ignore_split_column"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r:.80}")
        # The settings that combine with how the build runs (those among the settings alone: BuildConfig).
        if self.config.publish.append and (self.detached or any(a.startswith("--template_location") for a in args)):
            raise ValueError(f"{setting('append')} needs the build to end in this process (no {setting('detached')}, "
                             "no template): the version it adds to is read now and could be replaced before a later job")

    @classmethod
    def make(cls, input: str, output: str, **settings: Any) -> "BuildOptions":
        """Builds the options from keyword settings: BuildConfig's and ImageOptions' fields by name
        (`num_shards=4`, `splits={"train": 0.9, "test": 0.1}`, `image_encoding="png"`,
        `features={"boxes": "float32[?,4]"}`) and the run fields of this class.

        Raises:
          ValueError: naming the unknown setting or the bad value.
        """
        run = {k: settings.pop(k) for k in RUN_FIELDS if k in settings}
        for name in ("input", "output"):
            value = {"input": input, "output": output}[name]
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a path or URI (a non-empty string), got {value!r:.80}")
        given = frozenset(k for k, v in settings.items() if v is not None)  # None: not set, as make_config reads it
        return cls(config=config_lib.make_config(settings, {"input": input, "output": output}), settings_given=given,
                   **run)


RUN_FIELDS = tuple(f.name for f in dataclasses.fields(BuildOptions) if f.name not in ("config", "settings_given"))


def runner_in(args: Sequence[str]) -> Optional[str]:
    """The last --runner among Beam arguments (`--runner=X` or `--runner X`), or None."""
    found = None
    for i, arg in enumerate(args):
        if arg.startswith("--runner="):
            found = arg.split("=", 1)[1]
        elif arg == "--runner" and i + 1 < len(args):
            found = args[i + 1]
    return found
