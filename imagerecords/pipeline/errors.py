"""Expected failures of the build library: one exception class per case, each message one line.

The command maps each class to its exit code (imagerecords.cli.exit_codes); the library has none.
"""

from __future__ import annotations


from imagerecords.format.errors import Error  # the one base, shared with the readers


class BuildError(Error):
    """A build, finish or pre-flight check failed in a way the user can act on; subclasses name the
    case, so callers (and the command's exit codes) can tell the cases apart."""


class PipelineFailed(BuildError):
    """The pipeline ran and failed (a worker error); the full log is kept in a file."""


class UsageError(BuildError):
    """A flag is unknown, malformed or conflicts with another, or a config file is missing."""


class InputError(BuildError):
    """The input is missing, empty, or not shaped as a class-folder tree or manifest (one class's
    folder given for the root, for one)."""


class OutputError(BuildError):
    """The output cannot take the build: a file, inside the input, not writable, full, its lock path
    a folder, or holding data without --overwrite."""


class LockHeld(BuildError):
    """Another build holds the output folder's lock, or the lock file is unreadable."""


class BudgetExceeded(BuildError):
    """More inputs were rejected than --max_reject_fraction (or URLs failed than --max_download_failures)
    allows; nothing was published."""


class UnfinishedBuild(BuildError):
    """The output folder holds no published dataset, only an unfinished build's staging area."""


class Interrupted(BuildError):
    """The build was stopped by a signal (SIGINT, SIGTERM, SIGHUP), kept in `signum`."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class Stopped(KeyboardInterrupt):
    """Raised in the launcher's main thread by a SIGTERM or SIGHUP handler, so every cleanup that a
    Ctrl-C runs (cancelling shard writers, ending worker processes, releasing the lock) runs for them."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
