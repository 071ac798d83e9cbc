"""NumPy array inputs (an .npz, or a folder of .npy files): rows of image, label and feature columns
(imagerecords.pipeline.read.array_files reads and encodes them; array_rows is the columnar fast path)."""

from __future__ import annotations

from typing import Iterable, Optional

from imagerecords.pipeline.read import array_files as arrays
from imagerecords.pipeline.sources.base import InputInfo, Listed, Source


class ArraysSource(Source):
    kind = "arrays"
    unit = "rows"

    def claims(self, path: str) -> bool:
        return arrays.is_arrays_input(path)

    def check(self, config, *, ignore_split_column: bool = False) -> InputInfo:
        arrays.check_input(config.input, config.schema, config.image.image_encoding)
        return InputInfo("arrays")

    def folder(self, path: str) -> Optional[str]:
        return path  # a folder of .npy files holds nothing else

    def list_part(self, config, info: InputInfo, part: None) -> Iterable[Listed]:
        return arrays.list_refs(config.input, config.schema, config.image.image_encoding)

    def beam_listing(self, config, info: InputInfo, transforms):
        return transforms.ReadArrays(config.input, config.schema, config.image.image_encoding)

    def identity(self, path: str) -> str:
        return arrays.input_identity(path)

    def label_type(self, config) -> str:
        return arrays.label_type(config)

    def prepare(self, config) -> None:
        arrays.forget_if_changed(config.input)
        arrays.open_arrays(config.input)  # before the fork: the workers share the launcher's copy of an .npz
