# Custom SDK container for Dataflow (--sdk_container_image) and Flink (--environment_type=DOCKER):
# the Beam Python SDK image of the pinned Beam version with imagerecords and its pinned
# dependencies installed, checked for conflicts at build time.
ARG BEAM_VERSION=2.62.0
FROM apache/beam_python3.11_sdk:${BEAM_VERSION}

WORKDIR /opt/imagerecords
COPY setup.py README.md ./
COPY imagerecords ./imagerecords
COPY configs ./configs

# One layer: install, then fail the build if any installed requirement conflicts.
RUN pip install --no-cache-dir . \
    && pip check \
    && python -c "import imagerecords.pipeline, imagerecords.reader; print('imagerecords OK')"

# The SDK harness boot program stays the entry point (inherited from the base image).
