"""imagerecords.build_arrays: a build from NumPy arrays in memory, through a folder of .npy files
(the arrays source) and the library's own build (session.run)."""

from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Mapping, Optional

import numpy as np

from imagerecords.builder import session
from imagerecords.builder.options import BuildOptions
from imagerecords.pipeline.errors import UsageError
from imagerecords.pipeline.read import array_files as arrays_lib


def build_arrays(arrays: Mapping[str, Any], output: str, *, splits: Optional[Mapping[str, float]] = None,
                 seed: int = 0, num_shards: Optional[int] = None, **settings: Any):
    """Builds a dataset from arrays in memory, as `imagerecords build --input FOLDER` does from a
    folder of .npy files (which this writes to a temporary folder named `arrays`, so row i's key
    is `arrays:<i, 9 digits>` and --splits assigns the same rows on every call).

    Example:
        import numpy as np, imagerecords
        manifest = imagerecords.build_arrays({"image": x, "label": y}, "/tmp/ds", splits={"train": 0.9, "test": 0.1})

    Limits: the arrays are written to the temporary folder once (disk space for one copy; memory
    stays the caller's), and the build runs on the local engine (local output only).

    Args:
      arrays: {name: array}; every first dimension is the row count.
      output: a local output folder.
      splits: {split name: fraction}; None puts every row in `train`.
      seed, num_shards: as the flags --seed and --num_shards.
      settings: any other setting of imagerecords.build by name (`overwrite=True`,
        `image_encoding="jpeg"`, `progress=callback`).

    Returns:
      The published manifest (imagerecords.format.manifest.Manifest).

    Raises:
      ValueError: an unknown setting or a bad value.
      imagerecords.Error: an expected failure of the build (errors.BuildError and its subclasses).
    """
    if "://" in output:
        raise UsageError(f"build_arrays writes a local folder; got {output} (use `imagerecords build` with a "
                         "Beam runner for remote output)")
    # The library prints no progress unless given a callback; the command's switch asks for none.
    settings.pop("no_progress", None)
    layers = dict(settings, seed=seed, splits=dict(splits) if splits else None, num_shards=num_shards)
    with tempfile.TemporaryDirectory(prefix="imagerecords-arrays-") as tmp:
        folder = os.path.join(tmp, "arrays")
        os.mkdir(folder)
        for name, value in arrays.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
                raise UsageError(f"array name {name!r}: letters, digits, '_', '.', '-' (it becomes a file name)")
            np.save(os.path.join(folder, f"{name}.npy"), np.asarray(value), allow_pickle=False)
        try:
            return session.run(BuildOptions.make(folder, output, **layers)).manifest
        finally:
            arrays_lib.open_arrays.cache_clear()  # its memory maps point into the folder about to go
            arrays_lib.opened.cache_clear()
