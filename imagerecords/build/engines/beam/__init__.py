"""The build's composite PTransforms, one module per stage of the data flow."""

from imagerecords.build.engines.beam import coders  # noqa: F401  (registers ImageRefCoder before any graph is built)

from imagerecords.build.engines.beam.listing import ListImages, ReadManifest
from imagerecords.build.engines.beam.labels import AssignLabels
from imagerecords.build.engines.beam.shuffle import GlobalShuffle
from imagerecords.build.engines.beam.write_shards import WriteShards
from imagerecords.build.engines.beam.beam_sink import WriteWithBeamSink
from imagerecords.build.engines.beam.duplicates import FindDuplicates
from imagerecords.build.engines.beam.results import RecordResults

__all__ = ["ListImages", "ReadManifest", "AssignLabels", "GlobalShuffle", "WriteShards", "WriteWithBeamSink", "FindDuplicates",
           "RecordResults"]
