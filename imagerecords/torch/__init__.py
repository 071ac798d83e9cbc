"""PyTorch reader: a map-style dataset over the index files, a global seeded order, exact and elastic resume.

Needs the `torch` extra (`pip install -e '.[torch]'` in the checkout); never imports TensorFlow.
"""

from imagerecords.torch.dataset import INDEX_POLICIES, LAYOUTS, MissingIndexError, RecordDataset, load_manifest
from imagerecords.torch.loader import Loader
from imagerecords.torch.order import PAD_LABEL, REMAINDER_POLICIES, GlobalBatchSampler, Ticket, permutation
from imagerecords.torch.transforms import CenterCrop, RandomResizedCrop, decode

__all__ = ["CenterCrop", "GlobalBatchSampler", "INDEX_POLICIES", "LAYOUTS", "Loader", "MissingIndexError", "PAD_LABEL",
           "REMAINDER_POLICIES", "RandomResizedCrop", "RecordDataset", "Ticket", "decode", "load_manifest",
           "permutation"]
