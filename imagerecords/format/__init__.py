"""The dataset format, shared by the builder and every reader: record framing, Examples, manifest.json."""
