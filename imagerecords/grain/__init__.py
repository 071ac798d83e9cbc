"""Grain reader: a random-access source over one split's index files, every stored feature as NumPy.

Needs the `grain` extra (`pip install -e '.[grain]'` in the checkout); never imports TensorFlow, Beam or torch.
"""

from imagerecords.format.access import INDEX_POLICIES, MissingIndexError
from imagerecords.grain.source import RecordSource

__all__ = ["INDEX_POLICIES", "MissingIndexError", "RecordSource"]
