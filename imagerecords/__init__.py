"""imagerecords: folders or manifests of images to reproducible sharded TFRecords, and back."""

__version__ = "0.1.0"
