"""The scale figures' own tools: the internet-scale simulation and the planning-only pass, at tiny sizes.

The simulated manifests are written with the commit's own steps and read back with the real
loaders (format.manifest.load, reader.load_info in a fresh process); the planning pass lists real
JPEGs drawn by the benchmark corpus into tmp_path.
"""

import csv
import json
import os

import pytest

from benchmarks import bench_scale, corpus, scale_sim
from imagerecords.format import manifest as manifest_lib
from imagerecords.pipeline.plan import shard_plan as planning
from imagerecords.reader.info import load_info


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def test_simulated_manifest_loads_with_the_real_loaders_and_counts_add_up(tmp_path):
    folder = str(tmp_path / "ds")
    shards = planning.choose_num_shards(5000, 5000 * 20_000, None, 1.0, 8)
    assert shards == 100
    figures = scale_sim.build_manifest(folder, 5000, shards, 20_000, classes=7)
    manifest = manifest_lib.load(folder, _read, os.path.exists, size=os.path.getsize)
    (split,) = manifest.splits
    assert split.name == "train" and len(split.shards) == shards and split.num_examples == 5000
    for shard in split.shards:  # each shard's histogram counts its records, over the 7 classes
        assert sum(n for _, n in shard.labels) == shard.count == 50
        assert {label for label, _ in shard.labels} <= set(range(7))
    assert manifest.label_names == tuple(f"c{i:05d}" for i in range(7))
    assert figures["manifest_mb"] == pytest.approx(os.path.getsize(os.path.join(folder, "manifest.json")) / 1e6)
    assert figures["label_pairs"] == sum(len(s.labels) for s in split.shards)
    info = load_info(folder)
    assert info.split("train").num_examples == 5000 and len(info.split("train").shards) == shards
    with open(os.path.join(folder, "dataset_info.json")) as f:  # TFDS's metadata came from the same manifest
        assert json.load(f)["splits"][0]["shardLengths"] == [str(50)] * shards
    loaded = scale_sim.load_in_reader(folder)  # what a reader host pays, in a fresh process
    assert loaded["records"] == 5000 and loaded["shards"] == shards
    assert loaded["load_s"] > 0 and loaded["added_mb"] >= 0


def test_simulation_measures_small_sizes_and_extrapolates_large_ones_per_shard():
    rows = scale_sim.simulate([3000, 30000], image_bytes=20_000, classes=5, target_shard_mb=1.0, min_shards=8,
                              request_ms=50.0, parallel_requests=10, max_label_pairs=1000)
    small, large = rows
    assert small["measured"] and not large["measured"] and large["extrapolated_from"] == 3000
    assert (small["shards"], large["shards"]) == (60, 600)
    assert small["records"] == 3000 and small["label_pairs"] == 60 * 5
    assert large["manifest_mb"] == pytest.approx(small["manifest_mb"] * 10)
    assert large["load_s"] == pytest.approx(small["load_s"] * 10)
    # The sums: every ref crosses the shuffle once; every shard is checked once and renamed (copy + delete).
    assert large["shuffle_gb"] == pytest.approx(30000 * large["ref_bytes"] / 1e9)
    assert large["commit_rename_requests"] == 1200 and large["commit_check_requests"] == 600
    assert large["commit_renames_parallel_min"] == pytest.approx(1200 * 0.05 / 10 / 60)
    text = scale_sim.table(rows)
    assert "measured" in text and "extrapolated from 3,000" in text


def test_planning_pass_lists_assigns_and_plans_every_row(tmp_path):
    tiny = corpus.ensure_tiny_images(8, cache=str(tmp_path / "cache"))
    manifest = tmp_path / "rows.csv"
    with open(manifest, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "label", "key"])
        for i in range(300):
            w.writerow([tiny[i % len(tiny)], f"c{i % 3}", f"row{i:05d}"])
        w.writerow([str(tmp_path / "gone.jpg"), "c0", "missing"])  # a row whose file is not there
    figures = bench_scale.plan_only(str(manifest))
    assert figures["rows"] == 300 and figures["rejected"] == 1
    assert figures["shards"] == 8  # min_shards: the inputs are far below one shard's size
    assert figures["peak_rss_mb"] >= figures["base_rss_mb"] > 0
    assert figures["total_s"] == pytest.approx(sum(figures[f"{step}_s"] for step in ("list", "assign", "plan", "take")))


def test_a_columnar_simulated_manifest_loads_slim_and_its_side_file_holds_the_histograms(tmp_path):
    # The 1B figures' form at a small size: columns from 10 shards, so the 100 shards go into columns.
    folder = str(tmp_path / "ds")
    figures = scale_sim.build_manifest(folder, 5000, 100, 20_000, classes=7, columns_from=10)
    assert figures["columns"] and figures["side_file_mb"] > 0
    with open(os.path.join(folder, "manifest.json")) as f:
        written = json.load(f)
    assert written["format_version"] == 3 and "shards" not in written["splits"]["train"]
    slim = manifest_lib.load(folder, _read, os.path.exists, size=os.path.getsize)
    (split,) = slim.splits
    assert isinstance(split.shards, manifest_lib.ShardColumns) and split.counts == [50] * 100
    assert sum(n for _, n in split.label_counts) == 5000 and {k for k, _ in split.label_counts} <= set(range(7))
    full = manifest_lib.load(folder, _read, os.path.exists, details=True, size=os.path.getsize)
    assert [sum(n for _, n in s.labels) for s in full.splits[0].shards] == [50] * 100
    assert figures["label_pairs"] == sum(len(s.labels) for s in full.splits[0].shards)
    loaded = scale_sim.load_in_reader(folder)
    assert loaded["records"] == 5000 and loaded["shards"] == 100


def test_simulation_builds_columnar_sizes_past_the_label_pairs_with_one_label_histograms():
    rows = scale_sim.simulate([3000, 30000], image_bytes=20_000, classes=5, target_shard_mb=1.0, min_shards=8,
                              request_ms=50.0, parallel_requests=10, max_label_pairs=1000, columns_from=100)
    small, large = rows
    assert small["measured"] and not small.get("columns") and small["label_pairs"] == 60 * 5
    assert large["measured"] and large["columns"] and large["one_label_histograms"]
    assert large["records"] == 30000 and large["shards"] == 600 and large["label_pairs"] == 600 * 5
    assert "columns + side file" in scale_sim.table(rows)


def test_url_listing_makes_no_stat_and_no_connection_and_the_counters_see_both(tmp_path):
    path = str(tmp_path / "urls.csv")
    written = scale_sim.write_url_manifest(path, 2000, hosts=50, zipf=1.0, classes=20)
    assert written["url_chars"] == pytest.approx(63, abs=0.5)
    listed = scale_sim.list_urls(path)
    assert listed["rows"] == 2000 and listed["rejected"] == 0 and len(listed["refs"]) == 2000
    assert (listed["stat_calls"], listed["connections"], listed["sizes_known"]) == (0, 0, False)
    assert all(ref.key == ref.uri and ref.size == -1 and ref.split == "train" for _, ref in listed["refs"])
    files = tmp_path / "files.csv"  # the same listing of local paths stats each row: the counter is live
    files.write_text("url,label\n" + "".join(f"{tmp_path / f'gone{i}.jpg'},a\n" for i in range(3)))
    assert scale_sim.list_urls(str(files))["stat_calls"] == 3


def test_download_simulation_keeps_the_per_host_limit_and_sums_workers_exactly():
    # One host: each of the 4 writers' Downloaders is held to its share (1) at once, so 4 per 0.2 s.
    one = scale_sim.simulate_downloads([["h"] * 400] * 4, "h", slots=16, per_host=1, threads=4, writers=4,
                                       latency_s=0.2, sigma=0.01, num_pools=64)
    assert one["img_s"] == pytest.approx(20, rel=0.05) and one["busiest_in_flight"][4] > 0.99
    assert one["new_connection_share"] == pytest.approx(4 / one["fetches"])  # four connections, kept alive
    assert one["busiest_req_s"] == pytest.approx(20, rel=0.05)
    # Paced to a quarter of the time: one writer's worth at once on average, a quarter of the requests.
    paced = scale_sim.simulate_downloads([["h"] * 100] * 4, "h", slots=16, per_host=1, threads=4, writers=4,
                                         latency_s=0.2, sigma=0.01, num_pools=64, duty=0.25)
    assert paced["img_s"] == pytest.approx(5, rel=0.1)
    assert sum(k * p for k, p in enumerate(paced["busiest_in_flight"])) == pytest.approx(1.0, rel=0.1)
    # Many equal hosts: the 16 slots run full (16 per 0.2 s), and no host waits.
    many = scale_sim.simulate_downloads([[f"h{i % 200}" for i in range(j, j + 400)] for j in range(4)], "h0",
                                        slots=16, per_host=4, threads=4, writers=4, latency_s=0.2, sigma=0.01,
                                        num_pools=64)
    assert many["img_s"] == pytest.approx(80, rel=0.05) and many["host_wait_share"] == 0
    assert scale_sim.cluster_in_flight([0.5, 0.5], 2) == {"mean": 1.0, "peak": 2}
    assert scale_sim.cluster_in_flight([0.0, 0.0, 0.0, 0.0, 1.0], 1000)["peak"] == 4000


def test_url_mode_run_writes_every_figure(tmp_path):
    out = tmp_path / "urls.json"
    assert scale_sim.main(["--urls", "--images", "100000", "--sample_rows", "3000", "--hosts", "50",
                           "--target_shard_mb", "11", "--workers", "10", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    sample, (row,) = figures["sample"], figures["sizes"]
    assert sample["stat_calls"] == 0 and sample["connections"] == 0 and sample["rows"] == 3000
    assert row["shards"] == planning.choose_num_shards(100000, 0, None, 11, 8) == 1000  # by count: 110 KB each
    assert figures["sample"]["simulations"][0]["sample_shards"] == 30  # the sample cut at 100 URLs a shard
    assert row["shuffle_gb"] == pytest.approx(100000 * sample["ref_bytes"] / 1e9)
    assert 150 < sample["ref_bytes"] < 180  # key and uri both the ~63-character URL
    assert 0 < row["worker_img_s"] <= 16 / 0.2 * 1.05
    assert row["busiest_host_requests"] == pytest.approx(100000 * sample["busiest_host_share"])
    # --http_per_host (4) divided among 10 workers x 4 shard writers: the busiest host's peak, cluster-wide.
    assert row["busiest_host_connections_mean"] <= row["busiest_host_connections_peak"] <= 4
    assert row["busiest_host_connections_bound"] == 4 and sample["downloaders"] == 40
    assert row["records"] == 100000 and row["measured"]  # the commit's manifest, built and loaded
