"""The public Beam PTransforms of imagerecords: compose them in any pipeline, on any runner.

    ReadImages(root)          class-folder tree      -> ImageRef          (+ REJECTED)
    ReadManifest(path, ...)   CSV / JSONL manifest   -> ImageRef          (+ REJECTED)
    ReadArrays(path)          .npz / folder of .npy  -> ImageRef          (+ REJECTED)
    ListSource(source, ...)   any registered input kind (pipeline.sources) -> ImageRef (+ REJECTED)
    AssignLabels(...)         ImageRef -> ImageRef with split and label id (+ REJECTED, 'labels')
    GlobalShuffle(seed, ...)  ImageRef -> (ShardKey, [ImageRef in hash order]) (+ 'plans')
    WriteShards(output, labels, ...)  shard groups -> ShardResult, staged (+ REJECTED, CONTENTS, NEAR)
    WriteDataset(output, **options)   the user's dict rows -> a published dataset (its Manifest)

Rejected inputs go to the output tagged REJECTED (a Rejected with its reason), never dropped.
"""

from imagerecords.transforms import coders  # noqa: F401  (registers ImageRefCoder before any graph is built)

from imagerecords.transforms.listing import ListSource, ReadImages, ReadManifest
from imagerecords.transforms.array_rows import ReadArrays
from imagerecords.transforms.labels import AssignLabels
from imagerecords.transforms.shuffle import GlobalShuffle
from imagerecords.transforms.write_shards import WriteShards
from imagerecords.transforms.write_dataset import WriteDataset
from imagerecords.transforms.beam_sink import WriteWithBeamSink
from imagerecords.transforms.duplicates import FindDuplicates
from imagerecords.transforms.near_duplicates import FindNearDuplicates
from imagerecords.transforms.results import RecordResults
from imagerecords.transforms.common import REJECTED

__all__ = ["ReadImages", "ReadManifest", "ReadArrays", "ListSource", "AssignLabels", "GlobalShuffle", "WriteShards", "WriteDataset",
           "WriteWithBeamSink", "FindDuplicates", "FindNearDuplicates",
           "RecordResults", "REJECTED"]
