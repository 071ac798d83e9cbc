"""The planning steps of a build as plain functions, importable without Beam: each input listed,
labelled and split, and each shard's refs put in order. The Beam transforms and the local engine
call the same functions, which keeps their shards byte-identical.

    manifest_row     a manifest line -> ImageRef or Rejected          (ReadManifest)
    assign           split and label id of a ref, or Rejected         (AssignLabels)
    shard_order      a shard's refs in hash order                     (GlobalShuffle)
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from imagerecords.pipeline import storage
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import ImageRef, LabelMap, ManifestColumns, Rejected
from imagerecords.pipeline.read import download, input_files

# Listing ------------------------------------------------------------------------------------------


def manifest_row(line: bytes, parse: Callable[[str], Mapping[str, Any]], manifest: str,
                 columns: ManifestColumns, max_file_bytes: Optional[int], stat: bool = True
                 ) -> Optional[Union[ImageRef, Rejected]]:
    """One manifest line as a ref, or the row saying why not; None for a blank line.

    Args:
      line: the line without its line end, as bytes: a line that is not UTF-8 is a rejected row,
        not the end of the build.
      parse: turns the line into a {column: value} row (refs.csv_row_parser(header) or
        refs.parse_jsonl_line); raises ValueError for a malformed line.
      manifest: the manifest's path (relative paths resolve against its folder).
      stat: look up the size of a row without one (a missing file is rejected here); without it a
        missing file is rejected when its shard reads it.
    """
    if not line.strip():
        return None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return Rejected(line.decode("utf-8", "backslashreplace"),
                        f"{manifest}: bad manifest line: not UTF-8 ({e.reason} at byte {e.start})", stage="list",
                        error=type(e).__name__)
    try:
        row = parse(text)
    except ValueError as e:
        return Rejected(text, f"{manifest}: bad manifest line: {input_files.stable_text(str(e))}", stage="list",
                        error=type(e).__name__)
    try:
        ref, rejected = refs_lib.parse_manifest_row(row, _folder_of(manifest), columns)
    except RecursionError:  # a value nested just within the parser's limit, too deep to write back
        return Rejected(text, f"{manifest}: bad manifest line: {refs_lib.DEEP_JSON}", stage="list",
                        error="RecursionError")
    if rejected is not None:
        return rejected
    if ref.size >= 0 or not stat or download.is_url(ref.uri):  # given, skipped, or fetched only by its shard's writer
        size, problem = ref.size, None
    else:
        size, problem = looked_up_size(ref)
    if problem is not None:
        reason, error = problem
        return Rejected(ref.uri, reason, ref.key, ref.split, stage="list", error=error)
    too_big = input_files.size_refusal(size, max_file_bytes)
    if too_big is not None:
        return Rejected(ref.uri, too_big, ref.key, ref.split, stage="read")
    return dataclasses.replace(ref, size=size)


# Relative paths resolve against the manifest's folder: worked out once per manifest, not per row.
_folder_of = functools.lru_cache(maxsize=16)(refs_lib.dirname)


def looked_up_size(ref: ImageRef) -> Tuple[int, Optional[Tuple[str, str]]]:
    """Returns (size, None), or (-1, (reason, error type)) when the file cannot be listed."""
    if storage.is_local(ref.uri):
        # Local: stat only (a FIFO, dangling symlink or folder is a row, never opened).
        found = input_files.probe(ref.uri)
        if found.kind == "file":
            return found.size, None
        if found.kind == "dir":
            return -1, ("a folder, not a file", "")
        return -1, (found.reason, found.error)
    # Beam: 1.2 s to import; only a gs:// (or other remote) path needs its file systems
    from apache_beam.io.filesystem import BeamIOError
    from apache_beam.io.filesystems import FileSystems

    try:
        matched = [m for m in FileSystems.match([ref.uri])[0].metadata_list if m.path == ref.uri]
    except BeamIOError as e:
        return -1, (f"file not found ({input_files.describe_os_error(e)})", type(e).__name__)
    if not matched:
        return -1, ("file not found", "")
    return matched[0].size_in_bytes, None


# Labels and splits --------------------------------------------------------------------------------


def assign(ref: ImageRef, labels: LabelMap, splits: Optional[Sequence[Tuple[str, float]]],
           split_seed: int) -> Union[ImageRef, Rejected]:
    """The ref with its split and label id set, or the row saying why it has none."""
    if splits:
        split = refs_lib.assign_split(splits, split_seed, ref.key)
    else:
        split = ref.split or "train"
    problem = refs_lib.split_name_problem(split)
    if problem:
        return Rejected(ref.uri, problem, ref.key, split, stage="label")
    label_id = labels.label_id(ref.label)
    if label_id is None:
        reason = refs_lib.unknown_label_reason(labels, ref.label)
        return Rejected(ref.uri, reason, ref.key, split, stage="label")
    return ImageRef(ref.key, ref.uri, ref.label, split, ref.size, label_id, ref.extras, ref.row)  # not replace(): 1.6x dearer


# The shuffle --------------------------------------------------------------------------------------


def shard_order(members: Iterable[Tuple[int, ImageRef]]) -> List[ImageRef]:
    """A shard's (shuffle hash, ref) pairs as refs in hash order. The rest of the sort key only
    orders repeats of one key, so which repeat is kept (and which rejected as a duplicate) never
    depends on how the runner grouped them."""
    ordered = sorted(members, key=lambda hr: (hr[0], hr[1].key, hr[1].uri, hr[1].label or "", hr[1].label_id,
                                              hr[1].extras))
    return [r for _, r in ordered]
