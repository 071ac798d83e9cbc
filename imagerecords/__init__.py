"""imagerecords: folders or manifests of images to reproducible sharded TFRecords, and back."""

__version__ = "0.1.0"


__all__ = ["build_arrays", "finish", "run"]


def __getattr__(name):
    # Lazy: `import imagerecords.reader` in a trainer must not import the builder.
    if name in ("run", "finish"):
        from imagerecords.cli import launcher

        return getattr(launcher, name)
    if name == "build_arrays":
        from imagerecords.build.arrays import build_arrays

        return build_arrays
    raise AttributeError(f"module 'imagerecords' has no attribute {name!r}")
