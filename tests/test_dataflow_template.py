"""Dataflow as far as it can be proven offline: DataflowRunner stages a classic template against
the GCS emulator; the staged package and the job graph are checked (no job is submitted)."""

import io
import json
import os
import tarfile
import uuid

import pytest

from tests.support.gcs import GcsEmulator

pytestmark = pytest.mark.gcs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_dataflow_classic_template_stages_package_and_graph(image_tree, fake_gcs_server):
    from apache_beam.portability.api import beam_runner_api_pb2

    from imagerecords.cli.launcher import run

    root, _ = image_tree
    bucket = f"df-{uuid.uuid4().hex[:8]}"
    with GcsEmulator(binary=fake_gcs_server) as emulator:
        emulator.create_bucket(bucket)
        emulator.upload(str(root / "circle" / "circle_000.jpg"), f"gs://{bucket}/images/circle/circle_000.jpg")
        with emulator.activated():
            result = run(["--input", f"gs://{bucket}/images", "--output", f"gs://{bucket}/ds", "--num_shards", "4",
                          "--runner=DataflowRunner", "--project=imagerecords-test", "--region=europe-west4",
                          f"--temp_location=gs://{bucket}/tmp", f"--staging_location=gs://{bucket}/staging",
                          f"--template_location=gs://{bucket}/templates/build.json",
                          f"--setup_file={REPO}/setup.py", "--machine_type=n2-standard-8", "--max_num_workers=4"])
        assert result is None  # a template was staged: nothing built, nothing published
        template = json.loads(emulator.download(f"gs://{bucket}/templates/build.json"))
        staged = emulator.list(f"gs://{bucket}/staging/")
        package = emulator.download(next(u for u in staged if u.endswith("workflow.tar.gz")))
        graph = emulator.download(next(u for u in staged if u.endswith("pipeline.pb")))
        assert not emulator.list(f"gs://{bucket}/ds/"), "a template run must not build anything"
    options = template["environment"]["sdkPipelineOptions"]["options"]
    assert options["region"] == "europe-west4" and options["setup_file"].endswith("setup.py")
    assert options["machine_type"] == "n2-standard-8" and options["max_num_workers"] == 4
    with tarfile.open(fileobj=io.BytesIO(package)) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {"setup.py", "imagerecords/builder/engines/beam/graph.py", "imagerecords/pipeline/publish/commit.py", "imagerecords/transforms/write_shards.py"} <= names
    pipeline = beam_runner_api_pb2.Pipeline.FromString(graph)
    stages = {t.unique_name for t in pipeline.components.transforms.values()}
    # The job ends in the commit (WriteDataset's step): run from the template, it publishes itself.
    for stage in ("ReadImages", "AssignLabels", "GlobalShuffle/GroupByShard", "WriteShards/Write", "RecordResults/Write",
                  "Commit"):
        assert stage in stages, (stage, sorted(stages)[:40])
