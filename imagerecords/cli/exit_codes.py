"""The command's exit codes: one per library exception class (README, "When things go wrong")."""

from __future__ import annotations

from typing import Dict, Type

from imagerecords.pipeline import errors

__all__ = ["EXIT_CODES", "exit_code"]

# Scripts tell the cases apart by these numbers; they are documented, so they never change.
EXIT_CODES: Dict[Type[errors.Error], int] = {
    errors.PipelineFailed: 1,
    errors.UsageError: 2,
    errors.InputError: 3,
    errors.OutputError: 4,
    errors.LockHeld: 5,
    errors.BudgetExceeded: 6,
    errors.UnfinishedBuild: 7,
}


def exit_code(e: errors.Error) -> int:
    """The exit code for `e`: its class's (or nearest base class's) entry; 128 + the signal number
    for errors.Interrupted, as a shell reports a process the signal ended; 1 for any other Error."""
    if isinstance(e, errors.Interrupted):
        return 128 + e.signum
    for cls in type(e).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return 1
