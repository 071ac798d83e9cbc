"""The launcher's planning at scale: list, assign and plan N manifest rows as the local engine does, no shard written.

Usage:
    python -m benchmarks.bench_scale --manifest rows.csv --json plan.json

Prints (and writes) the wall time of each step and the process's peak RSS (getrusage maxrss), with
the RSS before listing as the base, so (peak - base) / rows is what the launcher holds per row.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import resource
import sys
import tempfile
import time


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 1e6


def plan_only(manifest: str) -> dict:
    """Lists, assigns and plans `manifest` with the local engine's own functions; returns the figures."""
    from imagerecords.pipeline import sources
    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.builder.engines import local
    from imagerecords.pipeline.plan import assign as assign_lib
    from imagerecords.pipeline import refs as refs_lib
    from imagerecords.pipeline.refs import Rejected
    from imagerecords.pipeline.read import array_files as arrays

    with open(manifest, encoding="utf-8") as f:
        header = f.readline().rstrip("\r\n")
    config = BuildConfig.of(input=manifest, output=tempfile.mkdtemp(prefix="imagerecords-plan-"))
    base = _rss_mb()
    t0 = time.perf_counter()
    refs, rejected = [], 0
    workers = local._auto_workers()
    # The engine lists a manifest's byte ranges in its forked workers; so does this pass.
    pool = concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork"))
    info = sources.InputInfo("csv", tuple(header.split(",")), header)
    for pair in local.list_inputs(config, info, pool, workers):
        if isinstance(pair[1], Rejected):
            rejected += 1
        else:
            refs.append(pair)
    pool.shutdown()
    t1 = time.perf_counter()
    labels = refs_lib.vocabulary(sorted({r.label for _, r in refs}), arrays.label_type(config), config.labels.label_offset)
    kept = 0
    for h, ref in refs:  # in place, as the engine assigns
        out = assign_lib.assign(ref, labels, None, config.split.split_seed)
        if not isinstance(out, Rejected):
            refs[kept] = (h, out)
            kept += 1
    del refs[kept:]
    t2 = time.perf_counter()
    rows = len(refs)
    shards = local.plan(config, refs)
    t3 = time.perf_counter()
    keys = shards.keys()
    for key in keys:  # each shard's members, as the engine makes them to hand each to its writer
        shards.take(key)
    t4 = time.perf_counter()
    # ru_maxrss is in KiB, and Linux updates it lazily: the RSS now can be a few pages above it.
    # ...and below an RSS read earlier (the base): every reading seen is a lower bound of the peak.
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6, _rss_mb(), base)
    return {"rows": rows, "workers": workers, "rejected": rejected, "shards": len(keys), "list_s": t1 - t0, "assign_s": t2 - t1,
            "plan_s": t3 - t2, "take_s": t4 - t3, "total_s": t4 - t0, "base_rss_mb": base, "peak_rss_mb": peak,
            "bytes_per_row": (peak - base) * 1e6 / max(rows, 1)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--manifest", required=True, help="a CSV manifest with path,label,key columns")
    p.add_argument("--json", help="write the figures here")
    a = p.parse_args(argv)
    figures = plan_only(a.manifest)
    print(json.dumps(figures, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(figures, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
