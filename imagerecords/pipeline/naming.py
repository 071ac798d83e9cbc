"""How an expected failure names a build setting: in the words of whoever gave it. The command line
reads `--append`, `--writer shards`; a Python caller of imagerecords.build reads `append=True`,
`writer='shards'`. Every message of the builder names a setting through `setting`.

The command sets IMAGERECORDS_SETTING_NAMES=flags for its process and, through the environment, its
workers; without it (the library, a user's Beam pipeline) settings are keyword arguments. A Beam
pipeline option (--runner's companions: --flink_master, --direct_num_workers, ...) is a flag in both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator, Set

VARIABLE = "IMAGERECORDS_SETTING_NAMES"
FLAGS = "flags"


def as_flags() -> bool:
    return os.environ.get(VARIABLE) == FLAGS


@contextlib.contextmanager
def flag_names() -> Iterator[None]:
    """Messages made inside (and in the processes started inside) name settings as flags."""
    before = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = FLAGS
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = before


def setting(name: str, value: Any = None) -> str:
    """`name` (a BuildConfig, ImageOptions or BuildOptions field), with `value` when the message
    names one: '--writer shards' / "writer='shards'"; a flag without a value: '--append' / 'append=True'."""
    if as_flags():
        return f"--{name}" if value is None else f"--{name} {value}"
    if value is not None:
        return f"{name}={value!r}"
    return f"{name}=True" if name in _SWITCHES else name


def rerun_with(name: str) -> str:
    """'rerun the same command with --resume' / 'rerun the same call with resume=True': advice that
    keeps every other setting the user gave (an --append stays an append)."""
    return f"rerun the same {'command' if as_flags() else 'call'} with {setting(name)}"


_SWITCHES: Set[str] = set()  # filled by `declare` as the settings' classes are defined


def declare(cls: type) -> type:
    """Records a settings class's bool fields (BuildConfig, ImageOptions, BuildOptions call it): they
    are switches, named alone on the command line. This module imports none of those classes."""
    _SWITCHES.update(f.name for f in dataclasses.fields(cls) if f.type in ("bool", bool))
    return cls
