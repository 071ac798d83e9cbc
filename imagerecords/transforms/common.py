"""What the transforms share: the metrics namespace, the rejected tag, FileSystems helpers."""

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

METRICS_NAMESPACE = "imagerecords"
REJECTED = "rejected"


def read_bytes(uri: str) -> bytes:
    """Reads a whole file through Beam FileSystems (local, gs://, s3://...), uncompressed."""
    with FileSystems.open(uri, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return f.read()


def write_bytes(uri: str, data: bytes) -> None:
    """Writes a small file through a temporary name and a rename, so readers never see half."""
    tmp = f"{uri}.tmp"
    with FileSystems.create(tmp, mime_type="application/octet-stream", compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)
    FileSystems.rename([tmp], [uri])
