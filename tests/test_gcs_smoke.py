"""Smoke tests: Beam and TensorFlow against a real GCS emulator.

They need fake-gcs-server, which the ``fake_gcs_server`` fixture fetches on first
use (``.ci/get_gcs_emulator.sh``); they skip only when it cannot be fetched.
Select or deselect them with ``-m gcs`` / ``-m "not gcs"``.
"""

from __future__ import annotations

import hashlib
import posixpath
import uuid

import pytest

from tests.support.gcs import GcsEmulator, beam_pipeline_options, storage_client

pytestmark = pytest.mark.gcs

INPUTS = {
    "alpha.txt": b"first line\nsecond line\n",
    "beta.txt": "caf\u00e9 \u2615\n".encode("utf-8"),
    "gamma.txt": b"no trailing newline",
}


@pytest.fixture(scope="module")
def emulator(fake_gcs_server):
    with GcsEmulator(binary=fake_gcs_server) as running:
        yield running


@pytest.fixture
def bucket(emulator):
    """A fresh bucket with INPUTS under ``input/`` plus one non-matching file."""
    name = f"smoke-{uuid.uuid4().hex[:12]}"
    emulator.create_bucket(name)
    for filename, content in INPUTS.items():
        emulator.upload(content, f"gs://{name}/input/{filename}")
    emulator.upload(b"not a text input", f"gs://{name}/input/skip.bin")
    with emulator.activated():
        yield name


def _summary_line(path: str, content: bytes) -> str:
    return "\t".join(
        [posixpath.basename(path), str(len(content)), hashlib.sha256(content).hexdigest()]
    )


def _write_via_rename(lines, final_path: str) -> str:
    """Write ``lines`` to a temporary object, then rename it into place."""
    from apache_beam.io.filesystems import FileSystems

    temp_path = f"{final_path}.tmp-{uuid.uuid4().hex}"
    with FileSystems.create(temp_path, mime_type="text/plain") as handle:
        for line in sorted(lines):
            handle.write(line.encode("utf-8") + b"\n")
    FileSystems.rename([temp_path], [final_path])
    return final_path


def test_pipeline_match_read_and_rename_output(emulator, bucket):
    import apache_beam as beam
    from apache_beam.io import fileio

    output = f"gs://{bucket}/output/summary.tsv"
    with beam.Pipeline(options=beam_pipeline_options()) as pipeline:
        _ = (
            pipeline
            | fileio.MatchFiles(f"gs://{bucket}/input/*.txt")
            | fileio.ReadMatches()
            | beam.Map(lambda readable: _summary_line(readable.metadata.path, readable.read()))
            | beam.combiners.ToList()
            | beam.Map(_write_via_rename, output)
        )

    expected = "".join(
        _summary_line(name, content) + "\n" for name, content in sorted(INPUTS.items())
    ).encode("utf-8")
    assert emulator.download(output) == expected
    # The rename (copy + delete) left no temporary object behind.
    assert emulator.list(f"gs://{bucket}/output/") == [output]


def test_read_from_text_and_write_to_text(emulator, bucket):
    import apache_beam as beam

    prefix = f"gs://{bucket}/upper/part"
    with beam.Pipeline(options=beam_pipeline_options()) as pipeline:
        _ = (
            pipeline
            | beam.io.ReadFromText(f"gs://{bucket}/input/*.txt")
            | beam.Map(str.upper)
            | beam.io.WriteToText(prefix, file_name_suffix=".txt", shard_name_template="")
        )

    expected_lines = sorted(
        line.upper()
        for content in INPUTS.values()
        for line in content.decode("utf-8").splitlines()
    )
    # WriteToText writes temporary shards and renames them in a batch request.
    assert emulator.list(f"gs://{bucket}/upper/") == [f"{prefix}.txt"]
    written = emulator.download(f"{prefix}.txt").decode("utf-8")
    assert sorted(written.splitlines()) == expected_lines
    assert written.endswith("\n")


def test_filesystems_operations(emulator, bucket):
    from apache_beam.io.filesystems import FileSystems

    base = f"gs://{bucket}/fs"
    payload = bytes(range(256)) * 4096  # 1 MiB, binary

    with FileSystems.create(f"{base}/a.bin") as handle:
        handle.write(payload)
    assert FileSystems.exists(f"{base}/a.bin")
    with FileSystems.open(f"{base}/a.bin") as handle:
        assert handle.read() == payload

    FileSystems.copy([f"{base}/a.bin"], [f"{base}/copy.bin"])
    FileSystems.rename([f"{base}/a.bin"], [f"{base}/renamed.bin"])
    assert not FileSystems.exists(f"{base}/a.bin")

    (match,) = FileSystems.match([f"{base}/*.bin"])
    sizes = {m.path: m.size_in_bytes for m in match.metadata_list}
    assert sizes == {f"{base}/copy.bin": len(payload), f"{base}/renamed.bin": len(payload)}
    assert emulator.download(f"{base}/renamed.bin") == payload

    FileSystems.delete([f"{base}/copy.bin", f"{base}/renamed.bin"])
    assert emulator.list(f"{base}/") == []


def test_compose_and_rewrite(emulator, bucket):
    """Server-side operations, through a client built as application code would."""
    gcs_bucket = storage_client().bucket(bucket)
    sources = [gcs_bucket.blob(f"input/{name}") for name in sorted(INPUTS)]

    composed = gcs_bucket.blob("composed/all.txt")
    composed.compose(sources)
    assert emulator.download(f"gs://{bucket}/composed/all.txt") == b"".join(
        INPUTS[name] for name in sorted(INPUTS)
    )

    rewritten = gcs_bucket.blob("composed/copy.txt")
    token, _, _ = rewritten.rewrite(sources[0])
    while token is not None:
        token, _, _ = rewritten.rewrite(sources[0], token=token)
    assert emulator.download(f"gs://{bucket}/composed/copy.txt") == INPUTS["alpha.txt"]


@pytest.mark.slow
def test_tensorflow_gfile_and_tfrecords(emulator, bucket, tmp_path):
    tf = pytest.importorskip("tensorflow", reason="TensorFlow's own GCS filesystem is what this test checks")

    records = [b"record-%d" % i for i in range(5)] + [bytes(range(256))]
    local = tmp_path / "local.tfrecord"
    with tf.io.TFRecordWriter(str(local)) as writer:
        for record in records:
            writer.write(record)

    # Read what another client uploaded.
    emulator.upload(local, f"gs://{bucket}/tf/uploaded.tfrecord")
    assert tf.io.gfile.exists(f"gs://{bucket}/input/alpha.txt")
    with tf.io.gfile.GFile(f"gs://{bucket}/input/beta.txt", "rb") as handle:
        assert handle.read() == INPUTS["beta.txt"]
    assert sorted(tf.io.gfile.glob(f"gs://{bucket}/input/*.txt")) == [
        f"gs://{bucket}/input/{name}" for name in sorted(INPUTS)
    ]
    dataset = tf.data.TFRecordDataset(f"gs://{bucket}/tf/uploaded.tfrecord")
    assert [record.numpy() for record in dataset] == records

    # Write through TensorFlow and check the exact bytes.
    with tf.io.TFRecordWriter(f"gs://{bucket}/tf/written.tfrecord") as writer:
        for record in records:
            writer.write(record)
    assert emulator.download(f"gs://{bucket}/tf/written.tfrecord") == local.read_bytes()

    tf.io.gfile.rename(
        f"gs://{bucket}/tf/written.tfrecord", f"gs://{bucket}/tf/renamed.tfrecord"
    )
    assert emulator.list(f"gs://{bucket}/tf/") == [
        f"gs://{bucket}/tf/renamed.tfrecord",
        f"gs://{bucket}/tf/uploaded.tfrecord",
    ]
