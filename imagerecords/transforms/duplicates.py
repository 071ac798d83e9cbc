"""FindDuplicates: written images whose source files hold identical bytes under different keys."""

from __future__ import annotations

from typing import Iterable, Tuple

import apache_beam as beam

from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import DuplicateGroup

__all__ = ["FindDuplicates"]


def _group(item: Tuple[bytes, Iterable[Tuple[str, str, str, str]]]) -> Iterable[DuplicateGroup]:
    group = refs_lib.duplicate_group(*item)
    if group is not None:
        yield group


class FindDuplicates(beam.PTransform):
    """Consumes (16-byte content digest, (key, split, uri, label name)) per written image; outputs
    one DuplicateGroup per content shared by more than one key (duplicates, split leakage and label
    conflicts).

    Only 16 bytes, the key, its path and its (interned) label travel per image; a group's members
    are sorted, so the output does not depend on grouping order.
    """

    def expand(self, contents):
        return (
            contents
            | "ByContent" >> beam.GroupByKey()
            # (digest, [(key, split, uri, label name)])
            | "Groups" >> beam.FlatMap(_group)
        )
