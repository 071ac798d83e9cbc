"""ListRows: the rows of an arrays input (imagerecords.build.arrays) become ImageRefs or rejected rows."""

from __future__ import annotations

from typing import Iterable, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from imagerecords.build import arrays
from imagerecords.build.refs import ImageRef, Rejected
from imagerecords.build.engines.beam.common import METRICS_NAMESPACE, REJECTED

__all__ = ["ListRows"]


class _RowsFn(beam.DoFn):
    def __init__(self, preset: str, image_encoding: str):
        self._preset = preset
        self._image_encoding = image_encoding
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, path: str) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        for item in arrays.list_refs(path, self._preset, self._image_encoding):
            self._listed.inc()
            yield beam.pvalue.TaggedOutput(REJECTED, item) if isinstance(item, Rejected) else item


class ListRows(beam.PTransform):
    """Lists one ref per row of an .npz or a folder of .npy files (keys `<name>:<row, 9 digits>`).

    Outputs: refs (ImageRef) and REJECTED (Rejected: a label that cannot be a class).
    """

    def __init__(self, path: str, preset: str, image_encoding: str):
        super().__init__()
        if not arrays.is_arrays_input(path):
            raise ValueError(f"ListRows: {path!r} is not an .npz file or a folder of .npy files")
        self._path = path
        self._fn = _RowsFn(preset, image_encoding)

    def expand(self, pbegin):
        return (pbegin
                | "Path" >> beam.Create([self._path])
                | "Rows" >> beam.ParDo(self._fn).with_output_types(ImageRef).with_outputs(REJECTED, main="refs"))
