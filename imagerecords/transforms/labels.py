"""AssignLabels: the label vocabulary, label ids and split names of every ImageRef."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple, Union

import apache_beam as beam

from imagerecords.pipeline.publish import appending
from imagerecords.pipeline.plan import assign as assign_lib
from imagerecords.pipeline import refs as refs_lib
from imagerecords.pipeline.refs import ImageRef, LabelMap, Rejected
from imagerecords.transforms.common import REJECTED

__all__ = ["AssignLabels"]

def _assign(ref: ImageRef, labels: LabelMap, splits: Optional[Sequence[Tuple[str, float]]],
            split_seed: int) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
    out = assign_lib.assign(ref, labels, splits, split_seed)
    yield beam.pvalue.TaggedOutput(REJECTED, out) if isinstance(out, Rejected) else out


class AssignLabels(beam.PTransform):
    """Sets each ref's split and label id.

    Labels map through `label_map` when given, else through the vocabulary of every label listed
    (sorted names, or integers taken as they are).

    Input: ImageRef (from a source).
    Outputs: 'refs' (ImageRef with split and label_id set), REJECTED (Rejected: a split name or
    label that cannot be used) and 'labels' (a singleton LabelMap, the side input of WriteShards).

    Args:
      label_map: fixed ids (refs.read_label_map); None for the vocabulary of the labels seen.
      label_type: 'name', 'int' or 'auto' (int when every label is an integer).
      label_offset: added to every id.
      splits: ((split name, fraction), ...) assigned by a salted hash of each key; None keeps each
        ref's split ('train' when it has none).
      split_seed: the salt of that hash.
      features: the declared features (class_list features get their vocabularies here).
      base_labels: appending to a published dataset: its ids stay, new names get ids after them
        (appending.grow_labels; class lists by appending.grow_lists).
    """

    def __init__(
        self,
        label_map: Optional[LabelMap] = None,
        label_type: str = "auto",
        label_offset: int = 0,
        splits: Optional[Sequence[Tuple[str, float]]] = None,
        split_seed: int = 0,
        features: Sequence = (),
        base_labels: Optional[LabelMap] = None,
    ):
        super().__init__()
        if label_type not in ("auto", "name", "int"):
            raise ValueError(f"AssignLabels: label_type {label_type!r} is not auto, name or int")
        self._label_map = label_map
        self._label_type = label_type
        self._offset = label_offset
        self._splits = tuple(splits) if splits else None
        self._split_seed = split_seed
        self._features = tuple(features)
        self._base = base_labels
        if base_labels is not None and label_map is not None:  # a declared list must extend the published one
            self._label_map = appending.grow_labels(base_labels, (), label_map)

    def expand(self, refs):
        if self._label_map is not None:
            labels = refs.pipeline | "LabelMap" >> beam.Create([self._label_map])
        else:
            labels = (
                refs
                | "Label" >> beam.Map(lambda r: r.label)
                | "Distinct" >> beam.Distinct()
                | "Collect" >> beam.combiners.ToList()
                # [label, ...] in arbitrary order; vocabulary() and grow_labels() sort.
                | "Vocabulary" >> (beam.Map(refs_lib.vocabulary, self._label_type, self._offset) if self._base is None
                                   else beam.Map(lambda seen, base: appending.grow_labels(base, seen), self._base))
            )
        if any(f.dtype == "class_list" for f in self._features):
            names = (refs
                     | "ListNames" >> beam.FlatMap(lambda r, fs: refs_lib.list_names(r.extras, fs), self._features)
                     | "DistinctNames" >> beam.Distinct()
                     | "CollectNames" >> beam.combiners.ToList())
            lists = refs_lib.with_lists if self._base is None else appending.grow_lists
            labels = labels | "ListVocabularies" >> beam.Map(lists, self._features, beam.pvalue.AsSingleton(names))
        out = refs | "Assign" >> beam.FlatMap(
            _assign, beam.pvalue.AsSingleton(labels), self._splits, self._split_seed
        ).with_output_types(ImageRef).with_outputs(REJECTED, main="refs")
        return {"refs": out.refs, REJECTED: out[REJECTED], "labels": labels}
