"""Named points of a build that an outside observer may watch, so a test or an operator can stop,
fail or record a build at a chosen point without code of theirs in the builder.

    before_shards   a shard-writing worker, before its first shard
    mid_shard       a shard writer half-way through a shard (filename)
    before_rename   a shard fully written, before it is renamed into staging (filename)
    shard_staged    a shard renamed into staging (filename, records)
    mid_shards      a worker between two of its shards
    before_commit   the launcher (or a job's commit step), every shard staged, before the commit
    in_commit       the commit, its files moved, before manifest.json is written

IMAGERECORDS_PHASE_OBSERVER=module:function names a callable run as function(phase, **facts) at each
point, in every process of the build (the variable reaches workers with the environment). Unset,
each point costs one check. tests/support/phases.py is the observer the tests use.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Callable, Optional, Union

OBSERVER_VARIABLE = "IMAGERECORDS_PHASE_OBSERVER"

_observer: Union[None, bool, Callable[..., Any]] = None  # None: not looked up yet in this process; False: none


def reached(phase: str, **facts: Any) -> None:
    global _observer
    if _observer is None:
        _observer = _load(os.environ.get(OBSERVER_VARIABLE)) or False
    if _observer:
        _observer(phase, **facts)


def _load(spec: Optional[str]) -> Optional[Callable[..., Any]]:
    if not spec:
        return None
    module, _, name = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), name or "observe")
    except (ImportError, AttributeError) as e:
        raise ImportError(f"{OBSERVER_VARIABLE}={spec}: cannot load the observer ({e}); it is module:function, "
                          "importable in every process of the build") from None
