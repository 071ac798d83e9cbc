"""One shard's files: the shard writer, the record stream, shard members and rows, fingerprints, side files."""
