"""The build's command line: flags generated from BuildConfig/ImageOptions, every other flag checked
against Beam's PipelineOptions."""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import re
import typing
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple


from imagerecords.builder.engines.beam.names import runner_problem
from imagerecords.format import record_format, schema
from imagerecords.format import features as features_lib
from imagerecords.pipeline import config as config_lib
from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.encode import image_codec as codec
from imagerecords.pipeline.encode.image_codec import ImageOptions
from imagerecords.pipeline.errors import UsageError
from imagerecords.pipeline.read import download, optouts
from imagerecords.builder.options import BuildOptions, runner_in
from imagerecords.pipeline.naming import flag_names

__all__ = ["LauncherFlags", "Parsed", "beam_flag_names", "build_flag_names", "check_beam_args", "check_runner",
           "parse_args", "parser", "runner_of"]

PROG = "imagerecords build"

# Fields whose values come from a fixed set; argparse refuses anything else with the list.
CHOICES: Dict[str, Tuple[str, ...]] = {
    "schema": tuple(schema.PRESETS),
    "writer": tuple(config_lib.WRITERS),
    "near_duplicates": tuple(config_lib.NEAR_DUPLICATES),
    "label_type": tuple(config_lib.LABEL_TYPES),
    "image_encoding": tuple(codec.ENCODINGS),
    "robots_txt": optouts.ROBOTS_CHOICES,
    "record_format": record_format.names(),  # the formats this package ships (a test may register more)
}

# Fields whose dataclass type has no one-token command-line form, with the metavar shown in --help.
# The flag stays text; config.make_config converts it (config.parse_splits).
_TEXT_FORMS: Dict[str, str] = {
    "splits": "NAME=FRACTION,...",
}


@dataclasses.dataclass(frozen=True)
class LauncherFlags:
    """Flags that steer the command only: where its output goes (the build reads them nowhere).

    Attributes:
      config_file: the YAML preset given with --config, or None.
      no_progress: do not print progress on local runs.
      progress: print progress on local runs even when stderr is not a terminal (a log, a pipe).
      verbose: keep Beam and worker logs on the terminal instead of only in the log file.
    """

    config_file: Optional[str] = None
    no_progress: bool = False
    progress: bool = False
    verbose: bool = False


# Flags that fill BuildOptions' run fields (the same names).
_RUN_FLAGS = ("ignore_split_column", "break_lock", "detached", "local_workers")


@dataclasses.dataclass(frozen=True)
class Parsed:
    """The command line: the build's options (the object imagerecords.build fills too) and the
    command's own flags.

    Attributes:
      options: the validated BuildOptions: config (defaults < YAML preset < flags), the runner
        (the last --runner; 'DirectRunner' when only other Beam options are given; None for none)
        and the Beam pipeline options: the preset's `beam_options:` first, then the command line's
        (so a flag wins over the preset); every one is a flag PipelineOptions knows.
      launcher: the command-only flags.
    """

    options: BuildOptions
    launcher: LauncherFlags

    @property
    def config(self) -> BuildConfig:
        return self.options.config

    @property
    def beam_args(self) -> List[str]:
        return list(self.options.pipeline_options)


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are UsageError (one line, exit code 2), not SystemExit."""

    def error(self, message):
        raise UsageError(f"{message} (see {PROG} --help)")


# Launcher flags: (flag, dest, help). All are on/off switches except --config.
_LAUNCHER_SWITCHES = (
    ("--no_progress", "no_progress", "do not print progress on local runs"),
    ("--progress", "progress", "print progress on local runs even when stderr is not a terminal"),
    ("--verbose", "verbose", "keep Beam and worker logs on the terminal (they always go to the build's log file)"),
    ("--ignore_split_column", "ignore_split_column",
     "with --splits, reassign splits by hash although the manifest has a split column"),
    ("--break_lock", "break_lock", "take over the output folder's lock that another build left behind"),
    ("--detached", "detached", "Flink: return once the job runs on the cluster; the job's last step publishes "
     "the dataset (`imagerecords finish OUT` only completes a commit that was cut short)"),
)


def _unwrap_optional(tp: Any) -> Any:
    """Optional[X] -> X; anything else unchanged."""
    if typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _is_tuple_of_str(tp: Any) -> bool:
    return typing.get_origin(tp) is tuple and typing.get_args(tp) in ((str, Ellipsis),)


def _tuple_of_str(text: str) -> Tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


# What the code uses when a field is left empty, shown as its default in --help instead of the empty
# text ("(default: )"): the User-Agent a download sends (pipeline/read/download.py's Downloader).
_SHOWN_DEFAULTS = {"http_user_agent": download.default_user_agent()}


def _format_default(value: Any) -> str:
    if value is None:
        return "not set"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


@dataclasses.dataclass(frozen=True)
class _FieldFlag:
    """One build flag derived from a dataclass field."""

    name: str
    type: Any  # resolved annotation, Optional removed
    default: Any  # dataclasses.MISSING when the field is required
    doc: str

    def argparse_kwargs(self) -> Dict[str, Any]:
        help_text = self.doc.rstrip(".") if self.doc else self.name.replace("_", " ")
        if self.default is dataclasses.MISSING:
            help_text += " (required)"
        else:
            help_text += f" (default: {_SHOWN_DEFAULTS.get(self.name) or _format_default(self.default)})"
        # Every flag defaults to None: "not given", so a YAML preset value below it is kept.
        # argparse %-formats help text; a literal % in a docstring must not break --help.
        kwargs: Dict[str, Any] = {"dest": self.name, "default": None, "help": help_text.replace("%", "%%")}
        if self.type is bool:
            kwargs["action"] = "store_true"
            return kwargs
        if self.name in _TEXT_FORMS:
            kwargs["metavar"] = _TEXT_FORMS[self.name]
        elif _is_tuple_of_str(self.type):
            kwargs["type"] = _tuple_of_str
            kwargs["metavar"] = "A,B,..."
        elif self.type in (int, float):
            kwargs["type"] = self.type
        elif self.type is not str:
            raise TypeError(f"flags: field {self.name!r} has type {self.type!r}, which has no command-line form; "
                            "add it to flags._TEXT_FORMS")
        if self.name in CHOICES:
            kwargs["choices"] = CHOICES[self.name]
        return kwargs


def _field_flags() -> List[_FieldFlag]:
    """A flag per flat setting (config.SETTINGS), in its order: the concerns', the build's own, the image's."""
    out = []
    docs = {**config_lib.field_docs(BuildConfig), **config_lib.field_docs(ImageOptions)}
    defaults = config_lib.defaults()
    for cls in (*config_lib.CONCERNS, BuildConfig, ImageOptions):  # each setting's type where it lives
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if config_lib.SETTINGS.get(f.name) is None or f.name == "features":
                continue
            out.append((list(config_lib.SETTINGS).index(f.name), _FieldFlag(
                f.name, _unwrap_optional(hints[f.name]), defaults.get(f.name, dataclasses.MISSING), docs.get(f.name, ""))))
    out = [flag for _, flag in sorted(out, key=lambda pair: pair[0])]
    names = [f.name for f in out]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise TypeError(f"flags: BuildConfig and ImageOptions both have field(s) {', '.join(repeated)}")
    # The docstrings name other fields as `field`; on the command line they are --field.
    field_ref = re.compile(r"`(" + "|".join(map(re.escape, names)) + r")`")
    return [dataclasses.replace(f, doc=field_ref.sub(r"--\1", f.doc)) for f in out]


def parser() -> argparse.ArgumentParser:
    """Returns the parser of the build's own flags (Beam's are checked apart, see parse_args)."""
    p = _Parser(
        prog=PROG,
        allow_abbrev=False,  # a prefix such as --num must not silently become --num_shards
        description="Build a sharded TFRecord dataset from a class-folder tree or a CSV/JSONL manifest.",
        epilog="Any other flag must be an Apache Beam pipeline option (for example --runner, --project, "
               "--region, --temp_location, --flink_master, --direct_num_workers); an unknown flag is an "
               "error. A local build without any Beam option runs on the local engine, without Beam; --runner "
               "DirectRunner (or any Beam option) runs the same build on Beam, with the same bytes. "
               "Settings are layered: defaults < the --config preset < flags.")
    build = p.add_argument_group("build settings")
    for flag in _field_flags():
        build.add_argument(f"--{flag.name}", **flag.argparse_kwargs())
    build.add_argument("--feature", dest="features", action="append", default=None, metavar="NAME=DTYPE[DIMS][:ENC]",
                       help="declare a feature fed by the manifest column NAME, repeatable: boxes=float32[?,4], "
                            "tags=class_list, score=float32, caption=string, mask=image:png (? is a variable "
                            "dimension; more keys such as column: in a --config file's features:)")
    launcher = p.add_argument_group("launcher")
    launcher.add_argument("--config", dest="config_file", metavar="FILE", default=None,
                          help="YAML preset (see configs/): build settings and beam_options; flags override it")
    for flag, dest, help_text in _LAUNCHER_SWITCHES:
        launcher.add_argument(flag, dest=dest, action="store_true", help=help_text)
    launcher.add_argument("--local_workers", type=_non_negative_int, metavar="N", default=None,
                          help="local engine: shards are written by N worker processes (0: by threads in this "
                               "process); default: one per core, or threads for inputs too small to repay "
                               "starting processes")
    return p


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {value}")
    return value


def build_flag_names() -> List[str]:
    """Every flag the build itself takes, as '--name'."""
    return sorted(o for a in parser()._actions for o in a.option_strings if o.startswith("--"))


class _BeamChecker(argparse.ArgumentParser):
    """A parser of Beam's pipeline options whose errors are UsageError, one line naming the option."""

    def error(self, message):
        raise UsageError(f"Beam option: {message}")


def _beam_parser() -> argparse.ArgumentParser:
    """A parser holding every pipeline option Beam knows in this process, without prefix matching.

    Beam hands the parser it builds for PipelineOptions.get_all_options to add_extra_args_fn, so a
    flag passes here exactly when Beam will parse it rather than discard it.
    """
    # Beam: 1.2 s to import; only a build given Beam options or a runner reads Beam's flags
    from apache_beam.options.pipeline_options import PipelineOptions
    # Runner modules that define their options outside pipeline_options.py (Dask today); an
    # optional runner that is not installed simply contributes no flags.
    try:
        import apache_beam.runners.dask.dask_runner  # noqa: F401
    except ImportError:
        pass

    beams: List[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=beams.append)
    # Beam's own parser expands a prefix (--num to --num_workers); a copy of its options that does not.
    return _BeamChecker(prog=PROG, parents=beams, add_help=False, allow_abbrev=False)


def beam_flag_names() -> List[str]:
    """Every Beam pipeline option known in this process, as '--name'."""
    # Beam's parser carries argparse's --help, which is the build's own flag.
    return sorted(o for a in _beam_parser()._actions if a.dest != "help"
                  for o in a.option_strings if o.startswith("--"))


def _suggest(flag: str, known: Sequence[str]) -> Optional[str]:
    underscored = flag.replace("-", "_")
    underscored = "--" + underscored.lstrip("_")
    if underscored in known:
        return underscored
    close = difflib.get_close_matches(underscored, known, n=1, cutoff=0.75)
    return close[0] if close else None


def _unknown_flag_error(arg: str, where: str, known: Sequence[str]) -> UsageError:
    flag = arg.split("=", 1)[0]
    hint = _suggest(flag, known)
    text = f"{where}unknown flag {flag}"
    if hint:
        text += f" (did you mean {hint}?)"
    else:
        text += f"; it is neither a build flag nor a Beam pipeline option (see {PROG} --help)"
    return UsageError(text)


def check_beam_args(args: Sequence[str], where: str = "") -> None:
    """Raises UsageError unless every arg is a Beam pipeline option (with its value).

    Args:
      args: what is left after the build's own flags, e.g. ['--runner=DirectRunner',
        '--direct_num_workers', '2'].
      where: a prefix for the message naming the source, e.g. 'configs/x.yaml: beam_options: '.

    Raises:
      UsageError: naming the first unknown flag and the closest known build or Beam flag.
    """
    if not args:
        return  # nothing to check, and no reason to import Beam (a local build may not need it)
    beam = _beam_parser()
    _, unknown = beam.parse_known_args(list(args))
    if not unknown:
        return
    known = beam_flag_names() + build_flag_names()
    for arg in unknown:
        if arg.startswith("-") and arg != "--":
            raise _unknown_flag_error(arg, where, known)
    raise UsageError(f"{where}unexpected argument {unknown[0]!r}: values follow their flag, "
                     f"as in --name value or --name=value (see {PROG} --help)")


def check_runner(args: Sequence[str]) -> None:
    """Raises UsageError when --runner (the last one given) cannot run here (engines.beam.names.runner_problem)."""
    if not any(a == "--runner" or a.startswith("--runner=") for a in args):
        return

    runner = getattr(_beam_parser().parse_known_args(list(args))[0], "runner", None)
    problem = runner_problem(runner) if isinstance(runner, str) else None
    if problem:
        raise UsageError(f"--runner {runner}: {problem}")


def _preset_value(path: str, flag: _FieldFlag, value: Any) -> Any:
    """Checks (and for lists, converts) one YAML value against its field's type."""
    if value is None:
        return None
    if flag.name in _TEXT_FORMS:
        ok = isinstance(value, (str, Mapping))
    elif _is_tuple_of_str(flag.type):
        if isinstance(value, str):
            return _tuple_of_str(value)
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        value = tuple(value) if ok else value
    elif flag.type is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif flag.type is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, flag.type)
    if not ok:
        kind = getattr(flag.type, "__name__", None) or _TEXT_FORMS.get(flag.name) or "a list of names"
        raise UsageError(f"--config {path}: {flag.name} must be {kind}, got {value!r}")
    return value


def _load_preset(path: str) -> Tuple[Dict[str, Any], List[str]]:
    import yaml  # only with --config

    try:
        preset, beam_args = config_lib.load_preset(path)
    except FileNotFoundError:
        raise UsageError(f"--config {path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"--config {path}: is a folder, not a YAML file") from None
    except OSError as e:
        raise UsageError(f"--config {path}: cannot read it ({e.strerror or e})") from None
    except ValueError as e:  # unknown setting, not a mapping
        raise UsageError(str(e)) from None
    except yaml.YAMLError as e:
        # The parser's message spans several lines (with a caret); its first line names the problem.
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise UsageError(f"--config {path}: not valid YAML{where} ({first})") from None
    check_beam_args(beam_args, where=f"--config {path}: beam_options: ")
    flags = {f.name: f for f in _field_flags()}
    # features: a mapping of declarations, read by features.parse_declarations (its errors name the feature)
    return {k: v if k == "features" else _preset_value(path, flags[k], v) for k, v in preset.items()}, beam_args


def _features(declared: Any, flagged: Optional[Sequence[str]]) -> Optional[tuple]:
    """The config file's `features:` mapping, then the --feature flags (a flag replaces a declaration
    of the same name); None when neither declares any."""
    if declared is None and not flagged:
        return None
    by_name = {f.name: f for f in features_lib.parse_declarations(declared, "--config features")}
    for text in flagged or ():
        feature = features_lib.parse_flag(text)
        by_name[feature.name] = feature
    return tuple(by_name[name] for name in sorted(by_name))


def parse_args(argv: Sequence[str]) -> Parsed:
    """Parses the build's command line.

    Example:
        parsed = parse_args(["--input", "photos/", "--output", "/tmp/ds", "--num_shards", "4",
                             "--runner=DirectRunner"])
        parsed.config.shards.num_shards  # 4
        parsed.beam_args          # ['--runner=DirectRunner']

    Args:
      argv: the arguments after `imagerecords build`.

    Returns:
      Parsed(options, launcher).

    Raises:
      UsageError: an unknown or malformed flag, a missing --config file, a bad preset, missing
        --input/--output, or an invalid setting (BuildConfig's message).
      SystemExit: for --help, after printing it (argparse's own behaviour).
    """
    with flag_names():  # a flag's value that BuildConfig refuses is named as the flag
        return _parse_args(argv)


def _parse_args(argv: Sequence[str]) -> Parsed:
    known, rest = parser().parse_known_args(list(argv))
    check_beam_args(rest)
    values = vars(known)
    launcher = LauncherFlags(**{f.name: values.pop(f.name) for f in dataclasses.fields(LauncherFlags)})
    run = {name: values.pop(name) for name in _RUN_FLAGS}
    preset, preset_beam_args = ({}, [])
    if launcher.config_file:
        preset, preset_beam_args = _load_preset(launcher.config_file)
    missing = [f"--{k}" for k in ("input", "output") if not (values.get(k) or preset.get(k))]
    if missing:
        raise UsageError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} required "
                         f"(see {PROG} --help)")
    try:
        values["features"] = _features(preset.pop("features", None), values.pop("features", None))
        config = config_lib.make_config(preset, values)
    except ValueError as e:
        raise UsageError(str(e)) from None
    # What the command line and the preset set (a flag not given is None): an append takes the rest from the dataset.
    given = frozenset(k for layer in (preset, values) for k, v in layer.items() if v is not None)
    beam_args = list(preset_beam_args) + list(rest)
    check_runner(beam_args)
    try:
        options = BuildOptions(config=config, runner=runner_of(beam_args), pipeline_options=tuple(beam_args),
                               settings_given=given, **run)
    except ValueError as e:
        raise UsageError(str(e)) from None
    return Parsed(options=options, launcher=launcher)


def runner_of(beam_args: Sequence[str]) -> Optional[str]:
    """The runner the Beam options name (the last --runner), 'DirectRunner' (Beam's default) when
    they name none, or None without any Beam option: a build without one runs the local engine."""
    if not beam_args:
        return None
    return runner_in(beam_args) or "DirectRunner"
