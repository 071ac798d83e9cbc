"""ReadArrays: the rows of an arrays input (imagerecords.pipeline.read.array_files) become ImageRefs or
rejected rows."""

from __future__ import annotations

from typing import Iterable, Union

import apache_beam as beam
from apache_beam.metrics import Metrics

from imagerecords.pipeline.errors import BuildError
from imagerecords.pipeline.refs import ImageRef, Rejected
from imagerecords.pipeline.read import array_files as arrays
from imagerecords.transforms.common import METRICS_NAMESPACE, REJECTED

__all__ = ["ReadArrays"]


class _RowsFn(beam.DoFn):
    def __init__(self, preset: str, image_encoding: str):
        self._preset = preset
        self._image_encoding = image_encoding
        self._listed = Metrics.counter(METRICS_NAMESPACE, "listed")

    def process(self, path: str) -> Iterable[Union[ImageRef, beam.pvalue.TaggedOutput]]:
        for item in arrays.list_refs(path, self._preset, self._image_encoding):
            self._listed.inc()
            yield beam.pvalue.TaggedOutput(REJECTED, item) if isinstance(item, Rejected) else item


class ReadArrays(beam.PTransform):
    """Lists one ref per row of an .npz or a folder of .npy files (keys `<name>:<row, 9 digits>`).

    Input: the pipeline's begin (`p | ReadArrays(path)`).
    Outputs: 'refs' (ImageRef; its uri names the array row, read when its shard is written) and
    REJECTED (Rejected: a label that cannot be a class).

    Args:
      path: an .npz file or a folder of .npy files (local or FileSystems URI).
      preset: the Example schema ('tfds' or 'tf-models') whose keys the arrays feed.
      image_encoding: how a uint8 image array is stored ('png', lossless, unless 'jpeg' is asked for).

    Raises:
      ValueError: naming the path when it is not an arrays input or is ambiguous (checked here, so
        a pipeline built without the command never lists a wrong folder).
    """

    def __init__(self, path: str, preset: str = "tfds", image_encoding: str = "png"):
        super().__init__()
        if not arrays.is_arrays_input(path):
            raise ValueError(f"ReadArrays: {path!r} is not an .npz file or a folder of .npy files")
        try:  # the launcher's checks, for a pipeline built without it: an ambiguous folder never lists
            arrays.check_input(path, preset, image_encoding)
        except BuildError as e:
            raise ValueError(f"ReadArrays: {e}") from None
        self._path = path
        self._fn = _RowsFn(preset, image_encoding)

    def expand(self, pbegin):
        return (pbegin
                | "Path" >> beam.Create([self._path])
                | "Rows" >> beam.ParDo(self._fn).with_output_types(ImageRef).with_outputs(REJECTED, main="refs"))
