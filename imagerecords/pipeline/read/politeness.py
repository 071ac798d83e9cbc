"""--http_per_host divided among the downloaders a job runs at once, so that it holds for the whole
build and not per downloader (docs/building.md, "Politeness").

A downloader is one download.Downloader: one per shard writer on a Beam runner (a DoFn instance,
one bundle at a time). With D of them and a budget of N requests at once per host:
- N >= D: each may hold floor(N / D) requests to a host at once; D * floor(N / D) <= N always.
- N < D: each holds at most one, and only a `duty` share of its time: after a request of d seconds
  its next one to that host waits d * (1 / duty - 1). Downloaders that do not talk to each other
  are each busy with the host at a moment with chance <= duty, so the number at once is at most
  Binomial(D, duty); duty is the largest whose PERCENTILE is within N (the mean, D * duty, lies
  below N). The requests per second to the host are then about D * duty / (a request's seconds).

How many downloaders a Beam job runs at once is read from its runner's options (count):
- DirectRunner, and PrismRunner (its engine since Beam 2.68, on this machine alone): --direct_num_workers
  (each worker runs one bundle at a time, in any running mode), else this machine's CPUs.
- FlinkRunner: --parallelism (each subtask runs one bundle at a time; --sdk_worker_parallelism only
  says how many processes serve them, not how many bundles run). Not given: UNKNOWN.
- DataflowRunner: VMs x SDK processes per VM x threads per process: --max_num_workers (or
  --num_workers with --autoscaling_algorithm=NONE; else DATAFLOW_MAX_VMS, the service's cap) x the
  vCPUs of --machine_type (one SDK process each; 1 with --experiments=no_use_multiple_sdk_containers;
  a type not named with its vCPUs: UNKNOWN_VCPUS) x --number_of_worker_harness_threads (else
  DATAFLOW_THREADS).
- Any other runner: UNKNOWN.
Where the options do not say, the count assumed is larger than such a job runs (conservative: each
downloader's share is then smaller than it could be, never larger).
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import NamedTuple, Tuple

from imagerecords.pipeline.read import download

# The share of the time the requests at once to one host, cluster-wide, stay within --http_per_host
# where it has to be split finer than one request per downloader.
PERCENTILE = 0.999


class Share(NamedTuple):
    """One downloader's share of --http_per_host: `slots` requests at once to a host, each busy for
    at most `duty` of the time (1.0: unpaced)."""

    slots: int
    duty: float


def share(per_host: int, downloaders: int) -> Share:
    """One downloader's share of `per_host` requests at once when `downloaders` run at once."""
    if downloaders <= 1 or per_host >= downloaders:
        return Share(max(1, per_host // max(downloaders, 1)), 1.0)
    low, high = 0.0, per_host / downloaders  # the mean alone would allow this much; the tail allows less
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if binomial_cdf(per_host, downloaders, mid) >= PERCENTILE else (low, mid)
    return Share(1, low)


def binomial_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (n up to millions)."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for i in range(min(k, n) + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p
                          + (n - i) * log_q)
    return min(total, 1.0)


UNKNOWN = download.MAX_CONNECTIONS  # as many downloaders as one host could be asked to serve at once
DATAFLOW_MAX_VMS = 1000  # the most VMs Dataflow's autoscaling gives a batch job
DATAFLOW_THREADS = 12  # Dataflow's threads per Python SDK process where it picks them
UNKNOWN_VCPUS = 16  # more than Dataflow's default machine types have


def count(options) -> Tuple[int, str]:
    """(downloaders the job runs at once, the options it was read from, in words)."""
    # Beam: 1.2 s to import; every build imports this module, only a Beam one has these options
    from apache_beam.options.pipeline_options import (DebugOptions, DirectOptions, FlinkRunnerOptions,
                                                      StandardOptions, WorkerOptions)

    runner = str(options.view_as(StandardOptions).runner or "DirectRunner").lower()
    if "direct" in runner or "prism" in runner:  # Prism is DirectRunner's engine since Beam 2.68: one machine
        workers = options.view_as(DirectOptions).direct_num_workers
        return (workers if workers > 0 else os.cpu_count() or 1), "DirectRunner's --direct_num_workers"
    if "flink" in runner:
        parallelism = options.view_as(FlinkRunnerOptions).parallelism
        if parallelism and parallelism > 0:
            return parallelism, "Flink's --parallelism"
        return UNKNOWN, "assumed: --parallelism not given"
    if "dataflow" in runner:
        worker = options.view_as(WorkerOptions)
        debug = options.view_as(DebugOptions)
        vms = worker.max_num_workers or (worker.num_workers if worker.autoscaling_algorithm == "NONE" else None)
        one_process = "no_use_multiple_sdk_containers" in (debug.experiments or [])
        vcpus = 1 if one_process else _vcpus(worker.machine_type or "")
        threads = debug.number_of_worker_harness_threads or DATAFLOW_THREADS
        return ((vms or DATAFLOW_MAX_VMS) * vcpus * threads,
                "Dataflow's --max_num_workers x vCPUs x --number_of_worker_harness_threads")
    return UNKNOWN, f"assumed: {runner} is not a runner whose workers this build can count"


def _vcpus(machine_type: str) -> int:
    """vCPUs of a Compute Engine machine type: n1-standard-8, e2-highcpu-16, n2-custom-4-16384."""
    found = re.search(r"custom-(\d+)-\d+$", machine_type) or re.search(r"-(\d+)$", machine_type)
    return int(found.group(1)) if found else UNKNOWN_VCPUS


def divide(source, options):
    """`source` with its downloads' per-host limit divided among the job's downloaders."""
    downloaders, how = count(options)
    divided = source.shared_by(downloaders)
    if divided is not source:
        logging.info("--http_per_host divided among %d downloaders (%s)", downloaders, how)
    return divided

