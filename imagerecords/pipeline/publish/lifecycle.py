"""A build's end in one place: who holds OUT's lock and when, the budget verdict and what a failed
one leaves behind, the commit, and the clean-up. The ways a build ends differ only in their
LockPolicy, a value:

    COMMAND   the command's build: its launcher holds the lock from before the engine to the end
    PIPELINE  a pipeline ending in WriteDataset: its last step takes the lock, waiting out other
              pipelines' commits, and removes only its own staging (others may be staging now)
    JOB       a detached or templated command's job: its last step takes the lock its launcher took
    FINISH    `imagerecords finish`: publishes what a launcher left staged, or a commit cut short
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Optional

from imagerecords.format.manifest import Manifest
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline import phases, staging
from imagerecords.pipeline.errors import OutputError
from imagerecords.pipeline.publish import commit as publish

# How long a pipeline's commit waits while another pipeline's commit holds the lock (a commit of a
# large gs:// dataset renames and checks for minutes).
COMMIT_WAIT_S = 900.0


@dataclasses.dataclass(frozen=True)
class LockPolicy:
    """How one way of ending a build holds OUT.

    Attributes:
      command: what the lock file names as its holder's command (output_lock.LockInfo.command).
      taken_at_commit: the last step takes the lock (else its caller holds it throughout).
      wait_for_commits_s: how long taking it waits while another pipeline's commit holds it.
      refuses_published: a published dataset is replaced only with overwrite, checked under the
        lock at the commit (the command checks before its engine starts).
      keep_other_staging: remove only this build's staging area (else every build's: the
        lock's holder owns OUT).
      takes_over_done_jobs: a lock whose detached job has staged its results may be taken over.
    """

    command: str
    taken_at_commit: bool
    wait_for_commits_s: float = 0.0
    refuses_published: bool = False
    keep_other_staging: bool = False
    takes_over_done_jobs: bool = False


COMMAND = LockPolicy("build", taken_at_commit=False)
PIPELINE = LockPolicy(output_lock.COMMIT, taken_at_commit=True, wait_for_commits_s=COMMIT_WAIT_S,
                      refuses_published=True, keep_other_staging=True)
JOB = LockPolicy(output_lock.JOB_COMMIT, taken_at_commit=True, wait_for_commits_s=COMMIT_WAIT_S,
                 refuses_published=True)
FINISH = LockPolicy("finish", taken_at_commit=True, takes_over_done_jobs=True)


def hold(output: str, build_id: str, policy: LockPolicy, *, break_lock: bool = False) -> output_lock.OutputLock:
    """OUT's lock as `policy` takes it (a context manager: released when it ends)."""
    done = (lambda: publish.results_staged(output)) if policy.takes_over_done_jobs else None
    return output_lock.OutputLock(output, build_id, command=policy.command, break_lock=break_lock,
                                  detached_job_done=done, wait_for_commits_s=policy.wait_for_commits_s)


def conclude(output: str, results: Optional[publish.BuildResults], policy: LockPolicy, *, keep_versions: int = 2,
             overwrite: bool = False, break_lock: bool = False, on_commit: Optional[Callable[[], None]] = None,
             notify: Optional[Callable[[str], None]] = None) -> Manifest:
    """The end of a build whose shards are all staged: the lock (when `policy` takes it here), the
    budget verdict (a failed one leaves only the reasons), the commit, the clean-up.

    Args:
      output: the dataset folder.
      results: the staged build's results; None (FINISH) for the commit recorded in staging, or the
        newest staged results.
      policy: how this end holds OUT (COMMAND, PIPELINE, JOB, FINISH).
      keep_versions, overwrite: the build's settings.
      on_commit: called once the verdict passed, just before the commit starts.
      notify: called with a note worth a person's attention (a lock taken over).

    Raises:
      LockHeld: another build or `finish` holds the output.
      OutputError: a dataset is published there and `overwrite` is off (PIPELINE, JOB), or a
        staged file changed.
      BudgetExceeded: too many rows were rejected (the staged shards are removed, errors.jsonl stays).
      UnfinishedBuild: nothing is staged to publish.
    """
    if results is not None:
        phases.reached("before_commit")
    build_id = results.build_id if results is not None else output_lock.new_build_id()
    held = hold(output, build_id, policy, break_lock=break_lock) if policy.taken_at_commit else contextlib.nullcontext()
    with held as lock:
        if lock is not None and lock.took_over and notify:
            notify(f"note: {lock.take_over_note()}")
        if policy.refuses_published and not overwrite and publish.published(output) is not None:
            raise OutputError(f"{output} holds a published dataset; pass overwrite=True to replace it (nothing was "
                              f"published; this build's shards stay in {staging.staging_dir(output, build_id)})")
        if results is not None:
            publish.verdict(output, results)
        if on_commit:
            on_commit()
        return publish.commit(output, results, keep_versions=keep_versions,
                              keep_other_staging=policy.keep_other_staging)
