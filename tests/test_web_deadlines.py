"""--http_deadline bounds a URL whole (status line and headers included, slot waits excluded), and a
signal stops a build that is downloading at once: against real misbehaving servers
(tests/support/web.py), through real builds (in-process, and the command as a subprocess)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import build
from support.web import Dropping, Server, Silent, jpeg
from imagerecords.pipeline.read import deadlines, download

IMAGES = {f"s{i}.jpg": jpeg(i) for i in range(8)}


def _manifest(tmp_path, urls):
    path = tmp_path / "urls.csv"
    path.write_text("url,label\n" + "".join(f"{url},{'cat' if i % 2 else 'dog'}\n" for i, url in enumerate(urls)))
    return path


def _errors(out):
    with open(os.path.join(out, "errors.jsonl")) as f:
        return {r["uri"]: r for r in map(json.loads, f)}


@pytest.mark.slow
def test_a_header_drip_and_100_continue_forever_are_cut_off_at_the_deadline(tmp_path):
    # urllib3's read timeout (1 s) restarts at every byte: only the deadline can end these two.
    with Server(IMAGES) as server:
        drip, cont = server.url("/dripheaders"), server.url("/continue")
        manifest = build(_manifest(tmp_path, [server.url("/img/s0.jpg"), drip, cont]), tmp_path / "out",
                         "--http_deadline", 2, "--http_timeout", 1, "--path_column", "url",
                         "--max_reject_fraction", 1, "--local_workers", 0)
        limit = time.monotonic() + 10
        while len(server.hung_up) < 2:  # the server sees the hang-up at its next writes
            assert time.monotonic() < limit, f"the server never saw the client hang up: {server.hung_up}"
            time.sleep(0.02)
    assert manifest.num_examples == 1 and manifest.num_rejected == 2
    errors = _errors(tmp_path / "out")
    for url in (drip, cont):
        assert errors[url]["stage"] == "download"
        assert errors[url]["reason"] == ("cut off before the response's headers were in: the download took longer "
                                         "than its 2 s deadline"), errors[url]
        assert errors[url]["error"] == "Deadline"
    assert server.requests["/dripheaders"] == 1 and server.requests["/continue"] == 1  # a cut is not retried
    # Seen by the server: the deadline (2 s) plus one timeout (1 s) bounds each, its lag (0.4 s) included.
    assert all(seconds < 2 + 1 for seconds in server.hung_up.values()), server.hung_up


@pytest.mark.slow
def test_waiting_for_a_per_host_slot_is_not_charged_to_the_deadline(tmp_path):
    # Four image threads ask at once, one at a time is served (0.3 s each): the fourth waits 0.9 s for
    # its slot, and with its answer would pass the 1 s deadline if the wait were charged.
    with Server(IMAGES, delay=0.3) as server:
        urls = [server.url(f"/img/{name}") for name in IMAGES]
        manifest = build(_manifest(tmp_path, urls), tmp_path / "out", "--http_per_host", 1, "--http_deadline", 1,
                         "--http_retries", 0, "--path_column", "url", "--max_reject_fraction", 1,
                         "--local_workers", 0, "--num_shards", 1)
        assert server.max_in_flight == 1
    assert not os.path.exists(tmp_path / "out" / "errors.jsonl") or _errors(tmp_path / "out") == {}
    assert manifest.num_examples == len(IMAGES) and manifest.num_rejected == 0


def test_a_stopped_downloader_cuts_its_request_in_flight_and_connects_no_more():
    with Silent() as silent:
        downloader = download.Downloader(download.HttpSettings(timeout=60, deadline=120), None)
        raised = []

        def fetch():
            try:
                downloader.fetch(silent.url("/hang/a.jpg"))
            except BaseException as e:  # what the image thread would see
                raised.append(e)

        thread = threading.Thread(target=fetch, daemon=True)  # a failing run leaves it blocked
        thread.start()
        limit = time.monotonic() + 10
        while not silent.accepted:
            assert time.monotonic() < limit, "the downloader never connected to the silent server within 10 s"
            time.sleep(0.01)
        downloader.stop()
        thread.join(timeout=5)
        assert not thread.is_alive(), "the fetch blocked on a silent socket was not woken by stop()"
        assert len(raised) == 1 and isinstance(raised[0], deadlines.Cancelled), raised  # not a row: the build stops
        with pytest.raises(deadlines.Cancelled):
            downloader.fetch(silent.url("/hang/b.jpg"))
        assert len(silent.settled()) == 1  # the fetch after stop() never connected


def test_a_stopped_downloader_wakes_a_connect_that_hangs():
    import psutil

    with Dropping() as host:
        downloader = download.Downloader(download.HttpSettings(timeout=60, deadline=120), None)
        raised = []

        def fetch():
            try:
                downloader.fetch(host.url("/a.jpg"))
            except BaseException as e:
                raised.append(e)

        thread = threading.Thread(target=fetch, daemon=True)  # a failing run leaves it blocked
        thread.start()
        port = int(host.url("").rsplit(":", 1)[1])
        limit = time.monotonic() + 10
        while not any(c.status == psutil.CONN_SYN_SENT and c.raddr and c.raddr.port == port
                      for c in psutil.Process().net_connections("tcp4")):
            assert time.monotonic() < limit, "the downloader never started connecting within 10 s"
            time.sleep(0.01)
        downloader.stop()
        thread.join(timeout=5)
        assert not thread.is_alive(), "a connect that hangs was not woken by stop()"
        assert len(raised) == 1 and isinstance(raised[0], deadlines.Cancelled), raised


def _stopped_by(signum, tmp_path, *args):
    """Starts the command on URLs that hang (a server that accepts and never answers), sends
    `signum` once the first connection is in: (seconds to exit, exit code, stderr, connections
    accepted after the signal)."""
    with Silent() as silent:
        urls = [silent.url(f"/hang/{i}.jpg") for i in range(8)]
        command = ["build", "--input", _manifest(tmp_path, urls), "--output", tmp_path / "out", "--path_column", "url",
                   "--http_per_host", 1, "--no_progress", *args]
        proc = subprocess.Popen([sys.executable, "-m", "imagerecords", *map(str, command)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            limit = time.monotonic() + 60
            while not silent.accepted:
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < limit, "the build never connected to the silent server within 60 s"
                time.sleep(0.02)
            sent = time.monotonic()
            proc.send_signal(signum)
            try:
                _, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
                pytest.fail(f"the build did not end within 30 s of {signal.Signals(signum).name}: {stderr[-2000:]}")
            took = time.monotonic() - sent
            after = [t for t in silent.settled() if t > sent]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return took, proc.returncode, stderr, after


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_an_in_process_build_blocked_on_downloads_at_once(signum, tmp_path):
    took, code, stderr, after = _stopped_by(signum, tmp_path, "--local_workers", 0, "--http_timeout", 60,
                                            "--http_deadline", 120)
    name = signal.Signals(signum).name
    assert code == 128 + signum, stderr
    assert stderr.splitlines() == [f"imagerecords build: stopped by {name}; nothing was published and "
                                   f"{tmp_path / 'out'} is as it was; rerun the same command"], stderr
    assert took < 2, f"the build took {took:.1f} s to end after {name}"
    assert after == [], f"{len(after)} connections were opened after {name}"


@pytest.mark.slow
def test_a_signal_ends_a_build_whose_forked_workers_are_blocked_on_downloads(tmp_path):
    took, code, stderr, after = _stopped_by(signal.SIGTERM, tmp_path, "--local_workers", 2, "--http_timeout", 60,
                                            "--http_deadline", 120)
    assert code == 128 + signal.SIGTERM, stderr
    assert len(stderr.splitlines()) == 1 and "stopped by SIGTERM" in stderr, stderr
    assert took < 2, f"the build took {took:.1f} s to end after SIGTERM"
    assert after == [], f"{len(after)} connections were opened after SIGTERM"



def test_one_watchdog_thread_serves_requests_one_after_another_and_ends_when_idle(monkeypatch):
    # A thread started per request cost a URL build about 5% of its CPU (its image threads leave
    # moments with none in flight); an idle Downloader still holds no thread for long.
    monkeypatch.setattr(deadlines, "LINGER_S", 0.25, raising=False)
    with Server(IMAGES) as server:
        fetcher = download.Downloader(download.HttpSettings(), None)
        fetcher.fetch(server.url("/img/s0.jpg"))
        first = fetcher._watchdog._thread
        first.join(timeout=0.1)  # a thread that ended with its request would end within this
        assert first.is_alive(), "the watchdog thread ended with the request: the next one starts another"
        for name in IMAGES:
            assert fetcher.fetch(server.url(f"/img/{name}")) == IMAGES[name]
            assert fetcher._watchdog._thread is first, "a request started a watchdog thread of its own"
        first.join(timeout=2 * 0.25 + 5)  # idle seen at its next look, then LINGER_S more
        assert not first.is_alive(), "the watchdog thread outlived the idle Downloader by 5 s"
        assert fetcher._watchdog._thread is None


def test_a_child_forked_while_the_watchdog_lingers_watches_its_own_requests():
    # A forked child has none of its parent's threads: its first request starts its own watchdog.
    with Server(IMAGES) as server:
        fetcher = download.Downloader(download.HttpSettings(), None)
        fetcher.fetch(server.url("/img/s0.jpg"))
        pid = os.fork()
        if pid == 0:
            watched = False
            try:
                fetcher.fetch(server.url("/img/s1.jpg"))
                watched = fetcher._watchdog._thread is not None and fetcher._watchdog._thread.is_alive()
            finally:
                os._exit(0 if watched else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's request had no live watchdog thread"
