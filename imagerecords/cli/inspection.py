"""`verify` and `inspect`: what a published dataset holds and whether the files agree with it."""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

from imagerecords.format import side_files

from imagerecords.format import access, files, schema
from imagerecords.format import features as features_lib
from imagerecords.format import manifest as manifest_lib
from imagerecords.format.errors import NotRegularFile
from imagerecords.format.manifest import LOCK, MANIFEST, STAGING, VERSION_PREFIX, Manifest, ManifestError
from imagerecords.format.paths import has_scheme
from imagerecords.format import record_format
from imagerecords.format.record_format import FRAME_OVERHEAD, is_shard_name
from imagerecords.format.records import CorruptRecordError, HashingReader
from imagerecords.pipeline import errors, storage
from imagerecords.pipeline import lock as output_lock
from imagerecords.pipeline.storage import join, open_read
from imagerecords.pipeline.write import dataset_files


def _open(path: str):
    """A dataset's own file opened to read: locally only a regular file (files.open_local), so a
    FIFO or /dev/zero put in its place is a problem named, not a hang or a read without end."""
    return files.open_local(path) if not has_scheme(path) else open_read(path)


def _ends_differ(path: str, shard, fmt) -> bool:
    """The format's ends_differ of the shard file at `path` against the manifest's Shard.ends_crc."""
    with _open(path) as f:
        def read_range(offset: int, length: int) -> bytes:
            f.seek(offset)
            return f.read(length)

        return fmt.ends_differ(read_range, shard.num_bytes, shard.ends_crc)


def _read_bytes(path: str) -> bytes:
    with _open(path) as f:
        return f.read()


def _names(folder: str) -> List[str]:
    if not has_scheme(folder):
        try:
            return sorted(os.listdir(folder))
        except (FileNotFoundError, NotADirectoryError):
            return []
    # One delimited listing: files and folders of `folder`, never the shards inside the folders.
    files, folders = storage.list_folder(folder)
    return sorted(set(files) | {f for f in folders if f == STAGING or f.startswith(VERSION_PREFIX)})


def _present(output: str, manifest: Manifest) -> set:
    """Names (relative to `output`) of the files there and in the version folders the manifest lists
    (an appended dataset's earlier shards stay in their own folder)."""
    names = set(_names(output))
    folders = {manifest.version} | {v for folders in manifest.listed_folders.values() for v in folders}
    for folder in sorted(f for f in folders if f and f != manifest_lib.FLAT_LAYOUT):
        names.update(f"{folder}/{n}" for n in _names(join(output, folder)))
    return names


def load(output: str, check_features: bool = True) -> Manifest:
    """Reads `output`'s manifest for the command line (manifest.load; `check_features`: see there).

    Raises:
      errors.UnfinishedBuild: no manifest, but a staging area (says how to finish or clear it).
      errors.InputError: no manifest at all, or an unreadable one.
    """
    names = _names(output)

    def read(path: str) -> bytes:
        if MANIFEST not in names:  # one listing says it, on gs:// too
            raise FileNotFoundError(path)
        return _read_bytes(path)

    def size(path: str) -> int:
        if MANIFEST not in names:
            raise FileNotFoundError(path)
        return files.local_size(path) if not has_scheme(path) else storage.size(path)

    try:
        # The side files too (a columnar split's histograms): verify checks them, the report uses them.
        return manifest_lib.load(output, read, lambda _: STAGING in names, details=True,
                                 check_features=check_features, size=size)
    except manifest_lib.NotPublished as e:
        raise (errors.UnfinishedBuild if e.unfinished else errors.InputError)(str(e)) from None
    except (ManifestError, NotRegularFile) as e:
        raise errors.InputError(str(e)) from None


def load_for_report(output: str) -> Manifest:
    """load for the report, which shows each feature's problem on its page: a feature spec the
    readers refuse is read, not refused."""
    return load(output, check_features=False)


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
            notes.append(f"{join(output, STAGING)}: leftover staging area of an unfinished or failed build "
                            "(remove it, or rebuild with --overwrite)")
        elif name == LOCK:
            holder = output_lock.read_lock(output)
            state = "stale lock of" if holder and holder.is_dead_here() else "lock held by"
            notes.append(f"{join(output, LOCK)}: {state} {holder.describe() if holder else 'an unknown build'}")
        elif name in manifest.listed_folders.get(manifest.version, ()) and name != manifest.version:
            notes.append(f"{join(output, name)}: holds shards of the published version (appended by a release "
                         "before whole version folders; the next --append makes one folder whole)")
        elif (name.startswith(VERSION_PREFIX) or name in manifest.previous_versions) and name != manifest.version:
            notes.append(f"{join(output, name)}: an earlier version, kept for readers that loaded its manifest "
                         "(--keep_versions)")
        elif is_shard_name(name) or name.endswith((".index", ".tmp")):
            problems.append(f"{join(output, name)}: not listed in {MANIFEST} (not part of the published dataset)")
    if manifest.version:
        for name in _names(join(output, manifest.version)):
            relative = f"{manifest.version}/{name}"
            if relative not in listed and (is_shard_name(name) or name.endswith((".index", ".tmp"))):
                problems.append(f"{join(output, relative)}: not listed in {MANIFEST} (not part of the published "
                                "dataset)")
    # A stray index file reaches no shard glob, but a reader pairing sorted index and shard lists
    # (DALI's index_path) would read the wrong offsets with it.
    index_folder = f"{manifest.version}/{dataset_files.INDEX_DIR}" if manifest.version else dataset_files.INDEX_DIR
    index_dir = join(output, index_folder)
    for name in _names(index_dir):
        relative = f"{index_folder}/{name}"
        if relative not in listed and not os.path.isdir(os.path.join(index_dir, name)):
            problems.append(f"{join(output, relative)}: not listed in {MANIFEST} (an index of no published shard)")
    return problems, notes


def _index_problems(output: str, shard, frame_lengths: Optional[List[int]]) -> List[str]:
    """Problems of one shard's index file: missing, or failing the one index loader's checks
    against the manifest (sha256, lines, count, end), or (given the shard's frame lengths, read
    with --records) entries that do not match its frames."""
    path = join(output, shard.index_file)
    try:
        data = _read_bytes(path)
    except NotRegularFile as e:
        return [str(e)]
    except OSError:  # FileNotFoundError locally; BeamIOError (an IOError) on remote filesystems
        return [f"{path}: missing"]
    got, found = record_format.index_problems(data, path, count=shard.count, num_bytes=shard.num_bytes,
                                        sha256=shard.index_sha256)
    problems = [f"{path}: {problem}" for problem in found]
    if frame_lengths is None or not got:
        return problems
    at = 0
    for line, ((offset, length), frame) in enumerate(zip(got, frame_lengths), 1):
        if (offset, length) != (at, frame):
            problems.append(f"{path}: line {line} says offset {offset} length {length}; record {line} of "
                            f"{shard.filename} is at {at} with {frame} bytes")
            break
        at += frame
    return problems


def _record_problem(record: bytes, stored) -> Optional[str]:
    """Why a record does not hold what the manifest's feature spec says, or None."""
    values = schema.parse_example(record)
    for feature in stored:
        problem = features_lib.stored_problem(feature, values.get(feature.name))
        if problem:
            return problem
    return None


def verify(output: str, records: bool = False) -> Tuple[List[str], List[str]]:
    """Returns (problems, notes) comparing `output` with its manifest; no problems = verified.

    Problems: a shard missing, of another size or sha256 (or, with `records`, a bad CRC or count),
    an index file missing, of another sha256 (or, with `records`, not matching its shard's frames),
    a shard-like or index file the manifest does not list. Notes: a leftover staging
    area or a lock in the folder (no reader sees them).

    Args:
      output: the dataset folder.
      records: also parse every record, check both CRCs and the record counts, and check that
        each record holds every feature of the manifest's spec with its kind and shape.

    Raises:
      errors.BuildError: when there is no readable manifest.
    """
    manifest = load(output)
    fmt = record_format.of(manifest)
    problems, keys_notes = [], []
    names = _present(output, manifest)
    stored = features_lib.stored(manifest) if records else ()
    for split in manifest.splits:
        for shard in split.shards:
            path = join(output, shard.filename)
            if shard.filename not in names:
                problems.append(f"{path}: missing")
                continue
            count = 0
            frame_lengths = None  # with records: each frame's length, to check the index against
            try:
                opened = _open(path)
            except NotRegularFile as e:
                problems.append(str(e))
                continue
            with opened as f:  # streamed: a shard can be hundreds of MB
                stream = HashingReader(f)
                if records:
                    frame_lengths = []
                    checking = True  # the first record per shard that does not fit the spec is named
                    try:
                        for number, record in enumerate(fmt.read(stream, path)):
                            frame_lengths.append(len(record) + FRAME_OVERHEAD)
                            problem = _record_problem(record, stored) if checking else None
                            if problem:
                                problems.append(f"{path}: record {number}: {problem}")
                                checking = False
                        count = len(frame_lengths)
                    except CorruptRecordError as e:
                        problems.append(str(e))
                        count = None
                else:  # the frame headers, walked while the file is hashed: a count not the frames' is named
                    count = fmt.count(stream)
                stream.drain()
            if stream.num_bytes != shard.num_bytes:
                # The readers' own phrase (they refuse such a file when they open it), with what to do.
                problems.append(f"{access.size_mismatch(path, stream.num_bytes, shard.num_bytes)}; {access.SHARD_MEND}")
            elif stream.sha256() != shard.sha256:
                problems.append(f"{path}: sha256 differs from the manifest")
            elif shard.ends_crc and _ends_differ(path, shard, fmt):
                # The readers compare these on open: a manifest whose ends_crc was changed makes them refuse the shard.
                problems.append(f"{path}: its first or last record's checksum differs from manifest.json's ends_crc "
                                "(every reader refuses it)")
            elif count is not None and count != shard.count:
                problems.append(f"{path}: {count} records, manifest says {shard.count}")
            if shard.index_file:
                problems.extend(_index_problems(output, shard, frame_lengths))
            if shard.keys_sha256:
                keys_notes.extend(_keys_notes(output, shard))
    extra, notes = _folder_problems(output, manifest)
    return problems + extra, notes + keys_notes


def _keys_notes(output: str, shard) -> List[str]:
    """A shard's keys file that is missing or not the one its build wrote: no reader uses it, but the
    next --append reads the shard instead (a note, not a problem)."""
    path = side_files.keys_path(output, shard.filename)
    if path is None:
        return []
    try:
        data = _read_bytes(path)
    except NotRegularFile as e:
        return [str(e)]
    except OSError:
        return [f"{path}: missing (the next --append reads {shard.filename} instead)"]
    if not side_files.keys_file_is_the_builds(data, shard):
        return [f"{path}: sha256 differs from the manifest (the next --append reads {shard.filename} instead)"]
    return []


def inspect(output: str) -> Tuple[List[str], List[str]]:
    """Returns (lines describing the dataset, problems) from the manifest and one folder listing;
    imports neither TensorFlow nor Beam for a local folder.

    Raises:
      errors.BuildError: when there is no readable manifest.
    """
    manifest = load(output)
    names = _present(output, manifest)
    lines = [f"{manifest.name}: schema {manifest.schema}, {len(manifest.label_names)} labels, offset "
             f"{manifest.label_offset}, seed {manifest.seed}, built {manifest.created}"]
    if manifest.version:
        lines.append(f"  version: {manifest.version} (its shards: {join(output, manifest.version)})")
    if manifest.record_format != record_format.DEFAULT:
        lines.append(f"  record format: {manifest.record_format}")
    problems = []
    for split in manifest.splits:
        missing = [s.filename for s in split.shards if s.filename not in names]
        lines.append(f"  {split.name}: {split.num_examples} records in {len(split.shards)} shards, "
                     f"{split.num_bytes / 1e6:.1f} MB")
        problems.extend(f"{join(output, m)}: missing" for m in missing)
    lines.append(f"  rejected: {manifest.num_rejected}, skipped: {manifest.num_skipped} (see {manifest.errors_file})")
    names_shown = ", ".join(manifest.label_names[:20]) + (" ..." if len(manifest.label_names) > 20 else "")
    lines.append(f"  labels: {names_shown}")
    if features_lib.declared_only(manifest) and schema.keys(manifest.schema).image not in manifest.features:
        lines.append("  images: none (the records hold the features below only)")
    elif features_lib.raw_pixels_shape(features_lib.stored_image(manifest)):
        lines.append("  images: --image_encoding raw (uint8 pixels as the arrays held them, no codec)")
    elif manifest.image_encoding != "jpeg":
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(manifest.image_kinds.items()))
        lines.append(f"  images: --image_encoding {manifest.image_encoding} ({kinds or 'no records'})")
    if manifest.features:
        for feature in features_lib.specs_from_json(manifest.features):
            lines.append(f"  feature {feature.name}: {features_lib.describe(feature)}")
    return lines, problems


def spec(output: str, kind: str) -> str:
    """The parse spec of `output`'s records for another reader: 'tf' (tf.io.parse_example), 'tfrecord'
    (the PyTorch `tfrecord` package's description) or 'dali' (fn.readers.tfrecord's features)."""
    return features_lib.spec_code(features_lib.stored(load(output)), kind)


def _split(output: str, split: str):
    """(manifest, split) of the published dataset; an unknown split is one line naming the splits."""
    manifest = load(output)
    try:
        return manifest, manifest.split(split)
    except KeyError as e:
        raise errors.UsageError(f"{output}: {e.args[0]}") from None


def shard_files(output: str, split: str) -> List[str]:
    """The paths of the shards of `split` the published manifest lists, in shard order: what a
    script hands a reader that takes a file list."""
    _, found = _split(output, split)
    return [join(output, shard.filename) for shard in found.shards]


def shard_glob(output: str, split: str) -> str:
    """The glob matching exactly the published version's shards of `split` (no other version,
    split, index file or staged file): `OUT/<version>/<name>-<split>.tfrecord-*`."""
    manifest, found = _split(output, split)
    own = f"{manifest.version}/" if manifest.version else ""
    if any(not shard.filename.startswith(own) or "/" in shard.filename[len(own):] for shard in found.shards):
        raise errors.UsageError(f"{output}: no one glob matches split {found.name!r}: its shards lie in several "
                                "version folders (appended before version folders were whole); list them with "
                                f"--files {found.name}, or rebuild with --overwrite")
    pattern = f"{record_format.of(manifest).shard_prefix(manifest.name, found.name)}-*"
    return join(output, manifest.version, pattern) if manifest.version else join(output, pattern)
