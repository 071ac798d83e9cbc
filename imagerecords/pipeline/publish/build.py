"""One build as every engine and the graph take it: its settings, id, the library versions its
manifest records, the label map it was given and, with --append, the published dataset it extends;
results.json's header is made from it."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Mapping, Optional

from imagerecords.pipeline.config import BuildConfig
from imagerecords.pipeline.publish import appending
from imagerecords.pipeline.publish import results as results_lib
from imagerecords.pipeline.refs import LabelMap


@dataclasses.dataclass(frozen=True)
class Build:
    """A build's value, made once by its launcher (or by WriteDataset) and handed down whole.

    Attributes:
      config: what to build.
      build_id: the launcher's build id; '' when it is named as the job runs (WriteDataset).
      versions: the library versions the manifest records (publish.commit.versions).
      label_map: the ids of config's label_map file, read by the launcher; None for the vocabulary seen.
      base: with --append, the published dataset (appending.load_base): its keys, labels and hashes.
    """

    config: BuildConfig
    build_id: str
    versions: Mapping[str, str]
    label_map: Optional[LabelMap] = None
    base: Optional[appending.Base] = None

    def header(self) -> Dict[str, Any]:
        """What results.json says of this build besides its shards and rows (publish.results.header)."""
        return results_lib.header(self.config, build_id=self.build_id, versions=self.versions,
                                  base=self.base.manifest.to_json() if self.base is not None else None)
