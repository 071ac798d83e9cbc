# Custom SDK container for Dataflow (--sdk_container_image) and Flink (--environment_type=DOCKER):
# the Beam Python SDK image of the pinned Beam version with the builder (imagerecords[gcp]: Beam's
# gcp extra, Pillow, PyYAML, google-crc32c) installed at the exact versions CI tested
# (constraints.txt), checked for conflicts at build time. Build workers never import TensorFlow,
# so the image does not ask for it.
ARG BEAM_VERSION=2.62.0
FROM apache/beam_python3.11_sdk:${BEAM_VERSION}

WORKDIR /opt/imagerecords
COPY setup.py README.md constraints.txt ./
COPY imagerecords ./imagerecords
COPY configs ./configs

# One layer: install, then fail the build if any installed requirement conflicts or a builder
# module does not import.
RUN pip install --no-cache-dir -c constraints.txt '.[gcp]' \
    && pip check \
    && python -c "import imagerecords.cli.launcher, imagerecords.builder.engines.beam; print('imagerecords OK')"

# The SDK harness boot program stays the entry point (inherited from the base image).
# For warm Flink worker pools, run the sidecar with the command
#   python -m imagerecords.builder.engines.beam.worker_pool --port 50000 --warm   (docs/flink.md)
