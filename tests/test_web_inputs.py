"""Manifests of http(s) URLs, downloaded by the shard writers, against a real HTTP server started
here (tests/support/web.py): every URL ends as a record holding the served bytes or as one
errors.jsonl row (stage 'download') naming what happened; the limits hold at the server."""

import json
import os
import time

import pytest

from conftest import build, read_examples
from support.web import LARGE_BYTES, Server, jpeg
from test_golden import digests
from imagerecords.pipeline.read import download

GOOD = 12  # images served plainly
IMAGES = {f"p{i:02d}.jpg": jpeg(i) for i in range(GOOD + 4)}
# Short limits, so the failures end in seconds: 2 s without a byte, 4 s per URL, 1 retry, 1 MB.
FAST = ["--http_timeout", 2, "--http_deadline", 4, "--http_retries", 1, "--max_file_mb", 1,
        "--max_reject_fraction", 1, "--num_shards", 2, "--path_column", "url"]


def _manifest(tmp_path, rows, name="urls.csv"):
    path = tmp_path / name
    path.write_text("url,label\n" + "".join(f"{url},{label}\n" for url, label in rows))
    return path


def _errors(out):
    with open(os.path.join(out, "errors.jsonl")) as f:
        return {r["uri"]: r for r in map(json.loads, f)}


@pytest.fixture
def server():
    with Server(IMAGES) as s:
        yield s


@pytest.mark.slow
def test_every_url_ends_as_its_served_bytes_or_one_row_naming_what_happened(server, tmp_path):
    good = [(server.url(f"/img/p{i:02d}.jpg"), "cat" if i % 2 else "dog") for i in range(GOOD)]
    recovered = [(server.url("/redirect/p12.jpg"), "dog"), (server.url("/once503/p13.jpg"), "cat"),
                 (server.url("/once429/p14.jpg"), "dog")]
    bad = {"/missing": "HTTP 404 (Not Found)",
           "/page": "not an image: the server sent text/html",
           "/loop": "too many redirects (more than 5)",
           "/tofile": "HTTP 302 redirect to a file: URL refused: only http and https are followed",
           "/large": "too large: over the 1,000,000-byte limit (--max_file_mb); the download was stopped there",
           "/drip": "cut off after",
           "/reset": "connection",
           "/truncated": "truncated: the connection ended after 100 of 20,000 bytes (after 2 tries)"}
    rows = good + recovered + [(server.url(p), "cat") for p in bad]
    out = tmp_path / "out"
    started = time.monotonic()
    manifest = build(_manifest(tmp_path, rows), out, *FAST)
    took = time.monotonic() - started
    assert manifest.num_examples == GOOD + 3 and manifest.num_rejected == len(bad)
    # Each success stored exactly the bytes served (baseline JPEGs pass through).
    examples = read_examples(out)
    for url, _ in good + recovered:
        stored = examples[url].features.feature["image"].bytes_list.value[0]
        assert stored == IMAGES[url.rsplit("/", 1)[1]], url
    errors = _errors(out)
    assert sorted(errors) == sorted(server.url(p) for p in bad)
    for path, reason in bad.items():
        row = errors[server.url(path)]
        assert row["stage"] == "download" and row["reason"].startswith(reason), row
    assert "reset" in errors[server.url("/reset")]["reason"] or "closed" in errors[server.url("/reset")]["reason"]
    assert server.requests["/once503/p13.jpg"] == 2 and server.requests["/once429/p14.jpg"] == 2
    # The large body was cut off near the limit, not read whole (socket buffers hold a few MB more).
    assert server.large_sent < 1_000_000 + 16 * 1024 * 1024 < LARGE_BYTES
    assert took < 60, f"the build took {took:.0f} s: a limit did not hold"


def test_the_launcher_downloads_nothing_and_the_rows_plan_by_count(server, tmp_path):
    from imagerecords.builder import checks
    from imagerecords.pipeline.config import BuildConfig

    rows = [(server.url(f"/img/p{i:02d}.jpg"), "cat") for i in range(GOOD)]
    path = _manifest(tmp_path, rows)
    config = BuildConfig.of(input=str(path), output=str(tmp_path / "out"), path_column="url")
    info = checks.check_input(config)
    from imagerecords.builder.engines import local

    listed = [r for _, r in local.list_inputs(config, info)]
    assert [r.size for r in listed] == [-1] * GOOD  # not stat-ed: no request made by the listing
    assert sum(server.requests.values()) == 0
    assert not info.sizes_known  # so the shards are planned by count


@pytest.mark.slow
def test_the_summary_says_when_shards_were_planned_by_count(server, tmp_path, capsys):
    from imagerecords.cli import main as cli

    rows = [(server.url(f"/img/p{i:02d}.jpg"), "cat") for i in range(GOOD)]
    by_count = "  shards planned by count: no input size was known (URL rows, or --skip_stat)"
    path = _manifest(tmp_path, rows)
    args = ["--path_column", "url", "--no_progress", "--target_shard_mb", "0.5", "--min_shards", "1"]
    assert cli.main(["build", "--input", str(path), "--output", str(tmp_path / "a"), *args]) == 0
    said = capsys.readouterr().out
    assert by_count in said and "counted as 110 KB" in said
    # 12 images at 110 KB against 0.5 MB shards: 3 shards, by count alone
    assert "      12 records      3 shards" in said, said
    sized = tmp_path / "sized.csv"  # the same URLs with their sizes: planned by bytes, and no line
    sized.write_text("url,label,size\n" + "".join(f"{u},{l},{len(IMAGES[u.rsplit('/', 1)[1]])}\n" for u, l in rows))
    assert cli.main(["build", "--input", str(sized), "--output", str(tmp_path / "b"), *args]) == 0
    said = capsys.readouterr().out
    assert by_count not in said and "      12 records      1 shards" in said, said  # a few KB each: one shard
    files = tmp_path / "files"  # local paths: stat-ed, so by bytes; with --skip_stat, by count
    files.mkdir()
    for name, data in IMAGES.items():
        (files / name).write_bytes(data)
    local_rows = tmp_path / "local.csv"
    local_rows.write_text("url,label\n" + "".join(f"{files / n},cat\n" for n in sorted(IMAGES)[:GOOD]))
    for extra, planned in (([], False), (["--skip_stat"], True)):
        out = str(tmp_path / f"local{len(extra)}")
        assert cli.main(["build", "--input", str(local_rows), "--output", out, *args, *extra]) == 0
        assert (by_count in capsys.readouterr().out) == planned, extra


def _two_splits(server, tmp_path):
    """A manifest of the good images and one missing, and the arguments of a two-split build."""
    rows = [(server.url(f"/img/p{i:02d}.jpg"), "cat" if i % 3 else "dog") for i in range(GOOD)]
    rows.append((server.url("/missing"), "cat"))
    return _manifest(tmp_path, rows), [*FAST, "--splits", "train=0.75,validation=0.25", "--write_index"]


@pytest.mark.slow
def test_two_builds_write_the_same_bytes_whatever_the_download_concurrency(server, tmp_path):
    path, args = _two_splits(server, tmp_path)
    build(path, tmp_path / "a", *args)
    build(path, tmp_path / "b", *args, "--http_workers", 3)
    a, b = digests(str(tmp_path / "a"), str(tmp_path)), digests(str(tmp_path / "b"), str(tmp_path))
    assert a == b and any(".tfrecord-" in name for name in a)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2], ids=["threads", "two_worker_processes"])
def test_no_more_connections_at_once_than_the_per_host_limit(tmp_path, workers):
    # Two worker processes each write a shard at once: the limit holds across them, not per process.
    with Server(IMAGES, delay=0.05) as server:
        rows = [(server.url(f"/img/p{i % GOOD:02d}.jpg?copy={i}"), "cat") for i in range(60)]
        server.images.update({f"p{i % GOOD:02d}.jpg?copy={i}": IMAGES[f"p{i % GOOD:02d}.jpg"] for i in range(60)})
        manifest = build(_manifest(tmp_path, rows), tmp_path / "out", *FAST, "--http_per_host", 2, "--threads", 8,
                         "--skip_duplicate_check", "--local_workers", workers)
        assert manifest.num_examples == 60
        assert server.max_in_flight == 2, server.max_in_flight  # reached, never passed, across the processes
        # Idle keep-alive connections are each process's own: at most the limit per process.
        assert server.max_open <= 2 * max(workers, 1), server.max_open


@pytest.mark.slow
def test_each_worker_process_downloads_with_its_threads(tmp_path):
    # --threads is a shard writer's download concurrency in the local engine's worker processes too
    # (they prepare local files with 2 threads): 2 processes of 6 threads keep 12 requests in flight.
    # The server holds every answer until 12 are (2 s at most), so the count does not hang on timing.
    with Server(IMAGES, gate=12) as server:
        rows = [(server.url(f"/img/p{i % GOOD:02d}.jpg?copy={i}"), "cat") for i in range(48)]
        server.images.update({f"p{i % GOOD:02d}.jpg?copy={i}": IMAGES[f"p{i % GOOD:02d}.jpg"] for i in range(48)})
        manifest = build(_manifest(tmp_path, rows), tmp_path / "out", *FAST, "--http_per_host", 64, "--threads", 6,
                         "--num_shards", 2, "--skip_duplicate_check", "--local_workers", 2)
        assert manifest.num_examples == 48
        assert server.max_in_flight == 12, server.max_in_flight


def test_headers_reach_the_server_and_no_file_or_log(server, tmp_path, capfd):
    secret = "Bearer s3cr3t-t0ken-4fd9"
    headers = tmp_path / "headers.txt"
    headers.write_text(f"# for the image host\nAuthorization: {secret}\nX-Team: vision\n")
    rows = [(server.url(f"/img/p{i:02d}.jpg"), "cat") for i in range(4)] + [(server.url("/missing"), "cat")]
    out = tmp_path / "out"
    build(_manifest(tmp_path, rows), out, *FAST, "--http_headers", headers, "--http_user_agent", "test-agent/1.0")
    assert all(h.get("Authorization") == secret and h.get("X-Team") == "vision" for h in server.headers)
    assert all(h.get("User-Agent") == "test-agent/1.0" for h in server.headers)
    captured = capfd.readouterr()
    assert secret not in captured.out + captured.err
    for folder, _, names in os.walk(out):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                data = f.read()
            assert secret.encode() not in data and b"headers.txt" not in data, name
    from imagerecords.cli.launcher import LOG_DIR as logs

    for name in os.listdir(logs) if os.path.isdir(logs) else ():
        with open(os.path.join(logs, name), "rb") as f:
            assert secret.encode() not in f.read(), name


def test_a_bad_headers_file_is_one_line_naming_it(tmp_path, capsys):
    from imagerecords.cli import main as cli

    headers = tmp_path / "headers.txt"
    headers.write_text("Authorization Bearer abc\n")
    manifest = _manifest(tmp_path, [("http://127.0.0.1:9/x.jpg", "cat")])
    code = cli.main(["build", "--input", str(manifest), "--output", str(tmp_path / "out"), "--path_column", "url",
                     "--http_headers", str(headers), "--no_progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.endswith(f"--http_headers {headers}: line 1 is not 'Name: value'"), (code, err)
    assert "abc" not in err


@pytest.mark.slow
def test_an_append_after_failures_adds_exactly_the_failed_urls(tmp_path):
    images = dict(IMAGES)
    with Server(images) as server:
        rows = [(server.url(f"/img/p{i:02d}.jpg"), "cat") for i in range(6)]
        missing = images.pop("p03.jpg"), images.pop("p04.jpg")
        server.images = images
        path = _manifest(tmp_path, rows)
        first = build(path, tmp_path / "out", *FAST)
        assert first.num_examples == 4 and first.num_rejected == 2
        server.images.update({"p03.jpg": missing[0], "p04.jpg": missing[1]})  # the server is healthy again
        before = dict(server.requests)
        second = build(path, tmp_path / "out", "--append", "--path_column", "url")
        assert second.num_examples == 6
        fetched = {p: n - before.get(p, 0) for p, n in server.requests.items() if n - before.get(p, 0)}
        assert fetched == {"/img/p03.jpg": 1, "/img/p04.jpg": 1}  # the others are not fetched again


def test_the_downloader_refuses_a_declared_oversize_body_unread(server):
    big = {"huge.jpg": b"\xff" * 300_000}
    with Server(big) as s:
        d = download.Downloader(download.HttpSettings(retries=0), max_bytes=100_000)
        with pytest.raises(download.Failed) as e:
            d.fetch(s.url("/img/huge.jpg"))
        assert e.value.error == "TooLarge" and "declares 300,000 bytes" in str(e.value)


@pytest.mark.slow
def test_a_build_killed_mid_download_resumes_to_the_uninterrupted_bytes(server, tmp_path):
    import glob
    import signal
    import subprocess
    import sys

    from conftest import shard_files
    from imagerecords.format.manifest import STAGING

    rows = [(server.url(f"/img/p{i:02d}.jpg"), "cat" if i % 2 else "dog") for i in range(GOOD + 4)]
    path = _manifest(tmp_path, rows)
    args = ["build", "--input", str(path), *map(str, FAST), "--num_shards", "4", "--no_progress"]
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "imagerecords", *args, "--output", str(out)],
                            env={**os.environ, "IMAGERECORDS_TEST_PAUSE": "mid_shards",
                                 "IMAGERECORDS_TEST_PAUSE_DIR": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    staged = lambda: glob.glob(str(out / STAGING / "*" / "*.staged.json"))
    deadline = time.monotonic() + 120
    while not ((tmp_path / "mid_shards").exists() and staged()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no shard was staged within 120 s"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    kept = {os.path.basename(p)[:-len(".staged.json")]: json.load(open(p))["staged"]["result"]["count"]
            for p in staged()}
    assert 0 < len(kept) < 4, kept
    before = sum(server.requests.values())
    resumed = subprocess.run([sys.executable, "-m", "imagerecords", *args, "--output", str(out), "--resume"],
                             capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed: {len(kept)} of 4 shards reused" in resumed.stderr, resumed.stderr
    assert sum(server.requests.values()) - before == GOOD + 4 - sum(kept.values())  # only the rest downloaded
    fresh = tmp_path / "fresh"
    build(path, fresh, *FAST, "--num_shards", 4)
    names = [os.path.basename(f) for f in shard_files(out)]
    assert names == [os.path.basename(f) for f in shard_files(fresh)] and len(names) == 4
    for a, b in zip(shard_files(out), shard_files(fresh)):
        assert open(a, "rb").read() == open(b, "rb").read(), a


def test_a_url_with_control_characters_is_a_rejected_row(server, tmp_path):
    rows = [(server.url("/img/p00.jpg"), "cat"), (server.url("/img/p01.jpg") + "%0d%0aX-Injected: 1", "cat"),
            ('"' + server.url("/img/p02 space.jpg") + '"', "cat")]
    out = tmp_path / "out"
    manifest = build(_manifest(tmp_path, rows), out, *FAST)
    assert manifest.num_examples == 1 and manifest.num_rejected == 2
    assert all("X-Injected" not in "".join(h) for h in server.headers)
    for row in _errors(out).values():
        assert row["stage"] == "download" and row["reason"].startswith("HTTP 404"), row


@pytest.mark.slow
def test_a_gzip_bomb_is_stopped_at_the_size_limit(tmp_path):
    import gzip

    bomb = gzip.compress(b"\x00" * 200_000_000)  # 200 MB of zeros in ~200 KB

    class Bomb(Server):
        def _answer(self, h):
            self._send(h, 200, bomb, "image/jpeg", {"Content-Encoding": "gzip"})

    with Bomb({}) as s:
        d = download.Downloader(download.HttpSettings(retries=0), max_bytes=1_000_000)
        with pytest.raises(download.Failed) as e:
            d.fetch(s.url("/bomb.jpg"))
        assert e.value.error == "TooLarge", e.value


@pytest.mark.parametrize("flag, value, message", [
    ("--http_workers", "0", "http_workers must be within 1..1024, got 0"),
    ("--http_deadline", "-1", "http_deadline must be > 0 and at most 86400 seconds, got -1.0"),
    ("--http_retries", "1.5", "1.5"),
])
def test_http_settings_out_of_range_are_one_line(tmp_path, capsys, flag, value, message):
    from imagerecords.cli import main as cli

    manifest = _manifest(tmp_path, [("http://127.0.0.1:9/x.jpg", "cat")])
    code = cli.main(["build", "--input", str(manifest), "--output", str(tmp_path / "out"), "--path_column", "url",
                     flag, value, "--no_progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and message in err, (code, err)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_an_open_images_style_csv_of_urls_labels_and_boxes(server, tmp_path):
    """The README's recipe: a CSV of URLs, labels and boxes (a declared feature), end to end."""
    import numpy as np

    from imagerecords import reader

    boxes = {i: [[0.1 * (i % 5), 0.2, 0.5, 0.25 + 0.05 * i]] * (1 + i % 3) for i in range(8)}
    lines = ["url,label,boxes\n"] + [f'{server.url(f"/img/p{i:02d}.jpg")},/m/0{i % 2},"{boxes[i]}"\n'
                                     for i in range(8)]
    lines.append(f'{server.url("/missing")},/m/00,"[]"\n')
    path = tmp_path / "open-images.csv"
    path.write_text("".join(lines))
    out = tmp_path / "ds"
    manifest = build(path, out, "--path_column", "url", "--feature", "boxes=float32[?,4]",
                     "--max_reject_fraction", 0.2, "--num_shards", 2)
    assert manifest.num_examples == 8 and manifest.num_rejected == 1
    got = {ex["image/filename"].numpy().decode(): ex for ex in reader.as_dataset(str(out), "train")}
    assert sorted(got) == sorted(server.url(f"/img/p{i:02d}.jpg") for i in range(8))
    for i in range(8):
        ex = got[server.url(f"/img/p{i:02d}.jpg")]
        np.testing.assert_allclose(ex["boxes"].numpy(), np.array(boxes[i], np.float32))
        assert ex["label"].numpy() == i % 2  # /m/00, /m/01 by sorted name
        assert tuple(ex["image"].shape) == (30, 40, 3)


@pytest.mark.slow
def test_write_dataset_rows_with_url_paths_are_downloaded_by_its_writers(server, tmp_path):
    import apache_beam as beam

    from imagerecords.transforms import WriteDataset

    rows = [{"path": server.url(f"/img/p{i:02d}.jpg"), "label": "cat" if i % 2 else "dog"} for i in range(6)]
    rows.append({"path": server.url("/missing"), "label": "cat"})
    out = tmp_path / "wd"
    with beam.Pipeline() as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), num_shards=2, max_reject_fraction=0.5,
                                                                 http_retries=0)
    examples = read_examples(out)
    assert sorted(examples) == sorted(r["path"] for r in rows[:6])
    for url, ex in examples.items():
        assert ex.features.feature["image"].bytes_list.value[0] == IMAGES[url.rsplit("/", 1)[1]]
    (row,) = _errors(out).values()
    assert row["stage"] == "download" and row["reason"] == "HTTP 404 (Not Found)", row


# The download budget: link rot is normal -----------------------------------------------------------

TINY = {f"t{i:03d}.jpg": jpeg(i, size=(8, 8)) for i in range(200)}


def _cli(args, capsys):
    """(exit code, the build's stderr lines) of one build through the command line."""
    from imagerecords.cli import main as cli

    code = cli.main(["build", *map(str, args), "--no_progress"])
    # The test server's own handler threads may print there too (a client that hung up): not the build's.
    return code, [line for line in capsys.readouterr().err.splitlines() if line.startswith("imagerecords")]


def _published(out):
    from imagerecords.format import manifest

    return manifest.load(str(out), lambda p: open(p, "rb").read(), os.path.exists, size=os.path.getsize)


@pytest.mark.slow
def test_five_dead_links_in_200_pass_by_default_and_so_does_their_retry(tmp_path, capsys):
    with Server(TINY) as server:
        dead = [server.url(f"/img/dead{i}.jpg") for i in range(5)]
        rows = [(server.url(f"/img/{name}"), "cat" if i % 2 else "dog") for i, name in enumerate(TINY)]
        path = _manifest(tmp_path, rows + [(url, "cat") for url in dead])
        out = tmp_path / "out"
        # 5 of 205 is 2.4%: over --max_reject_fraction's 1%, within --max_download_failures' 10%.
        code, err = _cli(["--input", path, "--output", out, "--path_column", "url", "--num_shards", 2], capsys)
        assert code == 0, err
        first = _published(out)
        assert first.num_examples == 200 and first.num_rejected == 5
        assert {u: (r["stage"], r["reason"]) for u, r in _errors(out).items()} == {
            u: ("download", "HTTP 404 (Not Found)") for u in dead}
        keys = sorted(read_examples(out))
        before = dict(server.requests)
        # The documented retry: the same manifest with --append, while the 5 are still dead.
        code, err = _cli(["--input", path, "--output", out, "--path_column", "url", "--append"], capsys)
        assert code == 0, err
        fetched = {p: n - before.get(p, 0) for p, n in server.requests.items() if n - before.get(p, 0)}
        assert fetched == {f"/img/dead{i}.jpg": 1 for i in range(5)}  # only the dead ones were tried again
        second = _published(out)
        assert second.num_examples == 200 and second.num_rejected == 5
        assert sorted(read_examples(out)) == keys  # nothing added, nothing lost
        assert sorted(_errors(out)) == sorted(dead)  # errors.jsonl still names the dead links
        # A new version of the same records, whose errors.jsonl names the links still dead.
        assert second.num_already_present == 200 and second.version != first.version


@pytest.mark.slow  # three builds; tests/test_publish.py pins the rule in the fast tier
def test_an_append_over_the_download_budget_names_the_flag_to_rerun_with(tmp_path, capsys):
    few = dict(list(TINY.items())[:10])
    with Server(few) as server:
        good = [(server.url(f"/img/{name}"), "cat") for name in few]
        path = _manifest(tmp_path, good, "first.csv")
        out = tmp_path / "out"
        assert _cli(["--input", path, "--output", out, "--path_column", "url", "--num_shards", 1], capsys)[0] == 0
        # 5 new dead links over a dataset of 10: 5 of 15 inputs, over the 10% budget.
        more = _manifest(tmp_path, good + [(server.url(f"/img/gone{i}.jpg"), "cat") for i in range(5)], "more.csv")
        code, err = _cli(["--input", more, "--output", out, "--path_column", "url", "--append"], capsys)
        assert code == 6 and len(err) == 1, (code, err)
        err = err[0]
        assert "5 of 15 inputs (with the dataset's 10 records) could not be downloaded (33.33%)" in err, err
        assert err.endswith("(or raise --max_download_failures) and rerun the build with --append"), err
        assert "--overwrite" not in err
        assert _published(out).num_examples == 10  # unchanged
        # The flags it names work: the same append with a raised budget publishes.
        code, err = _cli(["--input", more, "--output", out, "--path_column", "url", "--append",
                          "--max_download_failures", 0.5], capsys)
        assert code == 0, err
        assert (_published(out).num_examples, _published(out).num_rejected) == (10, 5)
