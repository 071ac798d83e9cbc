"""Smoke test of the standalone Flink cluster alone (a Java job), so a cluster problem shows apart
from a Beam one; the Beam build on Flink is tested in test_flink_build.py."""


import pytest

from conftest import skip_unless_ci
from tests.support import flink

pytestmark = pytest.mark.flink


@pytest.fixture
def cluster():
    """A fresh JobManager + TaskManager, stopped (and its temp dir removed) after the test."""
    if not flink.java_available():
        skip_unless_ci("no Java runtime: the Flink tests need Java 11+ on PATH or JAVA_HOME")
    reason = flink.flink_unavailable_reason()
    if reason:
        skip_unless_ci(reason)
    with flink.FlinkCluster.start() as running:
        yield running


def test_cluster_runs_a_java_job(cluster):
    assert [tm["slotsNumber"] for tm in cluster.taskmanagers()] == [2]

    assert cluster.run_probe_job() == sum(2 * n for n in range(100))

    finished = cluster.finished_jobs()
    assert len(finished) == 1
    assert finished[0]["tasks"]["failed"] == 0
