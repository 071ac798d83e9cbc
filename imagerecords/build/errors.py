"""Expected failures of the command line: each is one line on stderr and a documented exit code."""

from __future__ import annotations


class BuildError(Exception):
    """A failure the user can act on; the message is the whole story (no traceback is shown).

    Subclasses fix the exit code, so scripts can tell the cases apart (README, "When things go wrong").
    """

    exit_code = 1


class PipelineFailed(BuildError):
    """The pipeline ran and failed (a worker error); the full log is kept in a file."""

    exit_code = 1


class UsageError(BuildError):
    """A flag is unknown, malformed or conflicts with another, or a config file is missing."""

    exit_code = 2


class InputError(BuildError):
    """The input is missing, empty, or not shaped as a class-folder tree or manifest (one class's
    folder given for the root, for one)."""

    exit_code = 3


class OutputError(BuildError):
    """The output cannot take the build: a file, inside the input, not writable, full, its lock path
    a folder, or holding data without --overwrite."""

    exit_code = 4


class LockHeld(BuildError):
    """Another build holds the output folder's lock, or the lock file is unreadable."""

    exit_code = 5


class BudgetExceeded(BuildError):
    """More inputs were rejected than --max_reject_fraction allows; nothing was published."""

    exit_code = 6


class UnfinishedBuild(BuildError):
    """The output folder holds no published dataset, only an unfinished build's staging area."""

    exit_code = 7


class Interrupted(BuildError):
    """The build was stopped by a signal (SIGINT, SIGTERM, SIGHUP); the exit code is 128 + its number,
    as a shell reports a process the signal ended."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class Stopped(KeyboardInterrupt):
    """Raised in the launcher's main thread by a SIGTERM or SIGHUP handler, so every cleanup that a
    Ctrl-C runs (cancelling shard writers, ending worker processes, releasing the lock) runs for them."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
