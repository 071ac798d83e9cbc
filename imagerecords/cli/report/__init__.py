"""`imagerecords report`: one self-contained HTML page showing what a published dataset holds.

sample.py reads the shards (values.py decodes declared features), extras.py the errors and duplicates
files, render.py makes the page (markup.py its building blocks, render_features.py the feature views),
cli.py is the command.
"""

from imagerecords.format.manifest import DUPLICATES
from imagerecords.cli.report.cli import (DEFAULT_MAX_CLASSES, DEFAULT_PER_CLASS, DEFAULT_SAMPLE, LoadManifest, default_html,
                                     main, write_report)
from imagerecords.cli.report.extras import (Extras, FeatureRow, ReasonGroup, read_duplicates, read_errors, read_extras,
                                            read_features)
from imagerecords.cli.report.render import render
from imagerecords.cli.report.sample import THUMB_SIDE, Sample, Thumb, histogram, sample_split, thumbnail

__all__ = [
    "DEFAULT_MAX_CLASSES", "DEFAULT_PER_CLASS", "DEFAULT_SAMPLE", "DUPLICATES", "THUMB_SIDE",
    "Extras", "FeatureRow", "LoadManifest", "ReasonGroup", "Sample", "Thumb",
    "default_html", "histogram", "main", "read_duplicates", "read_errors", "read_extras", "read_features", "render",
    "sample_split", "thumbnail", "write_report",
]
