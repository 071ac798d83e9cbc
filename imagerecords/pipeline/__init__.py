"""The build job and the `imagerecords` command line."""

from imagerecords.pipeline.build import build_pipeline, run

__all__ = ["build_pipeline", "run"]
