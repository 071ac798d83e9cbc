"""How the local engine starts its worker processes (forked on Linux, spawned elsewhere): one rule
for the engine's pool and for what the launcher makes for its workers to share (download.HostSlots)."""

import multiprocessing
import sys


def fork_available() -> bool:
    # Workers are forked: they inherit the imported codec and the build's settings, and never
    # re-import the caller's __main__ (which spawn and forkserver do: a script calling run()
    # without a `__main__` guard would start itself again in every worker). macOS's system
    # libraries are not fork-safe, so elsewhere the default stays on threads.
    return sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods()


def worker_context():
    """The multiprocessing context the local engine's workers start from (and their shared locks)."""
    return multiprocessing.get_context("fork" if fork_available() else "spawn")
