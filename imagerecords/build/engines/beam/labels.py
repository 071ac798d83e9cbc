"""AssignLabels: the label vocabulary, label ids and split names of every ImageRef."""

from __future__ import annotations

from typing import Iterable, Optional, Sequence, Tuple, Union

import apache_beam as beam

from imagerecords.build import refs as refs_lib
from imagerecords.build import stages
from imagerecords.build.refs import ImageRef, LabelMap, Rejected
from imagerecords.build.engines.beam.common import REJECTED

__all__ = ["AssignLabels"]

def _assign(ref: ImageRef, labels: LabelMap, splits: Optional[Sequence[Tuple[str, float]]],
            split_seed: int) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
    out = stages.assign(ref, labels, splits, split_seed)
    yield beam.pvalue.TaggedOutput(REJECTED, out) if isinstance(out, Rejected) else out


class AssignLabels(beam.PTransform):
    """Sets each ref's split and label id.

    Labels map through `label_map` when given, else through the vocabulary of every label listed
    (sorted names, or integers taken as they are). Outputs: 'refs' (ImageRef), REJECTED and
    'labels' (a single LabelMap).
    """

    def __init__(
        self,
        label_map: Optional[LabelMap] = None,
        label_type: str = "auto",
        label_offset: int = 0,
        splits: Optional[Sequence[Tuple[str, float]]] = None,
        split_seed: int = 0,
        features: Sequence = (),
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

    def expand(self, refs):
        if self._label_map is not None:
            labels = refs.pipeline | "LabelMap" >> beam.Create([self._label_map])
        else:
            labels = (
                refs
                | "Label" >> beam.Map(lambda r: r.label)
                | "Distinct" >> beam.Distinct()
                | "Collect" >> beam.combiners.ToList()
                # [label, ...] in arbitrary order; vocabulary() sorts.
                | "Vocabulary" >> beam.Map(refs_lib.vocabulary, self._label_type, self._offset)
            )
        if any(f.dtype == "class_list" for f in self._features):
            names = (refs
                     | "ListNames" >> beam.FlatMap(lambda r, fs: refs_lib.list_names(r.extras, fs), self._features)
                     | "DistinctNames" >> beam.Distinct()
                     | "CollectNames" >> beam.combiners.ToList())
            labels = labels | "ListVocabularies" >> beam.Map(refs_lib.with_lists, self._features,
                                                             beam.pvalue.AsSingleton(names))
        out = refs | "Assign" >> beam.FlatMap(
            _assign, beam.pvalue.AsSingleton(labels), self._splits, self._split_seed
        ).with_output_types(ImageRef).with_outputs(REJECTED, main="refs")
        return {"refs": out.refs, REJECTED: out[REJECTED], "labels": labels}
