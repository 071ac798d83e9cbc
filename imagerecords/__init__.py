"""imagerecords: folders or manifests of images to reproducible sharded TFRecords, and back.

The library face (each name imported on first use, so `import imagerecords` stays light):
  build(input, output, **settings)  builds and publishes a dataset; returns its Manifest
  build_arrays(arrays, output, ...)  the same from NumPy arrays in memory
  finish(output)                     publishes a build whose launcher did not commit it
  BuildOptions, Progress             the validated options of a build; what a progress callback gets
  Error                              the base of every expected failure
  run(argv)                          the `imagerecords build` command line, as a call
"""

import importlib

__version__ = "0.1.0"


__all__ = ["BuildOptions", "Error", "Progress", "build", "build_arrays", "finish", "run"]

# name: (module, attribute); the module is imported when the name is first used.
_LAZY = {
    "build": ("imagerecords.builder.session", "build"),
    "finish": ("imagerecords.builder.session", "finish"),
    "build_arrays": ("imagerecords.builder.memory_arrays", "build_arrays"),
    "BuildOptions": ("imagerecords.builder.options", "BuildOptions"),
    "Progress": ("imagerecords.builder.options", "Progress"),
    "Error": ("imagerecords.format.errors", "Error"),
    "run": ("imagerecords.cli.launcher", "run"),
}


def __getattr__(name):
    # Lazy: `import imagerecords.reader` in a trainer must not import the builder.
    if name in _LAZY:
        module, attribute = _LAZY[name]
        return getattr(importlib.import_module(module), attribute)
    raise AttributeError(f"module 'imagerecords' has no attribute {name!r}")
