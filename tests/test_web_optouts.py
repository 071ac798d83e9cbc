"""Opt-outs, on by default, against the real test server (tests/support/web.py): a URL whose site says
no (X-Robots-Tag for every agent or for imagerecords, tdm-reservation: 1, robots.txt for the token
imagerecords) is one errors.jsonl row of stage opted_out, and the server sent none of its body; a
redirect into a disallowed path is refused; with the flags off the same URLs are records; each origin's
robots.txt is requested once per worker process; a robots.txt that 404s allows, one that 503s disallows."""

import json
import os

import pytest

from conftest import build
from support.web import Server, jpeg

IMAGES = {f"p{i:02d}.jpg": jpeg(i) for i in range(12)}
ROBOTS = ("User-agent: *\nDisallow: /held/private/\n\n"
          "User-agent: otherbot\nDisallow: /held/otheragent/\n")
ARGS = ["--path_column", "url", "--num_shards", "1", "--local_workers", "1", "--http_retries", "0",
        "--http_timeout", "5", "--http_deadline", "10", "--max_reject_fraction", "1"]
# path: (the reason's start, or None for a record)
CASES = {
    "/noai/p00.jpg": "opted out: X-Robots-Tag says noai",
    "/ours/p01.jpg": "opted out: X-Robots-Tag for imagerecords says noimageai",
    "/lines/p02.jpg": "opted out: X-Robots-Tag says noimageindex",
    "/tdm/p03.jpg": "opted out: tdm-reservation: 1",
    "/held/private/p04.jpg": "opted out: robots.txt of {origin} disallows /held/private/ (User-agent: *)",
    "/theirs/p05.jpg": None,  # X-Robots-Tag addressed to another crawler
    "/held/otheragent/p06.jpg": None,  # robots.txt disallows it for another agent only
    "/img/p07.jpg": None,
}
REDIRECT = "/to/%2Fheld%2Fprivate%2Fp08.jpg"  # a 302 into the disallowed path


def _manifest(tmp_path, urls):
    path = tmp_path / "urls.csv"
    path.write_text("url,label\n" + "".join(f"{u},cat\n" for u in urls))
    return path


def _errors(out):
    with open(os.path.join(out, "errors.jsonl")) as f:
        return {r["uri"]: r for r in map(json.loads, f)}


@pytest.mark.slow
def test_each_opt_out_is_a_row_and_no_body_byte_of_it_was_sent(tmp_path, capsys):
    with Server(IMAGES, robots=ROBOTS) as server:
        urls = [server.url(p) for p in [*CASES, REDIRECT]]
        out = tmp_path / "out"
        manifest = build(_manifest(tmp_path, urls), out, *ARGS)
        origin = f"http://127.0.0.1:{server.port}"
        errors = _errors(out)
        refused = {p: r for p, r in CASES.items() if r}
        assert sorted(errors) == sorted([server.url(p) for p in refused] + [server.url(REDIRECT)])
        for path, reason in refused.items():
            row = errors[server.url(path)]
            assert row["stage"] == "opted_out" and row["reason"].startswith(reason.format(origin=origin)), row
            assert server.body_sent[path] == 0, path  # the response was closed after its headers
        row = errors[server.url(REDIRECT)]
        assert row["stage"] == "opted_out" and "disallows /held/private/" in row["reason"], row
        # robots.txt refuses before any request: neither the disallowed path nor the redirect's target was asked for
        assert server.requests["/held/private/p04.jpg"] == 0 and server.requests["/held/private/p08.jpg"] == 0
        assert server.requests[REDIRECT] == 1
        # the records are the other URLs, their bodies sent whole
        assert manifest.num_examples == sum(1 for r in CASES.values() if r is None)
        assert server.body_sent["/theirs/p05.jpg"] == len(IMAGES["p05.jpg"])
        assert server.body_sent["/held/otheragent/p06.jpg"] == len(IMAGES["p06.jpg"])
        # counted apart: no reject, no budget; in the manifest and the summary
        assert manifest.num_rejected == 0 and manifest.num_opted_out == 6
        with open(out / "manifest.json") as f:
            assert json.load(f)["num_opted_out"] == 6
        said = capsys.readouterr().out
        assert "  opted out            6 URLs whose sites said no" in said, said
        assert f"127.0.0.1:{server.port}" in said and "opted out: robots.txt 2" in said, said
        assert len(server.robots_headers) == 1
        # the report page: the opted-out rows apart from the rejected ones, and the hosts
        from imagerecords.cli import main as cli

        page = tmp_path / "report.html"
        assert cli.main(["report", str(out), "--html", str(page)]) == 0
        html = page.read_text()
        assert '<b data-total="opted_out">6</b>' in html and "<h3>Opted out (URLs whose sites said no" in html
        assert "<h3>Rejected: 0</h3>" in html and 'data-kind="opted_out"' in html
        assert f"<td><code>127.0.0.1:{server.port}</code></td><td class=n>6</td>" in html.replace(' class="n"', " class=n"), html[-3000:]


def test_with_the_flags_off_they_are_records(tmp_path):
    with Server(IMAGES, robots=ROBOTS) as server:
        paths = [p for p, r in CASES.items() if r] + [REDIRECT]
        out = tmp_path / "out"
        manifest = build(_manifest(tmp_path, [server.url(p) for p in paths]), out, *ARGS,
                         "--disallowed_header_directives", "", "--robots_txt", "ignore")
        assert manifest.num_examples == len(paths) and manifest.num_opted_out == 0
        assert len(server.robots_headers) == 0
        for path in paths[:-1]:
            assert server.body_sent[path] == len(IMAGES[path.rsplit("/", 1)[1]]), path


def test_robots_txt_is_requested_once_per_origin_per_worker(tmp_path):
    with Server(IMAGES, robots=ROBOTS) as server:
        # two origins (127.0.0.1 and localhost), six URLs each, fetched by 4 threads at once
        urls = [server.url(f"/img/p{i:02d}.jpg", name) for i in range(6) for name in ("127.0.0.1", "localhost")]
        manifest = build(_manifest(tmp_path, urls), tmp_path / "out", *ARGS, "--threads", "4")
        assert manifest.num_examples == 12
        assert len(server.robots_headers) == 2
        agents = {h.get("User-Agent") for h in server.robots_headers}
        assert len(agents) == 1 and next(iter(agents)).startswith("imagerecords/"), agents


@pytest.mark.parametrize("status, records, said", [
    pytest.param(404, 2, "", id="404"), pytest.param(503, 0, "did not load (HTTP 503", id="503"),
    pytest.param(0, 0, "did not load (timed out waiting for the answer", id="timeout", marks=pytest.mark.slow)])
def test_a_robots_txt_404_allows_and_a_503_or_a_timeout_disallows(tmp_path, status, records, said):
    from imagerecords.pipeline.errors import BudgetExceeded

    with Server(IMAGES, robots_status=status) as server:
        urls = [server.url("/img/p00.jpg"), server.url("/img/p01.jpg"), server.url("/missing")]
        out = tmp_path / "out"
        try:
            manifest = build(_manifest(tmp_path, urls), out, *ARGS, "--http_timeout", "0.5")
        except BudgetExceeded as e:  # every URL refused: nothing to publish, said in one line
            assert records == 0 and "opted out by its site" in str(e), e
        else:
            assert manifest.num_examples == records
        errors = _errors(out) if records else _staged_errors(out)
        if records:
            assert errors[server.url("/missing")]["stage"] == "download"
            assert server.requests["/img/p00.jpg"] == 1
        else:
            for url in urls:
                row = errors[url]
                assert row["stage"] == "opted_out", row
                assert "robots.txt of" in row["reason"] and said in row["reason"], row
            assert server.requests["/img/p00.jpg"] == 0
        assert len(server.robots_headers) == 1  # --http_retries 0


def _staged_errors(out):
    """errors.jsonl of a build that published nothing (its staging area keeps the reasons)."""
    found = [os.path.join(d, "errors.jsonl") for d, _, names in os.walk(out) if "errors.jsonl" in names]
    assert len(found) == 1, found
    with open(found[0]) as f:
        return {r["uri"]: r for r in map(json.loads, f)}


@pytest.mark.parametrize("flags, said", [
    (["--robots_txt", "sometimes"], "argument --robots_txt: invalid choice: 'sometimes'"),
    (["--disallowed_header_directives", "noai,no ai"], "disallowed_header_directives: 'no ai' is not a directive"),
], ids=["robots_txt", "directive"])
def test_a_bad_opt_out_flag_is_exit_2_in_one_line(tmp_path, capsys, flags, said):
    from imagerecords.cli import main as cli

    manifest = _manifest(tmp_path, ["http://127.0.0.1:9/x.jpg"])
    code = cli.main(["build", "--input", str(manifest), "--output", str(tmp_path / "out"), "--path_column", "url",
                     "--no_progress", *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and said in err, (code, err)
    assert not (tmp_path / "out").exists()


def test_the_hosts_list_counts_failed_and_opted_out_urls_by_host_and_reason():
    from imagerecords.pipeline.refs import Rejected
    from imagerecords.pipeline.publish import hosts

    rows = [Rejected(f"http://dead.example:80/{i}.jpg", "HTTP 404 (Not Found)", stage="download", error="HTTPError")
            for i in range(3)]
    rows += [Rejected("https://a.example/x.jpg", "opted out: X-Robots-Tag says noai (--disallowed_header_directives)",
                      stage="opted_out", error="OptedOut"),
             Rejected("https://a.example/y.jpg", "timed out: no byte for 2 s (after 2 tries)", stage="download",
                      error="Timeout"),
             Rejected("/local/z.jpg", "cannot read file: missing", stage="read"),  # not a URL: not listed
             Rejected("http://b.example/z.jpg", "does not decode", stage="decode")]  # downloaded: not listed
    rows += [Rejected(f"http://h{i:02d}.example/x.jpg", "HTTP 500 (Internal Server Error) (after 5 tries)",
                      stage="download", error="HTTPError") for i in range(12)]
    top = hosts.top_hosts(rows)
    assert len(top) == hosts.TOP
    assert top[0] == ("dead.example:80", 3, (("HTTP 404", 3),))
    assert top[1] == ("a.example:443", 2, (("Timeout", 1), ("opted out: X-Robots-Tag noai", 1)))
    assert [h for h, _, _ in top[2:]] == [f"h{i:02d}.example:80" for i in range(8)]
