"""The build job and the `imagerecords` command line."""

__all__ = ["build_pipeline", "run"]


def __getattr__(name):
    # Lazy, so that the command line starts (and quiets library chatter) before Beam is imported.
    if name in __all__:
        from imagerecords.pipeline import build

        return getattr(build, name)
    raise AttributeError(f"module 'imagerecords.pipeline' has no attribute {name!r}")
