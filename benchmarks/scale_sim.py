"""Internet scale on paper: builds the manifest of N synthetic images and times the commit's and a reader's use of it.

Usage:
    python -m benchmarks.scale_sim --images 10000000,100000000,1000000000 --json sums.json

For each size the script works out the shard count at the default shard size (planning.choose_num_shards),
makes one synthetic shard result per shard (a count, a size, a sha256, a label histogram drawn
uniformly over --classes), turns them into manifest.json with the commit's own steps
(BuildResults.manifest, the commit record, TFDS's metadata files, Manifest.dumps), and loads that
file in a fresh process with the reader's loader (reader.load_info), reporting its wall time and
the RSS it added. A split of --columns_from shards or more is written as columns with its
histograms in a side file (format 3, as the commit does); such a manifest is always built, and where
the histograms would exceed --max_label_pairs (shard, label) pairs each shard gets a one-label
histogram instead (the summed histogram still spans every class; only the side file's size is then
extrapolated). Row-form manifests over --max_label_pairs are not built: their figures are
extrapolated, linearly in shards, from the largest built size, and marked so. Requests the commit makes per file on an object store are counted, and turned into
time with --request_ms (an assumption, printed beside the figure).

    python -m benchmarks.scale_sim --urls --images 10000000,100000000,1000000000 --json urls.json

--urls: the same build from a manifest of http(s) URLs (url,label; no size column). It writes a
real CSV of --sample_rows Open Images-like URLs over --hosts hosts (Zipf --zipf), lists it with the
launcher's own code (sources.check_input, engines.local.list_inputs: no stat and no connection, both
counted) and extrapolates the rate to each size; plans shards by count (choose_num_shards with no
bytes); measures the refs' shuffle bytes with ImageRefCoder over the sample; cuts the sample into
shards of the full size's row count with planning.plan_shards over the real shuffle hashes, and runs
one worker process's downloads over them event by event, with HttpSettings' limits (--http_workers,
and each shard writer's share of --http_per_host among the job's --workers x --writers_per_worker
writers, politeness.share) and urllib3's pool of 64 hosts, at an assumed --latency_ms; and turns the
busiest host's connections and requests per worker into their sum over --workers processes. The commit and a reader are
the file mode's manifest steps at the count-planned shards.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a reader host runs: the loader alone, timed after its imports.
_LOAD = """
import json, sys, time
from imagerecords.reader.info import load_info
def status(field):
    # VmHWM is this process image's peak; ru_maxrss would carry the launcher's peak across exec.
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ':'))
base = status('VmRSS')
start = time.perf_counter()
info = load_info(sys.argv[1])
seconds = time.perf_counter() - start
peak = max(status('VmHWM'), status('VmRSS'))
print(json.dumps({"load_s": seconds, "added_mb": (peak - base) / 1e6,
                  "records": sum(s.num_examples for s in info.splits.values()),
                  "shards": sum(len(s.shards) for s in info.splits.values())}))
"""


def ref_bytes(uri_length: int = 60, ref=None) -> int:
    """Bytes of one ref as the shuffle carries it: the registered ImageRefCoder's encoding of `ref`
    (default: an ImageNet-like gs:// ref), plus its 64-bit shuffle hash (a varint, up to 10 bytes)."""
    from imagerecords.pipeline.refs import ImageRef
    from imagerecords.transforms.coders import ImageRefCoder

    if ref is None:
        uri = "gs://bucket/" + "x" * max(uri_length - 12, 1)
        ref = ImageRef(key=uri[12:], uri=uri, label="n01440764", split="train", size=110_000, label_id=0)
    return len(ImageRefCoder().encode(ref)) + 10


def shard_results(images: int, num_shards: int, image_bytes: int, classes: int, seed: int = 0,
                  one_label: bool = False):
    """One synthetic ShardResult per shard of one 'train' split, sizes as planning cuts them
    (`one_label`: each shard's records all under label `index % classes`, a histogram of one pair)."""
    import numpy as np

    from imagerecords.format.manifest import Shard
    from imagerecords.pipeline.plan import shard_plan as planning
    from imagerecords.pipeline.write.dataset_files import ShardResult

    rng = np.random.default_rng(seed)
    out = []
    for i in range(num_shards):
        count = images * (i + 1) // num_shards - images * i // num_shards
        labels = ()
        if classes and one_label:
            labels = ((i % classes, count),)
        elif classes:
            hist = np.bincount(rng.integers(0, classes, count), minlength=classes)
            ids = np.flatnonzero(hist)
            labels = tuple(zip(ids.tolist(), hist[ids].tolist()))
        name = planning.shard_name("images", "train", i, num_shards)
        out.append(ShardResult("train", Shard(index=i, filename=name, count=count, num_bytes=count * (image_bytes + 16),
                                              sha256=hashlib.sha256(name.encode()).hexdigest(), labels=labels,
                                              passthrough=count)))
    return out


def build_manifest(folder: str, images: int, num_shards: int, image_bytes: int, classes: int,
                   columns_from: Optional[int] = None, one_label: bool = False) -> Dict[str, float]:
    """Writes `folder`/manifest.json (and a columnar split's side file) through the commit's own
    steps; returns their times and sizes."""
    from imagerecords.format.manifest import COLUMNS_FROM, dumps
    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.pipeline.publish import commit as publish
    from imagerecords.pipeline.write import dataset_files

    start = time.perf_counter()
    shards = shard_results(images, num_shards, image_bytes, classes, one_label=one_label)
    made = time.perf_counter()
    names = [f"c{i:05d}" for i in range(max(classes, 1))]
    config = BuildConfig.of(input="gs://bucket/in.csv", output=folder)
    results = publish.BuildResults(
        build_id="20260101-000000-sim", name="images", schema="tfds", seed=0, parameters=config.to_json(),
        versions={"imagerecords": "sim"}, max_reject_fraction=0.01,
        labels={"names": names, "offset": 0, "integer": False}, shards=shards, num_rejected=0, num_skipped=0)
    t0 = time.perf_counter()
    results_json = dumps(results.to_json())  # staging/results.json, which the commit reads back
    t1 = time.perf_counter()
    publish.BuildResults.from_json(json.loads(results_json))
    t2 = time.perf_counter()
    manifest = results.manifest(created="2026-01-01T00:00:00+00:00")
    manifest, side_files = manifest.with_side_files(COLUMNS_FROM if columns_from is None else columns_from)
    record = dumps({"manifest": manifest.to_json(), "build_id": results.build_id})
    t3 = time.perf_counter()
    meta = dataset_files.metadata_files(manifest)
    data = manifest.dumps()
    t4 = time.perf_counter()
    os.makedirs(folder, exist_ok=True)
    for name, content in [*side_files, *meta]:
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "wb") as f:
            f.write(content)
    with open(os.path.join(folder, "manifest.json"), "wb") as f:
        f.write(data)
    t5 = time.perf_counter()
    return {"synthesize_s": made - start, "results_write_s": t1 - t0, "results_read_s": t2 - t1,
            "manifest_and_record_s": t3 - t2, "metadata_and_dumps_s": t4 - t3, "write_s": t5 - t4,
            "commit_manifest_steps_s": (t5 - t4) + (t4 - t2), "results_mb": len(results_json) / 1e6,
            "record_mb": len(record) / 1e6, "manifest_mb": len(data) / 1e6,
            "metadata_mb": sum(len(c) for _, c in meta) / 1e6,
            "side_file_mb": sum(len(c) for _, c in side_files) / 1e6, "columns": bool(side_files),
            "label_pairs": sum(len(r.shard.labels) for r in shards)}


def load_in_reader(folder: str) -> Dict[str, float]:
    """A fresh process loads the manifest with the reader's loader: wall time and RSS it added."""
    out = subprocess.run([sys.executable, "-c", _LOAD, folder], capture_output=True, text=True, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": REPO}, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"loading {folder} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def sums(images: int, image_bytes: int, classes: int, target_shard_mb: float, min_shards: int,
         request_ms: float, parallel_requests: int, sized: bool = True,
         per_ref: Optional[float] = None) -> Dict[str, float]:
    """The figures that need no build: shards, refs through the shuffle, object-store requests.
    `sized` False: the listing knows no size (URL rows), so the plan counts images; `per_ref`: a
    measured ref size (default ref_bytes())."""
    from imagerecords.pipeline.plan import shard_plan as planning

    shards = planning.choose_num_shards(images, images * image_bytes if sized else 0, None, target_shard_mb,
                                        min_shards)
    per_ref = ref_bytes() if per_ref is None else per_ref
    # On an object store the commit, per shard: one check (a metadata read, or today a full read of
    # the shard) and a rename (copy + delete); renames run one after another today.
    renames = 2 * shards
    return {"images": images, "shards": shards, "images_per_shard": images / shards,
            "dataset_tb": images * image_bytes / 1e12, "ref_bytes": per_ref, "shuffle_gb": images * per_ref / 1e9,
            "commit_check_requests": shards, "commit_rename_requests": renames,
            "commit_renames_serial_h": renames * request_ms / 1e3 / 3600,
            "commit_renames_parallel_min": renames * request_ms / 1e3 / parallel_requests / 60,
            "commit_reads_today_tb": images * image_bytes / 1e12}


def simulate(sizes: List[int], image_bytes: int, classes: int, target_shard_mb: float, min_shards: int,
             request_ms: float, parallel_requests: int, max_label_pairs: int, work: Optional[str] = None,
             columns_from: Optional[int] = None, sized: bool = True,
             per_ref: Optional[float] = None) -> List[Dict[str, float]]:
    """Every size's figures; measured where the manifest is built, else extrapolated (marked)."""
    from imagerecords.format.manifest import COLUMNS_FROM

    columns_from = COLUMNS_FROM if columns_from is None else columns_from
    rows = []
    work = work or tempfile.mkdtemp(prefix="imagerecords-scale-")
    measured: Optional[Dict[str, float]] = None
    try:
        for images in sizes:
            row = sums(images, image_bytes, classes, target_shard_mb, min_shards, request_ms, parallel_requests,
                       sized, per_ref)
            expected_pairs = row["shards"] * min(classes, row["images_per_shard"])
            full = expected_pairs <= max_label_pairs
            if full or measured is None or row["shards"] >= columns_from:
                folder = os.path.join(work, f"n{images}")
                row.update(build_manifest(folder, images, row["shards"], image_bytes, classes, columns_from,
                                          one_label=not full and row["shards"] >= columns_from))
                row.update(load_in_reader(folder))
                row["measured"] = True
                if not full and row["shards"] >= columns_from:
                    # The manifest is measured; what holds every histogram (the side file, the
                    # staged results) held one pair per shard, not ~825: extrapolated per shard.
                    row["one_label_histograms"] = True
                    row["label_pairs"] = expected_pairs
                    if measured is not None:
                        scale = row["shards"] / measured["shards"]
                        for key in ("side_file_mb", "results_mb", "label_pairs"):
                            row[key] = measured[key] * scale
                shutil.rmtree(folder, ignore_errors=True)
                if full:
                    measured = row
            else:
                scale = row["shards"] / measured["shards"]
                for key in ("manifest_mb", "results_mb", "record_mb", "metadata_mb", "commit_manifest_steps_s",
                            "load_s", "added_mb", "label_pairs"):
                    row[key] = measured[key] * scale
                row["measured"] = False
                row["extrapolated_from"] = measured["images"]
            rows.append(row)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def table(rows: List[Dict[str, float]], promise_s: float = 5.0, promise_mb: float = 1000.0) -> str:
    lines = [f"{'images':>14} {'shards':>8} {'shuffle GB':>10} {'manifest MB':>12} {'load s':>8} {'load MB':>9} "
             f"{'commit manifest s':>17} {'renames (h serial)':>18}  source"]
    for r in rows:
        verdict = "ok" if r["load_s"] <= promise_s and r["added_mb"] <= promise_mb else "BREAKS the reader promise"
        source = "measured" if r["measured"] else f"extrapolated from {r['extrapolated_from']:,}"
        source += ", columns + side file" if r.get("columns") else ", rows"
        if r.get("one_label_histograms"):
            source += " (side file of one-label histograms)"
        lines.append(f"{r['images']:>14,} {r['shards']:>8,} {r['shuffle_gb']:>10,.1f} {r['manifest_mb']:>12,.1f} "
                     f"{r['load_s']:>8,.2f} {r['added_mb']:>9,.0f} {r['commit_manifest_steps_s']:>17,.2f} "
                     f"{r['commit_renames_serial_h']:>18,.2f}  {source}; {verdict}")
    return "\n".join(lines)


# URLs ---------------------------------------------------------------------------------------------


def write_url_manifest(path: str, rows: int, hosts: int, zipf: float, classes: int, seed: int = 0) -> Dict[str, float]:
    """Writes a CSV manifest (url,label) of `rows` Open Images-like URLs (~63 characters), their
    hosts drawn from `hosts` ranks with Zipf weights 1/rank**`zipf`, labels uniformly over `classes`."""
    import csv

    import numpy as np

    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, hosts + 1) ** zipf
    ranks = rng.choice(hosts, size=rows, p=weights / weights.sum())
    servers = rng.integers(1000, 10000, rows)
    photos = rng.integers(10**9, 10**10, rows)
    secrets = rng.integers(0, 2**32, rows)
    labels = [f"/m/0{np.base_repr(36**3 + i, 36).lower()}" for i in range(max(classes, 1))]
    picks = rng.integers(0, len(labels), rows)
    length = 0
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["url", "label"])
        for rank, server, photo, secret, label in zip(ranks.tolist(), servers.tolist(), photos.tolist(),
                                                      secrets.tolist(), picks.tolist()):
            url = f"https://i{rank % 10}.photo-cdn{rank:04d}.example/{server}/{photo}_{secret:08x}_o.jpg"
            length += len(url)
            w.writerow([url, labels[label]])
    return {"sample_rows": rows, "hosts": hosts, "zipf": zipf, "url_chars": length / rows,
            "manifest_bytes_per_row": os.path.getsize(path) / rows}


def list_urls(path: str) -> Dict[str, object]:
    """Lists the URL manifest as the launcher does (sources.check_input, then the local engine's
    list_inputs: each row parsed by assign_lib.manifest_row, its shuffle hash taken), then assigns
    labels as the engine does; counts the per-row stats and network connections made (both must be 0)."""
    import socket

    from imagerecords.pipeline import sources
    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.builder.engines import local
    from imagerecords.pipeline.plan import assign as assign_lib
    from imagerecords.pipeline import refs as refs_lib
    from imagerecords.pipeline.refs import Rejected
    from imagerecords.pipeline.read import array_files as arrays

    config = BuildConfig.of(input=path, output=tempfile.mkdtemp(prefix="imagerecords-urls-"), path_column="url")
    calls = {"stat": 0, "connect": 0}
    real_size, real_connect, real_create = assign_lib.looked_up_size, socket.socket.connect, socket.create_connection

    def stat(ref):
        calls["stat"] += 1
        return real_size(ref)

    def refused(*args, **kwargs):
        calls["connect"] += 1
        raise OSError("the listing opened a network connection")

    assign_lib.looked_up_size, socket.socket.connect, socket.create_connection = stat, refused, refused
    try:
        start = time.perf_counter()
        info = sources.check_input(config)
        listed = list(local.list_inputs(config, info))
        listed_s = time.perf_counter() - start
    finally:
        assign_lib.looked_up_size, socket.socket.connect, socket.create_connection = real_size, real_connect, real_create
    shutil.rmtree(config.output, ignore_errors=True)
    refs = [(h, r) for h, r in listed if not isinstance(r, Rejected)]
    labels = refs_lib.vocabulary(sorted({r.label for _, r in refs}), arrays.label_type(config), config.labels.label_offset)
    assigned = [(h, assign_lib.assign(r, labels, None, config.split.split_seed)) for h, r in refs]
    return {"refs": [(h, r) for h, r in assigned if not isinstance(r, Rejected)], "rows": len(listed),
            "rejected": len(listed) - len(assigned) + sum(isinstance(r, Rejected) for _, r in assigned),
            "list_s": listed_s, "rows_per_s": len(listed) / listed_s, "sizes_known": info.sizes_known,
            "stat_calls": calls["stat"], "connections": calls["connect"]}


def sample_shards(refs, rows_per_shard: float, seed: int = 0) -> List[List[str]]:
    """The sample cut as the build cuts a split (planning.plan_shards over the real shuffle hashes,
    at the full-size shards' row count), each shard's hosts in the order its writer fetches them
    (assign_lib.shard_order): a shard at full size is a run of consecutive hashes, so is a sampled one."""
    from imagerecords.pipeline.plan import assign as assign_lib
    from imagerecords.pipeline.plan import shard_plan as planning
    from imagerecords.pipeline.read import download

    count = max(1, round(len(refs) / rows_per_shard))
    plan = planning.plan_shards("train", [h for h, _ in refs], 0, count)
    groups: List[list] = [[] for _ in range(count)]
    for h, ref in refs:
        groups[plan.shard_of(h)].append((h, ref))
    return [[download.host_of(r.uri) for r in assign_lib.shard_order(g)] for g in groups]


def simulate_downloads(shards: List[List[str]], busiest: str, slots: int, per_host: int, threads: int,
                       writers: int, latency_s: float, sigma: float, num_pools: int, seed: int = 0,
                       duty: float = 1.0) -> Dict[str, object]:
    """One worker process fetching the sampled shards, event by event, as download.Downloader
    limits it: `writers` shards at once, each with `threads` image threads taking its rows in
    order and its own Downloader (a Beam shard writer's); a fetch holds one of `slots`
    (--http_workers) and then one of its writer's `per_host` for its host, waiting for either in
    turn; with `duty` < 1 (politeness.share) a writer's request to a host of d seconds is followed by
    d * (1 / duty - 1) without one, its first after a random part of a FIRST_S request's pause
    (download._Paced). A fetch takes a log-normal time of mean `latency_s`. Connections are kept per
    host in each writer's LRU of `num_pools` hosts (urllib3's PoolManager) with up to `per_host` idle
    ones each. Measured until the last shard is taken (the steady state)."""
    import collections
    import heapq
    import random

    from imagerecords.pipeline.read import download

    rng = random.Random(seed)
    mu = math.log(latency_s) - sigma * sigma / 2  # the log-normal's mean is latency_s
    pause = 1.0 / duty - 1.0
    queue = collections.deque(shards)
    rows: Dict[int, collections.deque] = {}
    writer_of: Dict[int, int] = {}
    for w in range(writers):
        rows[w] = collections.deque(queue.popleft()) if queue else collections.deque()
        for t in range(threads):
            writer_of[w * threads + t] = w
    free = slots
    wait_slot: collections.deque = collections.deque()
    busy: Dict[Tuple[int, str], int] = collections.Counter()  # by (writer, host): each writer's Downloader
    free_at: Dict[Tuple[int, str], float] = {}  # when a paced (writer, host) may start its next request
    timers: set = set()
    wait_host: Dict[Tuple[int, str], collections.deque] = collections.defaultdict(collections.deque)
    pools = {w: collections.OrderedDict() for w in range(writers)}  # each writer's urllib3 PoolManager
    events: list = []
    pending: Dict[int, str] = {}
    now = last = 0.0
    flying = 0  # fetches in flight to the busiest host, all writers
    held = [0.0] * (writers * per_host + 1)  # seconds with k fetches in flight to the busiest host
    stats = {"done": 0, "new": 0, "reused": 0, "host_wait_s": 0.0, "busiest": 0}
    waited_since: Dict[int, float] = {}
    steady = [None]
    seq = [0]

    def push(at, kind, tid, key, started=0.0):
        seq[0] += 1
        heapq.heappush(events, (at, seq[0], kind, tid, key, started))

    def tick():
        nonlocal last
        if steady[0] is None:
            held[flying] += now - last
        last = now

    def fetch(tid, key):
        nonlocal flying
        host = key[1]
        busy[key] += 1
        if host == busiest:
            flying += 1
            if steady[0] is None:
                stats["busiest"] += 1
        pool = pools[key[0]]
        if host in pool:
            pool.move_to_end(host)
            if pool[host]:
                pool[host] -= 1
                stats["reused"] += 1
            else:
                stats["new"] += 1
        else:
            stats["new"] += 1
            pool[host] = 0
            if len(pool) > num_pools:
                pool.popitem(last=False)
        push(now + rng.lognormvariate(mu, sigma), "done", tid, key, now)

    def ready(key) -> bool:
        return busy[key] < per_host and free_at.get(key, 0.0) <= now

    def wake(key):
        """Starts the next waiter on `key` if it may go now, or sets a timer for when it may."""
        if not wait_host[key] or busy[key] >= per_host:
            return
        if free_at.get(key, 0.0) <= now:
            waiter = wait_host[key].popleft()
            if steady[0] is None:
                stats["host_wait_s"] += now - waited_since[waiter]
            del waited_since[waiter]
            fetch(waiter, key)
        elif key not in timers:
            timers.add(key)
            push(free_at[key], "timer", -1, key)

    def take_host(tid, host):
        key = (writer_of[tid], host)
        if duty < 1.0 and key not in free_at:
            free_at[key] = now + rng.uniform(0.0, download._Paced.FIRST_S * pause)
        if ready(key) and not wait_host[key]:
            fetch(tid, key)
        else:
            waited_since[tid] = now
            wait_host[key].append(tid)
            wake(key)

    def next_row(tid):
        nonlocal free
        w = writer_of[tid]
        if not rows[w]:
            if not queue:
                if steady[0] is None:
                    steady[0] = (now, stats["done"])
                return
            rows[w] = collections.deque(queue.popleft())
        host = rows[w].popleft()
        if free:
            free -= 1
            take_host(tid, host)
        else:
            pending[tid] = host
            wait_slot.append(tid)

    for tid in writer_of:
        next_row(tid)
    while events:
        now, _, kind, tid, key, started = heapq.heappop(events)
        tick()
        if kind == "timer":
            timers.discard(key)
            wake(key)
            continue
        host = key[1]
        stats["done"] += 1
        busy[key] -= 1
        if host == busiest:
            flying -= 1
        if duty < 1.0:
            free_at[key] = now + (now - started) * pause
        if host in pools[key[0]]:
            pools[key[0]][host] = min(pools[key[0]][host] + 1, per_host)
        wake(key)
        free += 1
        if wait_slot:
            waiter = wait_slot.popleft()
            free -= 1
            take_host(waiter, pending.pop(waiter))
        next_row(tid)
    end, done = steady[0] or (now, stats["done"])
    total = sum(held) or 1.0
    return {"img_s": done / end, "fetches": stats["done"], "new_connection_share": stats["new"] / stats["done"],
            "host_wait_share": stats["host_wait_s"] / (end * min(slots, writers * threads)),
            "busiest_req_s": stats["busiest"] / end, "busiest_in_flight": [h / total for h in held]}


def cluster_in_flight(per_worker: List[float], workers: int, quantile: float = 0.999) -> Dict[str, float]:
    """Connections at one host across `workers` independent worker processes, each holding k with the
    time share per_worker[k]: the mean and the `quantile` of their sum (its exact distribution)."""
    import numpy as np

    total = np.array([1.0])
    power = np.asarray(per_worker, dtype=float)
    n = workers
    while n:  # the sum's distribution: per_worker convolved `workers` times, by squaring
        if n & 1:
            total = np.convolve(total, power)
        power = np.convolve(power, power)
        n >>= 1
    cumulative = np.cumsum(total)
    return {"mean": workers * sum(k * p for k, p in enumerate(per_worker)),
            "peak": int(np.searchsorted(cumulative, quantile * cumulative[-1]))}


def url_sums(sizes: List[int], sample: int, hosts: int, zipf: float, classes: int, image_bytes: int,
             target_shard_mb: float, min_shards: int, latency_ms: float, latency_sigma: float, workers: int,
             writers: int, threads: int, fail_fraction: float, work: Optional[str] = None,
             per_host: Optional[int] = None) -> Tuple[Dict[str, object], List[Dict[str, float]]]:
    """The URL build's figures per size from a sample of `sample` rows: listing rate, refs through the
    shuffle, shards by count, and the downloads' simulation; (the sample's figures, one row per size)."""
    import collections

    from imagerecords.pipeline import refs as refs_lib
    from imagerecords.pipeline.plan import shard_plan as planning
    from imagerecords.pipeline.read import download, politeness

    http = download.HttpSettings(**({"per_host": per_host} if per_host else {}))
    # Each of the job's shard writers has its own Downloader: --http_per_host is divided among them all.
    downloaders = workers * writers
    share = politeness.share(http.per_host, downloaders)
    downloader = download.Downloader(http, None)  # builds its pools only: no request is made
    num_pools = downloader._pool.pools._maxsize
    work = work or tempfile.mkdtemp(prefix="imagerecords-urls-")
    try:
        path = os.path.join(work, "urls.csv")
        figures: Dict[str, object] = write_url_manifest(path, sample, hosts, zipf, classes)
        listed = list_urls(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    refs = listed.pop("refs")
    figures.update(listed)
    figures["ref_bytes"] = sum(ref_bytes(ref=r) for _, r in refs) / len(refs)
    by_host = collections.Counter(download.host_of(r.uri) for _, r in refs)
    busiest, top = by_host.most_common(1)[0]
    figures.update({"hosts_seen": len(by_host), "busiest_host_share": top / len(refs), "num_pools": num_pools,
                    "http_workers": http.workers, "http_per_host": http.per_host, "http_retries": http.retries,
                    "threads": threads, "writers_per_worker": writers, "workers": workers, "latency_ms": latency_ms,
                    "downloaders": downloaders, "per_writer_slots": share.slots, "per_writer_duty": share.duty})
    # The pairs' hashes are the ones GlobalShuffle keys a URL by (seed 0, the key being the URL).
    assert all(refs_lib.shuffle_hash(0, r.key) == h and r.key == r.uri for h, r in refs[:100])
    per_shard = []
    rows = []
    runs: Dict[int, Dict[str, object]] = {}
    for images in sizes:
        shards = planning.choose_num_shards(images, 0, None, target_shard_mb, min_shards)
        per = images / shards
        key = round(per)
        if key not in runs:  # one simulation per shard size: the sizes share it at the default shard size
            cut = sample_shards(refs, per)
            hosts_per = [len(set(s)) for s in cut]
            run = simulate_downloads(cut, busiest, http.workers, share.slots, threads, writers, latency_ms / 1e3,
                                     latency_sigma, num_pools, duty=share.duty)
            run.update({"sample_shards": len(cut), "hosts_per_shard": sum(hosts_per) / len(cut),
                        "hosts_per_shard_max": max(hosts_per),
                        "busiest_shard_share": max(s.count(busiest) / len(s) for s in cut)})
            runs[key] = run
            per_shard.append(run)
        run = runs[key]
        cluster = cluster_in_flight(run["busiest_in_flight"], workers)
        # A failing URL (answering 5xx every try, assumed) holds its slot for every try and backoff wait.
        backoff = sum(min(download.BACKOFF_CAP_S, download.BACKOFF_BASE_S * 2 ** k) for k in range(http.retries))
        failing_slot_s = images * fail_fraction * (backoff + (http.retries + 1) * latency_ms / 1e3)
        failing_h = failing_slot_s / min(http.workers, writers * threads) / 3600
        worker_h = images / run["img_s"] / 3600 + failing_h
        rows.append({
            "urls": images, "manifest_gb": images * figures["manifest_bytes_per_row"] / 1e9,
            "listing_cpu_h": images / figures["rows_per_s"] / 3600,
            "listing_parts": math.ceil(images * figures["manifest_bytes_per_row"] / (1 << 20)),
            "shards": shards, "urls_per_shard": per, "shuffle_gb": images * figures["ref_bytes"] / 1e9,
            "worker_img_s": run["img_s"], "worker_mb_s": run["img_s"] * image_bytes / 1e6,
            "download_worker_h": worker_h, "download_wall_h": worker_h / workers,
            "failing_backoff_s": backoff, "failing_worker_h": failing_h,
            "hosts_per_shard": run["hosts_per_shard"], "new_connection_share": run["new_connection_share"],
            "host_wait_share": run["host_wait_share"],
            "busiest_host_requests": images * figures["busiest_host_share"],
            "busiest_host_req_s": workers * run["busiest_req_s"],
            "busiest_host_connections_mean": cluster["mean"], "busiest_host_connections_peak": cluster["peak"],
            "busiest_host_connections_bound": http.per_host})
    figures["simulations"] = per_shard
    return figures, rows


def url_table(rows: List[Dict[str, float]]) -> str:
    lines = [f"{'URLs':>14} {'listing CPU h':>13} {'shards':>8} {'shuffle GB':>10} {'img/s/worker':>12} "
             f"{'worker-h':>9} {'wall h':>7} {'hosts/shard':>11} {'new conn':>8} {'busiest req/s':>13} "
             f"{'busiest conns mean/p99.9/setting':>32}"]
    for r in rows:
        conns = (f"{r['busiest_host_connections_mean']:,.0f}/{r['busiest_host_connections_peak']:,}/"
                 f"{r['busiest_host_connections_bound']:,}")
        lines.append(f"{r['urls']:>14,} {r['listing_cpu_h']:>13,.2f} {r['shards']:>8,} {r['shuffle_gb']:>10,.1f} "
                     f"{r['worker_img_s']:>12,.1f} {r['download_worker_h']:>9,.0f} {r['download_wall_h']:>7,.2f} "
                     f"{r['hosts_per_shard']:>11,.0f} {r['new_connection_share']:>8.0%} "
                     f"{r['busiest_host_req_s']:>13,.1f} {conns:>32}")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", default="10000000,100000000,1000000000", help="comma-separated dataset sizes")
    p.add_argument("--image_bytes", type=int, default=110_000, help="mean image size (ImageNet's JPEGs: ~110 KB)")
    p.add_argument("--classes", type=int, default=1000, help="label classes (0: no label histograms)")
    p.add_argument("--target_shard_mb", type=float, default=None, help="default: the builder's")
    p.add_argument("--request_ms", type=float, default=50.0, help="assumed latency of one object-store request")
    p.add_argument("--parallel_requests", type=int, default=32, help="assumed concurrent requests")
    p.add_argument("--max_label_pairs", type=int, default=20_000_000,
                   help="build manifests up to this many (shard, label) pairs; extrapolate larger ones")
    p.add_argument("--columns_from", type=int, default=None,
                   help="shards per split from which the manifest holds columns (default: the builder's "
                        "format.manifest.COLUMNS_FROM; a number above every size writes rows, as before format 3)")
    p.add_argument("--json", help="write every figure here")
    urls = p.add_argument_group("URL mode (--urls): a manifest of http(s) URLs, no size column")
    urls.add_argument("--urls", action="store_true", help="simulate a build whose manifest rows are URLs")
    urls.add_argument("--sample_rows", type=int, default=200_000, help="URL rows written, listed and simulated")
    urls.add_argument("--hosts", type=int, default=5000, help="distinct hosts the URLs are drawn over")
    urls.add_argument("--zipf", type=float, default=1.0, help="host weights 1/rank**zipf (0: uniform)")
    urls.add_argument("--latency_ms", type=float, default=200.0, help="assumed mean time of one download")
    urls.add_argument("--latency_sigma", type=float, default=0.5, help="assumed log-normal spread of that time")
    urls.add_argument("--workers", type=int, default=1000, help="worker processes downloading at once")
    urls.add_argument("--writers_per_worker", type=int, default=4,
                      help="shards a worker process writes at once (each with the build's --threads image threads)")
    urls.add_argument("--http_per_host", type=int, default=None,
                      help="--http_per_host of the build (default: the builder's), divided among the job's shard writers")
    urls.add_argument("--fail_fraction", type=float, default=0.01,
                      help="assumed share of URLs that answer 5xx on every try (retried, then rejected)")
    a = p.parse_args(argv)
    from imagerecords.pipeline.config import BuildConfig

    defaults = BuildConfig.of(input="in.csv", output="out")
    sizes = [int(float(x)) for x in a.images.split(",")]
    target_mb = a.target_shard_mb or defaults.shards.target_shard_mb
    if a.urls:
        return _main_urls(a, sizes, target_mb, defaults)
    rows = simulate(sizes, a.image_bytes, a.classes, target_mb, defaults.shards.min_shards, a.request_ms,
                    a.parallel_requests, a.max_label_pairs, columns_from=a.columns_from)
    print(f"{a.image_bytes:,} B per image, {a.classes} classes, shards of "
          f"{a.target_shard_mb or defaults.shards.target_shard_mb:g} MB, {rows[0]['ref_bytes']} B per ref, "
          f"object-store requests of {a.request_ms:g} ms (assumed)")
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


def _main_urls(a, sizes: List[int], target_mb: float, defaults) -> int:
    sample, rows = url_sums(sizes, a.sample_rows, a.hosts, a.zipf, a.classes, a.image_bytes, target_mb,
                            defaults.shards.min_shards, a.latency_ms, a.latency_sigma, a.workers, a.writers_per_worker,
                            defaults.threads, a.fail_fraction, per_host=a.http_per_host)
    # The commit and a reader see shards, not URLs: the file mode's manifest steps at the count-planned shards.
    committed = simulate(sizes, a.image_bytes, a.classes, target_mb, defaults.shards.min_shards, a.request_ms,
                         a.parallel_requests, a.max_label_pairs, columns_from=a.columns_from, sized=False,
                         per_ref=sample["ref_bytes"])
    for row, commit in zip(rows, committed):
        assert row["shards"] == commit["shards"]
        row.update({k: v for k, v in commit.items() if k not in row})
    print(f"{sample['sample_rows']:,} URL rows sampled ({sample['url_chars']:.1f} characters, "
          f"{sample['manifest_bytes_per_row']:.1f} manifest bytes each) over {sample['hosts_seen']:,} hosts "
          f"(Zipf {sample['zipf']:g}; the busiest holds {sample['busiest_host_share']:.2%}); listed at "
          f"{sample['rows_per_s']:,.0f} rows/s in one process with {sample['stat_calls']} stats and "
          f"{sample['connections']} connections; {sample['ref_bytes']:.1f} B per ref")
    print(f"downloads: {sample['workers']:,} worker processes x {sample['writers_per_worker']} shards x "
          f"{sample['threads']} threads, --http_workers {sample['http_workers']}, --http_per_host "
          f"{sample['http_per_host']} divided among {sample['downloaders']:,} shard writers ("
          f"{sample['per_writer_slots']} at once each, busy at most {sample['per_writer_duty']:.3g} of the time), "
          f"{sample['latency_ms']:g} ms per download (assumed), "
          f"{a.fail_fraction:.0%} failing URLs (assumed)")
    print(url_table(rows))
    print(table(rows))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"sample": sample, "sizes": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
