"""The web group: the corpus built from a manifest of http URLs (served by a local HTTP/1.1 server in
its own process) against the same images built from a manifest of local paths, same run."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from typing import Callable, List, Sequence

# img2dataset, the tool users download URL lists with, when installed (its own environment is best:
# its requirements pin other numpy/pyarrow versions): IMAGERECORDS_IMG2DATASET=/path/to/img2dataset.
IMG2DATASET = os.environ.get("IMAGERECORDS_IMG2DATASET") or shutil.which("img2dataset")

# A threaded HTTP/1.1 file server on a port the kernel picks; it prints the port, then serves.
_SERVER = r"""
import functools, http.server, sys
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    def log_message(self, *a): pass
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(H, directory=sys.argv[1]))
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
"""


# The same file server with opt-outs: /o/REL answers with `X-Robots-Tag: noai` and holds its body
# HOLD_S for a client that closes at the headers (so a refused body is never sent), /private/REL is
# disallowed by its robots.txt; /__stats says how many opted-out bodies went out and how many
# disallowed paths were asked for (/__reset zeroes them). /p/REL is REL plain: the same bytes for the
# runs that download everything (the ceiling, the build without opt-outs), which no hold should slow.
_OPTOUT_SERVER = r"""
import functools, http.server, json, os, select, socket, sys, threading
HOLD_S = 0.05  # a client that refuses closes within it, even on 2 busy cores
ROBOTS = b"User-agent: *\nDisallow: /private/\n"
stats, lock = {"optout_bodies": 0, "private_requests": 0}, threading.Lock()
class H(http.server.SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def log_message(self, *a): pass
    def _raw(self, body, kind="text/plain", status=200):
        self.send_response(status); self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        if self.path == "/robots.txt":
            return self._raw(ROBOTS)
        if self.path in ("/__stats", "/__reset"):
            with lock:
                said = json.dumps(stats).encode()  # the counts so far, then zeroed by /__reset
                if self.path == "/__reset":
                    stats.update(optout_bodies=0, private_requests=0)
            return self._raw(said, "application/json")
        if self.path.startswith("/private/"):
            with lock:
                stats["private_requests"] += 1
            self.path = self.path[len("/private"):]
        if self.path.startswith("/p/"):  # the /o/ images without opt-out or hold, for the runs that read them all
            self.path = self.path[len("/p"):]
        if self.path.startswith("/o/"):
            data = open(os.path.join(sys.argv[1], self.path[3:]), "rb").read()
            self.send_response(200); self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(data))); self.send_header("X-Robots-Tag", "noai")
            self.end_headers(); self.wfile.flush()
            if select.select([self.connection], [], [], HOLD_S)[0]:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        self.close_connection = True; return
                except OSError:
                    self.close_connection = True; return
            self.wfile.write(data)
            with lock:
                stats["optout_bodies"] += 1
            return
        return super().do_GET()
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(H, directory=sys.argv[1]))
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
"""


def _manifest(path: str, rows: Sequence[str], column: str) -> None:
    with open(path, "w") as f:
        f.write(f"{column},label\n")
        f.writelines(rows)


def _stats(port: int, path: str = "/__stats") -> dict:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}") as f:
        return json.load(f)


# The bare fetch ceiling, a command of its own (timed as our build is, start-up included): a pool of
# THREADS threads downloading every URL of the file argv[1] whole with keep-alive, checking nothing.
_CEILING = r"""
import concurrent.futures, sys, urllib3
urls = [line.split(",", 1)[0] for line in open(sys.argv[1]).read().splitlines()[1:]]
threads = int(sys.argv[2])
pool = urllib3.PoolManager(maxsize=threads, block=True)
with concurrent.futures.ThreadPoolExecutor(threads) as ex:
    sizes = list(ex.map(lambda u: len(pool.request("GET", u).data), urls))
assert all(sizes), "an empty body"
"""

# The checked ceiling: the build's processes and threads downloading only the images it keeps (argv[1]) and
# giving each the builder's own per-image check (codec.prepare_image: a pass-through JPEG's draft
# decode, the others' re-encode, the perceptual hash), writing nothing. What any build that checks
# what it stores has to do: the bare ceiling above checks nothing, so on few cores no build reaches it.
_CHECKED_CEILING = r"""
import concurrent.futures, multiprocessing, sys
urls = [line.split(",", 1)[0] for line in open(sys.argv[1]).read().splitlines()[1:]]
workers, threads = int(sys.argv[2]), int(sys.argv[3])
def process(part):  # in a process of its own (one GIL per core, as the build's workers): a pool of threads
    import urllib3
    from imagerecords.pipeline.encode import image_codec
    pool, options = urllib3.PoolManager(maxsize=threads, block=True), image_codec.ImageOptions()
    check = lambda url: len(image_codec.prepare_image(pool.request("GET", url).data, options, True).data)
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        return list(ex.map(check, urls[part::workers]))
with multiprocessing.get_context("fork").Pool(workers) as processes:
    sizes = [size for part in processes.map(process, range(workers)) for size in part]
assert len(sizes) == len(urls) and all(sizes), "an empty image"
"""


def bench_web_optouts(res, files: List[str], root: str, work: str, r: int, run_watched: Callable,
                      build_cmd: Callable) -> None:
    """One URL manifest in which every 10th image says `X-Robots-Tag: noai` and every 10th (offset 5)
    lies under a path robots.txt disallows: our build (opt-outs on, the default) against
    img2dataset 1.47 (same URLs, processes and threads per process), a bare fetch pool and a checked one; images/s
    over the URLs, peak memory, and how many opted-out images each downloaded."""
    server = subprocess.Popen([sys.executable, "-c", _OPTOUT_SERVER, root], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        rels = [os.path.relpath(p, root).replace(os.sep, "/") for p in files]
        prefix = ["o/" if i % 10 == 0 else "private/" if i % 10 == 5 else "" for i in range(len(rels))]
        urls = [f"http://127.0.0.1:{port}/{pre}{rel}" for pre, rel in zip(prefix, rels)]
        opted = sum(1 for pre in prefix if pre)
        manifest = os.path.join(work, "optout-urls.csv")
        _manifest(manifest, [f"{u},{rel.split('/', 1)[0]}\n" for u, rel in zip(urls, rels)], "url")
        plain = os.path.join(work, "optout-plain-urls.csv")  # the same images, nothing opted out, nothing held
        _manifest(plain, [f"{u.replace('/o/', '/p/')},{rel.split('/', 1)[0]}\n" for u, rel in zip(urls, rels)], "url")
        kept = os.path.join(work, "optout-kept-urls.csv")  # the images a build with the opt-outs on keeps
        _manifest(kept, [f"{u},{rel.split('/', 1)[0]}\n" for u, rel, pre in zip(urls, rels, prefix) if not pre], "url")
        n = len(urls)
        workers = os.cpu_count() or 1
        threads = 16
        _stats(port, "/__reset")
        out = os.path.join(work, f"web-optouts-{r}")
        # one host: --http_per_host as many as the others fetch at once (img2dataset and the pool have no such limit)
        same = ["--path_column", "url", "--threads", str(threads), "--local_workers", str(workers),
                "--http_per_host", str(workers * threads)]
        wall, rss = run_watched(build_cmd(manifest, out, *same))
        ours = _stats(port, "/__reset")
        res.add("web_optouts", "urls_img_s", n / wall, "img/s")
        res.add("web_optouts", "urls_peak_rss", rss, "MB", higher_is_better=False)
        res.add("web_optouts", "urls_opted_out_downloaded", ours["optout_bodies"] + ours["private_requests"], "images",
                higher_is_better=False)
        # the same images with the checks off and no opt-out served: every one downloaded and written
        out = os.path.join(work, f"web-optouts-off-{r}")
        off, _ = run_watched(build_cmd(plain, out, *same, "--robots_txt", "ignore", "--disallowed_header_directives", ""))
        res.add("web_optouts", "urls_checks_off_img_s", n / off, "img/s")
        res.add("web_optouts", "urls_vs_checks_off", n / wall, "img/s", baseline="web_optouts/urls_checks_off_img_s")
        # the ceiling: the same images, all fetched whole, by as many threads as our build downloads with
        took, ceiling_rss = run_watched([sys.executable, "-c", _CEILING, plain, str(workers * threads)])
        res.add("web_optouts", "ceiling_img_s", n / took, "img/s")
        res.add("web_optouts", "ceiling_peak_rss", ceiling_rss, "MB", higher_is_better=False)
        res.add("web_optouts", "urls_vs_ceiling", n / wall, "img/s", baseline="web_optouts/ceiling_img_s")
        # the checked ceiling: the kept images fetched and checked as the build does, on as many threads;
        # a rate over all n URLs, as ours (it sends no request for the opted-out ones: less work than ours)
        took, _ = run_watched([sys.executable, "-c", _CHECKED_CEILING, kept, str(workers), str(threads)])
        res.add("web_optouts", "checked_ceiling_img_s", n / took, "img/s")
        res.add("web_optouts", "urls_vs_checked_ceiling", n / wall, "img/s",
                baseline="web_optouts/checked_ceiling_img_s")
        _stats(port, "/__reset")
        res.notes.append(f"web_optouts: {n} URLs, {opted} opted out (X-Robots-Tag: noai or robots.txt); ours "
                         f"downloaded {ours['optout_bodies']} opted-out bodies and asked for "
                         f"{ours['private_requests']} disallowed paths")
        if not IMG2DATASET:
            res.notes.append("web_optouts: img2dataset not measured (not installed; set IMAGERECORDS_IMG2DATASET)")
            return
        out = os.path.join(work, f"web-optouts-img2dataset-{r}")
        wall, rss = run_watched([IMG2DATASET, manifest, "--input_format", "csv", "--url_col", "url",
                                 "--caption_col", "label", "--output_format", "files", "--output_folder", out,
                                 "--processes_count", str(workers), "--thread_count", str(threads),
                                 "--resize_mode", "no", "--disable_all_reencoding", "True",
                                 "--number_sample_per_shard", "1000", "--timeout", "30", "--retries", "0"])
        theirs = _stats(port, "/__reset")
        res.add("web_optouts", "img2dataset_img_s", n / wall, "img/s")
        res.add("web_optouts", "img2dataset_peak_rss", rss, "MB", higher_is_better=False)
        res.add("web_optouts", "img2dataset_opted_out_downloaded",
                theirs["optout_bodies"] + theirs["private_requests"], "images", higher_is_better=False)
        res.notes.append(f"web_optouts: img2dataset downloaded {theirs['optout_bodies']} X-Robots-Tag opted-out "
                         f"bodies and fetched {theirs['private_requests']} robots.txt-disallowed images (it does not "
                         "read robots.txt)")
        shutil.rmtree(out, ignore_errors=True)
    finally:
        server.terminate()
        server.wait()


def bench_web(res, files: List[str], root: str, work: str, r: int, run_watched: Callable, build_cmd: Callable) -> None:
    server = subprocess.Popen([sys.executable, "-c", _SERVER, root], stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline())
        rels = [os.path.relpath(p, root).replace(os.sep, "/") for p in files]
        labels = [rel.split("/", 1)[0] for rel in rels]
        urls, paths = os.path.join(work, "urls.csv"), os.path.join(work, "paths.csv")
        _manifest(urls, [f"http://127.0.0.1:{port}/{rel},{label}\n" for rel, label in zip(rels, labels)], "url")
        _manifest(paths, [f"{p},{label}\n" for p, label in zip(files, labels)], "path")
        n = len(files)
        out = os.path.join(work, f"web-files-{r}")
        wall, rss = run_watched(build_cmd(paths, out))
        res.add("web", "files_img_s", n / wall, "img/s")
        res.add("web", "files_peak_rss", rss, "MB", higher_is_better=False)
        out = os.path.join(work, f"web-urls-{r}")
        started = time.perf_counter()
        wall, rss = run_watched(build_cmd(urls, out, "--path_column", "url"))
        res.add("web", "urls_img_s", n / wall, "img/s", baseline="web/files_img_s")
        res.add("web", "urls_peak_rss", rss, "MB", higher_is_better=False, baseline="web/files_peak_rss")
        res.notes.append(f"web: {n} images over a local HTTP/1.1 server (one process, threads); "
                         f"the URL build took {time.perf_counter() - started:.1f} s")
        if not IMG2DATASET:
            res.notes.append("web: img2dataset not measured (not installed; set IMAGERECORDS_IMG2DATASET)")
            return
        # Its `files` output, the same URLs, as many processes as our local engine's workers and the
        # same downloads per process; no resize and no re-encode (our build passes JPEGs through).
        out = os.path.join(work, f"web-img2dataset-{r}")
        wall, rss = run_watched([IMG2DATASET, urls, "--input_format", "csv", "--url_col", "url", "--caption_col",
                                 "label", "--output_format", "files", "--output_folder", out, "--processes_count",
                                 str(os.cpu_count() or 1), "--thread_count", "16", "--resize_mode", "no",
                                 "--disable_all_reencoding", "True", "--number_sample_per_shard", "1000",
                                 "--timeout", "30", "--retries", "0"])
        got = sum(1 for _, _, names in os.walk(out) for name in names
                  if not name.endswith((".json", ".txt", ".parquet")))  # one image file per URL it stored
        res.add("web", "img2dataset_img_s", got / wall, "img/s")
        res.add("web", "img2dataset_peak_rss", rss, "MB", higher_is_better=False)
        res.add("web", "urls_vs_img2dataset", res.groups["web"]["urls_img_s"]["runs"][-1], "img/s",
                baseline="web/img2dataset_img_s")
        res.add("web", "urls_peak_rss_vs_img2dataset", res.groups["web"]["urls_peak_rss"]["runs"][-1], "MB",
                higher_is_better=False, baseline="web/img2dataset_peak_rss")
        res.notes.append(f"web: img2dataset ({IMG2DATASET}) stored {got} of {n} images as files")
        shutil.rmtree(out, ignore_errors=True)
    finally:
        server.terminate()
        server.wait()
