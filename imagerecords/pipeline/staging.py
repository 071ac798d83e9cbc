"""Where a build stages its files in OUT, the one spelling that the shard writers (write/) and the
commit (publish/) share:

    OUT/.imagerecords-staging/<build id>/   each build's shards, their staged records, results
    OUT/v-<build id>/                       the version folder the commit moves them into
"""

from __future__ import annotations

import hashlib
import os
import shutil
from typing import List, Optional, Tuple

from imagerecords.format.manifest import STAGING, VERSION_PREFIX
from imagerecords.format.paths import segment_problem
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline import storage

STAGED_RECORD = ".staged.json"  # beside each staged shard: its fingerprint and its writer's report


def staging_root(output: str) -> str:
    """The folder holding every build's staging area (at most one live build: the lock's holder)."""
    return storage.join(output, STAGING)


def staging_dir(output: str, build_id: str) -> str:
    """The staging area of one build: only that build's writers write into it."""
    if segment_problem(build_id) or build_id.startswith("."):
        raise ValueError(f"bad build id {build_id!r}")
    return storage.join(output, STAGING, build_id)


def version_folder(build_id: str) -> str:
    """The folder (relative to the output) a published build's shards live in."""
    return VERSION_PREFIX + build_id


def staged_builds(output: str) -> List[str]:
    """Build ids with a staging area in `output`, oldest first (build ids start with their UTC time)."""
    root = staging_root(output)
    prefix = root.rstrip("/").rstrip(os.sep) + ("/" if not storage.is_local(root) else os.sep)
    ids = {path[len(prefix):].replace(os.sep, "/").split("/", 1)[0] for path in storage.list_tree(root)}
    return sorted(i for i in ids if i and not i.startswith("."))


def remove_staging(output: str, build_id: Optional[str] = None) -> None:
    """Removes one build's staging area, or (build_id None) every build's: a killed build's or a
    committed one's."""
    staging = staging_root(output) if build_id is None else staging_dir(output, build_id)
    if storage.is_local(output):
        shutil.rmtree(staging, ignore_errors=True)
        return
    storage.delete_all(storage.list_tree(staging))


def owns_output(output: str, build_id: str) -> bool:
    """Whether `build_id` may still write into `output`: its lock names no other build, or only
    another pipeline's commit (which touches its own staging alone). A writer whose launcher died
    and whose lock another build took over must not touch anything."""
    holder = output_lock.read_lock(output)
    return holder is None or holder.build_id == build_id or holder.command == output_lock.COMMIT


def sha256_and_size(path: str) -> Tuple[str, int]:
    """The sha256 (hex) and length of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    size = 0
    with storage.open_read(path) as f:
        while True:
            block = f.read(1 << 20)
            if not block:
                break
            digest.update(block)
            size += len(block)
    return digest.hexdigest(), size
