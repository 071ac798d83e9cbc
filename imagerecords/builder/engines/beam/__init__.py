"""The Beam engine: build_pipeline wires the public transforms (imagerecords.transforms); runner runs it."""
