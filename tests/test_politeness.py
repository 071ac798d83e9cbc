"""--http_per_host for a whole Beam job (read/politeness.py): each downloader's share never lets the
job's downloaders together pass the setting (exactly from whole slots, at the 99.9th percentile
of the time from a paced fraction of one), the downloaders are counted from the runner's options
(conservatively where they do not say), and a paced Downloader keeps a real server busy no more
than its duty."""

import math
import threading
import time

import pytest

from support.web import Server, jpeg
from imagerecords.pipeline.read import download, politeness


@pytest.mark.parametrize("per_host,downloaders", [(4, 1), (4, 2), (4, 3), (4, 4), (5, 2), (1024, 1000),
                                                  (4, 5), (4, 8), (2, 4), (1, 2), (4, 1000), (64, 100),
                                                  (256, 1000), (4, 1_000_000)])
def test_each_downloaders_share_keeps_the_job_within_the_setting(per_host, downloaders):
    slots, duty = politeness.share(per_host, downloaders)
    if duty == 1.0:  # whole slots: the job's sum is bounded outright, and no slot is left unused past one each
        assert 1 <= slots and slots * downloaders <= per_host < (slots + 1) * downloaders
        return
    assert slots == 1 and per_host < downloaders
    # Independent downloaders, each busy `duty` of the time: the number at once is Binomial(D, duty).
    assert politeness.binomial_cdf(per_host, downloaders, duty) >= politeness.PERCENTILE
    assert politeness.binomial_cdf(per_host, downloaders, duty * 1.01) < politeness.PERCENTILE  # and no stingier
    assert downloaders * duty < per_host


def test_the_binomial_tail_is_the_exact_one():
    for n, p, k in [(10, 0.3, 3), (50, 0.02, 2), (7, 0.9, 6), (1, 0.5, 0), (3, 0.5, 5)]:
        exact = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(min(k, n) + 1))
        assert politeness.binomial_cdf(k, n, p) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("args,expected", [
    (["--direct_num_workers=3"], 3),
    (["--runner=DirectRunner", "--direct_num_workers=1"], 1),
    (["--runner=PrismRunner", "--direct_num_workers=2"], 2),  # DirectRunner's engine: one machine, not unknown
    (["--runner=FlinkRunner", "--parallelism=6", "--sdk_worker_parallelism=2"], 6),
    (["--runner=FlinkRunner"], download.MAX_CONNECTIONS),  # the cluster's default is not known here
    (["--runner=DataflowRunner", "--max_num_workers=10", "--machine_type=n1-standard-4",
      "--number_of_worker_harness_threads=2"], 80),
    (["--runner=DataflowRunner", "--max_num_workers=10", "--machine_type=n2-custom-8-32768",
      "--experiments=no_use_multiple_sdk_containers"], 10 * 1 * politeness.DATAFLOW_THREADS),
    (["--runner=DataflowRunner", "--num_workers=5", "--autoscaling_algorithm=NONE"],
     5 * politeness.UNKNOWN_VCPUS * politeness.DATAFLOW_THREADS),
    (["--runner=DataflowRunner"], politeness.DATAFLOW_MAX_VMS * politeness.UNKNOWN_VCPUS * politeness.DATAFLOW_THREADS),
    (["--runner=SparkRunner"], download.MAX_CONNECTIONS),
])
def test_downloaders_are_counted_from_the_runner_options(args, expected):
    from apache_beam.options.pipeline_options import PipelineOptions

    assert politeness.count(PipelineOptions(args))[0] == expected


def test_a_manifest_source_on_a_runner_gets_its_share():
    from apache_beam.options.pipeline_options import PipelineOptions

    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.pipeline.sources.manifests import ManifestSource

    bound = ManifestSource().bind(BuildConfig.of(input="in.csv", output="out", http_per_host=4))
    whole = politeness.divide(bound, PipelineOptions(["--runner=FlinkRunner", "--parallelism=2"]))._http
    assert (whole.per_host, whole.duty) == (2, 1.0)
    paced = politeness.divide(bound, PipelineOptions(["--runner=FlinkRunner", "--parallelism=40"]))._http
    assert paced.per_host == 1 and 0 < paced.duty < 4 / 40
    assert bound._http.per_host == 4 and bound._http.duty == 1.0  # the local engine's is untouched


def test_a_paced_downloader_keeps_a_host_busy_at_most_its_duty():
    duty, n = 0.4, 6
    with Server({f"p{i}.jpg": jpeg(i) for i in range(n)}, delay=0.03) as server:
        downloader = download.Downloader(download.HttpSettings(per_host=1, duty=duty), None)
        got, started = {}, time.monotonic()
        threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, downloader(server.url(f"/img/p{i}.jpg"))))
                   for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        took = time.monotonic() - started
        assert len(got) == n, "a paced download never finished"
        assert server.max_in_flight == 1
        # n requests of d seconds, with (n - 1) pauses of d * (1 / duty - 1) between them.
        assert server.busy_s / took <= n / (n + (n - 1) * (1 / duty - 1)) + 0.05, (server.busy_s, took)
