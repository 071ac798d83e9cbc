"""`verify` and `inspect`: what a published dataset holds and whether the files agree with it."""

from __future__ import annotations

import os
from typing import List, Tuple

from imagerecords import errors
from imagerecords.manifest import LOCK, MANIFEST, STAGING, Manifest, ManifestError, no_manifest_hint, unfinished_hint


def _is_local(path: str) -> bool:
    return "://" not in path


def _join(folder: str, name: str) -> str:
    return os.path.join(folder, name) if _is_local(folder) else folder.rstrip("/") + "/" + name


def _read(path: str) -> bytes:
    if _is_local(path):
        with open(path, "rb") as f:
            return f.read()
    from imagerecords import publish

    return publish.read_bytes(path)


def _names(folder: str) -> List[str]:
    if _is_local(folder):
        try:
            return sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
    from imagerecords import publish

    names = set(publish.list_names(folder))
    if publish.list_tree(publish.staging_dir(folder)):
        names.add(STAGING)
    return sorted(names)


def load(output: str) -> Manifest:
    """Reads `output`'s manifest for the command line.

    Raises:
      errors.UnfinishedBuild: no manifest, but a staging area (says how to finish or clear it).
      errors.InputError: no manifest at all, or an unreadable one.
    """
    path = _join(output, MANIFEST)
    names = _names(output)
    if MANIFEST not in names:
        if STAGING in names:
            raise errors.UnfinishedBuild(unfinished_hint(output))
        raise errors.InputError(no_manifest_hint(output))
    try:
        return Manifest.loads(_read(path), path)
    except ManifestError as e:
        raise errors.InputError(str(e)) from None


def _folder_problems(output: str, manifest: Manifest) -> Tuple[List[str], List[str]]:
    """Files in the folder that are not the published dataset's: (problems: unlisted shards and
    temporary files, which a shard glob would pick up; notes: a staging area or a lock, which no
    reader sees)."""
    problems, notes = [], []
    listed = set(manifest.shard_files())
    for name in _names(output):
        if name in listed:
            continue
        if name == STAGING:
            notes.append(f"{_join(output, STAGING)}: leftover staging area of an unfinished or failed build "
                            "(remove it, or rebuild with --overwrite)")
        elif name == LOCK:
            from imagerecords import publish

            holder = publish.read_lock(output)
            state = "stale lock of" if holder and holder.is_dead_here() else "lock held by"
            notes.append(f"{_join(output, LOCK)}: {state} {holder.describe() if holder else 'an unknown build'}")
        elif ".tfrecord" in name or name.endswith((".index", ".tmp")):
            problems.append(f"{_join(output, name)}: not listed in {MANIFEST} (not part of the published dataset)")
    return problems, notes


def verify(output: str, records: bool = False) -> Tuple[List[str], List[str]]:
    """Returns (problems, notes) comparing `output` with its manifest; no problems = verified.

    Problems: a shard missing, of another size or sha256 (or, with `records`, a bad CRC or count),
    a missing index file, a shard-like file the manifest does not list. Notes: a leftover staging
    area or a lock in the folder (no reader sees them).

    Args:
      output: the dataset folder.
      records: also parse every record and check both CRCs and the record counts.

    Raises:
      errors.BuildError: when there is no readable manifest.
    """
    from apache_beam.io.filesystems import FileSystems

    from imagerecords.records import CorruptRecordError, HashingReader, read_records

    manifest = load(output)
    problems = []
    names = set(_names(output))
    for split in manifest.splits:
        for shard in split.shards:
            path = _join(output, shard.filename)
            if shard.filename not in names:
                problems.append(f"{path}: missing")
                continue
            count = 0
            with FileSystems.open(path) as f:  # streamed: a shard can be hundreds of MB
                stream = HashingReader(f)
                if records:
                    try:
                        count = sum(1 for _ in read_records(stream, path))
                    except CorruptRecordError as e:
                        problems.append(str(e))
                        count = None
                stream.drain()
            if stream.num_bytes != shard.num_bytes:
                problems.append(f"{path}: {stream.num_bytes} bytes, manifest says {shard.num_bytes}")
            elif stream.sha256() != shard.sha256:
                problems.append(f"{path}: sha256 differs from the manifest")
            elif records and count is not None and count != shard.count:
                problems.append(f"{path}: {count} records, manifest says {shard.count}")
            if shard.index_file and shard.index_file not in names:
                problems.append(f"{_join(output, shard.index_file)}: missing")
    extra, notes = _folder_problems(output, manifest)
    return problems + extra, notes


def inspect(output: str) -> Tuple[List[str], List[str]]:
    """Returns (lines describing the dataset, problems) from the manifest and one folder listing;
    imports neither TensorFlow nor Beam for a local folder.

    Raises:
      errors.BuildError: when there is no readable manifest.
    """
    manifest = load(output)
    names = set(_names(output))
    lines = [f"{manifest.name}: schema {manifest.schema}, {len(manifest.label_names)} labels, offset "
             f"{manifest.label_offset}, seed {manifest.seed}, built {manifest.created}"]
    problems = []
    for split in manifest.splits:
        missing = [s.filename for s in split.shards if s.filename not in names]
        lines.append(f"  {split.name}: {split.num_examples} records in {len(split.shards)} shards, "
                     f"{split.num_bytes / 1e6:.1f} MB")
        problems.extend(f"{_join(output, m)}: missing" for m in missing)
    lines.append(f"  rejected: {manifest.num_rejected}, skipped: {manifest.num_skipped} (see {manifest.errors_file})")
    names_shown = ", ".join(manifest.label_names[:20]) + (" ..." if len(manifest.label_names) > 20 else "")
    lines.append(f"  labels: {names_shown}")
    return lines, problems
