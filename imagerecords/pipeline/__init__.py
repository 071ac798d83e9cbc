"""The build: the graph (build_pipeline), the launcher (run, finish) and the `imagerecords` command."""

__all__ = ["build_pipeline", "finish", "run"]


def __getattr__(name):
    # Lazy, so that the command line starts (and quiets library chatter) before Beam is imported.
    if name == "build_pipeline":
        from imagerecords.pipeline import graph

        return graph.build_pipeline
    if name in ("run", "finish"):
        from imagerecords.pipeline import launcher

        return getattr(launcher, name)
    raise AttributeError(f"module 'imagerecords.pipeline' has no attribute {name!r}")
