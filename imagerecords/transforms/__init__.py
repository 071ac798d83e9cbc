"""The build's composite PTransforms, one module per stage of the data flow."""

from imagerecords.transforms import coders  # noqa: F401  (registers ImageRefCoder before any graph is built)

from imagerecords.transforms.listing import ListImages, ReadManifest
from imagerecords.transforms.labels import AssignLabels
from imagerecords.transforms.shuffle import GlobalShuffle
from imagerecords.transforms.write_shards import WriteShards
from imagerecords.transforms.beam_sink import WriteWithBeamSink
from imagerecords.transforms.duplicates import FindDuplicates
from imagerecords.transforms.results import RecordResults

__all__ = ["ListImages", "ReadManifest", "AssignLabels", "GlobalShuffle", "WriteShards", "WriteWithBeamSink", "FindDuplicates",
           "RecordResults"]
