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


def _manifest(path: str, rows: Sequence[str], column: str) -> None:
    with open(path, "w") as f:
        f.write(f"{column},label\n")
        f.writelines(rows)


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
