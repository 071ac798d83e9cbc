"""The commit's check of a build's own files: each staged shard, index file and side file the
manifest lists is the one its writer reported (by gs:// metadata, by an unchanged local identity, or
read back), and an earlier version's shard an append links to is still the size its manifest lists."""

from __future__ import annotations

import concurrent.futures
import os
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from imagerecords.format.manifest import Manifest
from imagerecords.pipeline import staging, storage
from imagerecords.pipeline.errors import OutputError
from imagerecords.pipeline.naming import rerun_with, setting

def check_staged(output: str, manifest: Manifest, staged: Mapping[str, str],
                 reported: Optional[Mapping[str, str]] = None,
                 metadata: Optional[Mapping[str, Tuple[int, Optional[str]]]] = None,
                 identities: Optional[Mapping[str, str]] = None, earlier: Iterable[str] = ()) -> None:
    """Checks every file the manifest lists (at its staged path, or in place when an earlier commit
    attempt already moved it) against what its writer reported.

    A file whose writer reported a crc32c (`reported`, by manifest file name) and whose object
    metadata (`metadata`, by path: size and crc32c from a gs:// listing) is known is checked by that
    metadata alone: GCS computed the crc32c of the stored bytes, so nothing is downloaded. A local
    file whose identity (storage.identity: inode, size, modification and change times) is the one
    its writer saw once it was in place (`identities`, by manifest file name) has not been written
    since, so it is not read either. Any other file is read back and compared by size and sha256.

    Raises:
      OutputError: naming the first file that differs (another process wrote over it) or is missing.
    """
    reported = reported or {}
    metadata = metadata or {}
    identities = identities or {}
    earlier = set(earlier)
    expected = []
    own = f"{manifest.version}/" if manifest.version else ""
    for split in manifest.splits:
        for shard in split.shards:
            if not shard.filename.startswith(own) or shard.filename in earlier:
                continue  # an appended dataset's earlier shards: checked when they were published
            expected.append((shard.filename, shard.num_bytes, shard.sha256))
            if shard.index_file and shard.index_sha256:
                expected.append((shard.index_file, -1, shard.index_sha256))
    expected.extend((s.side.filename, -1, s.side.sha256) for s in manifest.splits
                    if s.side is not None and s.side.filename.startswith(own))

    def one(item):
        filename, num_bytes, sha256 = item
        path = staged.get(filename) or storage.join(output, filename)
        want_crc, (got_size, got_crc) = reported.get(filename), metadata.get(path, (-1, None))
        if want_crc and got_crc:
            if (num_bytes >= 0 and got_size != num_bytes) or got_crc != want_crc:
                return (f"{path} is {got_size} bytes with crc32c {got_crc}, but its writer reported "
                        f"{num_bytes if num_bytes >= 0 else '?'} bytes with crc32c {want_crc}")
            return None
        seen = identities.get(filename)
        if seen is not None and seen == storage.identity(path) and num_bytes in (-1, int(seen.split(":")[2])):
            return None
        try:
            got_sha, got_size = staging.sha256_and_size(path)
        except OSError as e:
            return f"{path} cannot be read ({storage.os_reason(e)})"
        if (num_bytes >= 0 and got_size != num_bytes) or got_sha != sha256:
            return (f"{path} is {got_size} bytes with sha256 {got_sha[:12]}..., but its writer reported "
                    f"{num_bytes if num_bytes >= 0 else '?'} bytes with sha256 {sha256[:12]}...")
        return None

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for problem in pool.map(one, expected):
            if problem:
                raise OutputError(f"refusing to publish {output}: {problem}; it changed after it was written "
                                  f"(damaged, or another process wrote into this build's files); nothing was "
                                  f"published; {rerun_with('resume')} (it writes such a shard again)")


def check_link_sizes(output: str, manifest: Manifest, links: Mapping[str, str]) -> None:
    """Refuses to link an earlier version's shard whose local size is not the one its manifest lists
    (swapped or cut since it was published): a stat each, nothing read.

    Raises:
      OutputError: naming the file.
    """
    if not storage.is_local(output):
        return
    for split in manifest.splits:
        for shard in split.shards:
            origin = links.get(shard.filename)
            if origin is None:
                continue
            size = os.stat(storage.join(output, origin)).st_size
            if size != shard.num_bytes:
                raise OutputError(f"refusing to append to {output}: {storage.join(output, origin)} is {size} bytes, "
                                  f"its manifest says {shard.num_bytes}; it changed after it was published; run "
                                  f"`imagerecords verify {output}`, then restore it or rebuild with {setting('overwrite')}; "
                                  "nothing was published")


def reported_by_writers(results: Any, folder: str, what: str) -> Dict[str, str]:
    """{file name in the manifest: its writer's `what` ("crc32c" or "identity")} for the shards and
    index files of `results` (a publish.BuildResults)."""
    out = {}
    for r in results.shards:
        if getattr(r, what):
            out[f"{folder}/{r.filename}"] = getattr(r, what)
        if r.index_file and getattr(r, f"index_{what}"):
            out[f"{folder}/{r.index_file}"] = getattr(r, f"index_{what}")
    return out
