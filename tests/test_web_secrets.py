"""Secrets at rest and header checks, against a real HTTP server (tests/support/web.py): a URL's
user:password@ is a rejected row whose password no file, log or output holds; the per-host limit
counts hosts, not user names; request header values are checked before the engine starts; out of
range http settings are one line; and the token of a headers file is not pickled into the graph."""

import base64
import bz2
import json
import os
import threading
import zlib

import pytest

from conftest import build, read_examples
from support.web import Server, jpeg
from imagerecords.pipeline import urls
from imagerecords.pipeline.read import download

def _grey(size=(40, 30)):
    """A 1-channel JPEG the size of jpeg()'s: what an image feature (a mask) holds by default."""
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(np.full(size[::-1], 128, np.uint8)).save(out, format="JPEG")
    return out.getvalue()


IMAGES = {**{f"s{i:02d}.jpg": jpeg(i) for i in range(12)}, "mask.jpg": _grey()}
PASSWORD = "pw-7Qx9-never-written"
FAST = ["--http_timeout", 2, "--http_deadline", 4, "--http_retries", 0, "--max_reject_fraction", 1,
        "--num_shards", 2, "--path_column", "url"]


@pytest.fixture
def server():
    with Server(IMAGES) as s:
        yield s


def _with_user(url, userinfo):
    return url.replace("http://", f"http://{userinfo}@", 1)


def _files_holding(folder, secret):
    """Every file under `folder` (binary ones too) whose bytes hold `secret`."""
    found = []
    for where, _, names in os.walk(folder):
        for name in names:
            with open(os.path.join(where, name), "rb") as f:
                if secret in f.read():
                    found.append(os.path.join(where, name))
    return found


def _manifest(tmp_path, kind, rows):
    """A CSV or JSONL manifest of (url, label, key, mask) rows: mask an image feature's URL."""
    path = tmp_path / f"urls.{kind}"
    if kind == "csv":
        path.write_text("url,label,key,mask\n" + "".join(",".join(row) + "\n" for row in rows))
    else:
        path.write_text("".join(json.dumps({"url": u, "label": label, "mask": mask, **({"key": key} if key else {})})
                                + "\n" for u, label, key, mask in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["csv", "jsonl"])
def test_a_url_with_a_password_is_a_masked_row_held_by_no_file_or_log(server, tmp_path, capfd, kind):
    from imagerecords.cli import main as cli
    from imagerecords.cli.launcher import LOG_DIR

    mask = server.url("/img/mask.jpg")
    good = [(server.url(f"/img/s{i:02d}.jpg"), "cat", "", mask) for i in range(4)]
    secret_url = _with_user(server.url("/img/s05.jpg"), f"alice:{PASSWORD}")
    user_only = _with_user(server.url("/img/s06.jpg"), "bob")
    # A password URL, a user-only URL, a password URL as the key or the image feature of a plain URL...
    manifest = _manifest(tmp_path, kind, good + [(secret_url, "cat", "", mask), (user_only, "dog", "", mask),
                                                  (server.url("/img/s07.jpg"), "cat", secret_url, mask),
                                                  (server.url("/img/s08.jpg"), "cat", "", secret_url)])
    with open(manifest, "a") as f:  # ...and a line that does not parse, holding the password (its text is the uri)
        f.write(f'"{secret_url},cat,x"y,\n' if kind == "csv" else f'{{"url": "{secret_url}", "label": \n')
    out = tmp_path / "out"
    built = build(manifest, out, *FAST, "--key_column", "key", "--feature", "mask=image")
    assert built.num_examples == 4 and built.num_rejected == 5
    with open(out / "errors.jsonl") as f:
        rows = [json.loads(line) for line in f]
    masked = urls.masked(secret_url)
    assert masked == secret_url.replace(PASSWORD, urls.MASK) and masked != secret_url
    credentials = [r for r in rows if r["error"] == "CredentialsInUrl"]
    assert sorted((r["uri"], r["key"]) for r in credentials) == sorted([
        (masked, masked), (user_only, user_only), (server.url("/img/s07.jpg"), masked)])
    assert all("--http_headers" in r["reason"] and r["stage"] == "list" for r in credentials), credentials
    (feature,) = [r for r in rows if r["uri"] == server.url("/img/s08.jpg")]
    assert feature["reason"].startswith("the 'mask' image is a URL with credentials"), feature
    (unparsed,) = [r for r in rows if r not in credentials and r != feature]
    assert masked in unparsed["uri"], unparsed
    assert sorted(read_examples(out)) == sorted(u for u, _, _, _ in good)
    # The report page, written beside the output, and the whole output: no password bytes anywhere.
    assert cli.main(["report", str(out), "--html", str(tmp_path / "report.html")]) == 0
    captured = capfd.readouterr()
    assert PASSWORD not in captured.out + captured.err
    assert _files_holding(out, PASSWORD.encode()) == []
    assert _files_holding(tmp_path / "report.html", PASSWORD.encode()) == []
    if os.path.isdir(LOG_DIR):
        assert _files_holding(LOG_DIR, PASSWORD.encode()) == []
    assert server.requests.get("/img/s05.jpg", 0) == 0 and server.requests.get("/img/s06.jpg", 0) == 0


@pytest.mark.slow
def test_write_dataset_rows_with_a_password_url_are_masked_rows(server, tmp_path, capfd):
    import apache_beam as beam

    from imagerecords.transforms import WriteDataset

    secret_url = _with_user(server.url("/img/s05.jpg"), f"alice:{PASSWORD}")
    rows = [{"path": server.url(f"/img/s{i:02d}.jpg"), "label": "cat"} for i in range(3)]
    rows += [{"path": secret_url, "label": "cat"}, {"path": server.url("/img/s06.jpg"), "label": "dog", "key": secret_url},
             {"path": secret_url, "label": 1.5}]  # refused for its label: the row still shows the URL masked
    out = tmp_path / "wd"
    with beam.Pipeline() as p:
        _ = p | beam.Create(rows, reshuffle=False) | WriteDataset(str(out), num_shards=1, max_reject_fraction=1,
                                                                 http_retries=0)
    masked = urls.masked(secret_url)
    with open(out / "errors.jsonl") as f:
        got = sorted((r["uri"], r["key"], r["error"]) for r in map(json.loads, f))
    assert got == sorted([(masked, masked, "CredentialsInUrl"), (server.url("/img/s06.jpg"), masked, "CredentialsInUrl"),
                          (masked, "", "TypeError")]), got
    assert sorted(read_examples(out)) == sorted(r["path"] for r in rows[:3])
    captured = capfd.readouterr()
    assert PASSWORD not in captured.out + captured.err and _files_holding(out, PASSWORD.encode()) == []


def test_six_user_names_on_one_host_share_its_slots(tmp_path):
    with Server(IMAGES, delay=0.05) as server:
        names = [f"s{i:02d}.jpg" for i in range(12)]
        wanted = [_with_user(server.url(f"/img/{n}"), f"user{i % 6}") for i, n in enumerate(names)]
        d = download.Downloader(download.HttpSettings(per_host=2, workers=16, retries=0), max_bytes=None)
        got, start = {}, threading.Barrier(len(wanted))

        def fetch(url):
            start.wait(timeout=10)
            got[url] = d.fetch(url)

        threads = [threading.Thread(target=fetch, args=(u,)) for u in wanted]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads), "a download did not end within 30 s"
        assert {u.rsplit("/", 1)[1]: b for u, b in got.items()} == {n: IMAGES[n] for n in names}
        assert server.max_in_flight == 2, server.max_in_flight  # reached, and never passed


def test_a_host_key_counts_host_and_port_only():
    assert download.host_of("http://a@Example.org/x") == download.host_of("HTTP://b:c@example.org:80/y") == "example.org:80"
    assert download.host_of("https://example.org/x") != download.host_of("http://example.org/x")
    with pytest.raises(download.Failed) as e:
        download.host_of("http://example.org:99999/x")
    assert e.value.error == "BadUrl" and "99999" not in str(e.value)


SECRET = "v4lue-s3cret"
# (case, the headers file's text, what the one line says after the file's name)
BAD_FILES = [
    ("bom", f"\ufeffAuthorization: {SECRET}\n", "line 1 holds a byte order mark"),
    ("non_latin1", f"Authorization: {SECRET}\u20ac\n", "line 1 holds a character outside Latin-1 (U+20AC)"),
    ("cr", f"X-Team: vision\nAuthorization: {SECRET}\rX-Injected: 1\n", "line 2 holds a control character (U+000D)"),
    ("nul", f"Authorization: {SECRET}\0\n", "line 1 holds a control character (U+0000)"),
    ("duplicate", f"Authorization: {SECRET}\nX-Team: a\nauthorization: {SECRET}2\n",
     "line 3 names authorization again (line 1)"),
    ("lines", "".join(f"X-H{i}: {SECRET}\n" for i in range(101)), "over 100 lines"),
    ("bytes", f"Authorization: {SECRET}{'x' * 65536}\n", "over 64 KiB"),
]


def _cli_build(tmp_path, *flags):
    from imagerecords.cli import main as cli

    manifest = tmp_path / "urls.csv"
    manifest.write_text("url,label\nhttp://127.0.0.1:9/x.jpg,cat\n")
    return cli.main(["build", "--input", str(manifest), "--output", str(tmp_path / "out"), "--path_column", "url",
                     "--no_progress", *flags])


@pytest.mark.parametrize("case, text, said", BAD_FILES, ids=[c[0] for c in BAD_FILES])
def test_a_bad_headers_file_is_exit_2_in_one_line_without_its_value(tmp_path, capsys, case, text, said):
    headers = tmp_path / "headers.txt"
    headers.write_bytes(text.encode("utf-8"))
    code = _cli_build(tmp_path, "--http_headers", str(headers))
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert f"--http_headers {headers}: {said}" in err, err
    assert SECRET not in err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("case, value, said", [
    ("bom", f"\ufeff{SECRET}", "byte order mark"),
    ("non_latin1", f"{SECRET}\u00e9\u4e2d", "character outside Latin-1 (U+4E2D)"),
    ("cr", f"{SECRET}\rX-Injected: 1", "control character (U+000D)"),
    ("lf", f"{SECRET}\nX-Injected: 1", "control character (U+000A)"),
    ("nul", f"{SECRET}\0", "control character (U+0000)"),
], ids=["bom", "non_latin1", "cr", "lf", "nul"])
def test_a_bad_user_agent_is_exit_2_in_one_line_without_its_value(tmp_path, capsys, case, value, said):
    code = _cli_build(tmp_path, "--http_user_agent", value)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, (code, err)
    assert f"--http_user_agent holds a {said}" in err, err
    assert SECRET not in err and not (tmp_path / "out").exists()


def test_a_bad_user_agent_from_python_is_an_imagerecords_error(tmp_path):
    import imagerecords

    manifest = tmp_path / "urls.csv"
    manifest.write_text("url,label\nhttp://127.0.0.1:9/x.jpg,cat\n")
    with pytest.raises(imagerecords.Error) as e:
        imagerecords.build(str(manifest), str(tmp_path / "out"), path_column="url", http_user_agent=f"{SECRET}\r\n")
    assert str(e.value) == "http_user_agent holds a control character (U+000D); header values are one line of text"


def test_a_good_headers_file_reads_with_comments_and_crlf_line_ends(tmp_path):
    headers = tmp_path / "headers.txt"
    headers.write_bytes(b"# token\r\nAuthorization: Bearer abc\r\n\r\nX-Team:  vision\t\r\n")
    assert download.read_headers(str(headers)) == (("Authorization", "Bearer abc"), ("X-Team", "vision"))


def test_a_headers_file_a_worker_cannot_read_fails_the_build_not_each_row(server, tmp_path):
    # An OSError would be each URL's rejected row ("file not found"), the file's name in errors.jsonl.
    gone = str(tmp_path / "gone.txt")
    read = download.reader(download.HttpSettings(headers_file=gone), None, files=None)
    with pytest.raises(download.HeadersUnreadable) as e:
        read(server.url("/img/s00.jpg"))
    assert not isinstance(e.value, OSError) and "a worker cannot read it (No such file or directory)" in str(e.value)
    assert sum(server.requests.values()) == 0


@pytest.mark.parametrize("flag, value, said", [
    ("--http_per_host", "3000000000", "http_per_host must be within 1..1024, got 3000000000"),
    ("--http_workers", "3000000000", "http_workers must be within 1..1024, got 3000000000"),
    ("--http_retries", "10000000000000000000000", "http_retries must be within 0..100"),
    ("--http_timeout", "inf", "http_timeout must be > 0 and at most 86400 seconds, got inf"),
    ("--http_deadline", "1e300", "http_deadline must be > 0 and at most 86400 seconds"),
])
def test_http_settings_past_what_a_worker_can_hold_are_one_line(tmp_path, capsys, flag, value, said):
    code = _cli_build(tmp_path, flag, value)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and said in err, (code, err)
    assert not (tmp_path / "out").exists()


def _graph_payloads(pipeline):
    """The bytes of every transform a runner would store for `pipeline`, its pickled DoFns unpacked
    (Beam's pickler writes them compressed, bz2 or zlib, and base64-encoded)."""
    from apache_beam.portability.api import beam_runner_api_pb2

    proto = pipeline.to_runner_api()
    out = [proto.SerializeToString()]
    for transform in proto.components.transforms.values():
        if transform.spec.urn != "beam:transform:pardo:v1":
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload).do_fn.payload
        out.append(_unpacked(payload))
    return out


def _unpacked(payload):
    try:
        packed = base64.b64decode(payload, validate=True)
        return bz2.decompress(packed) if packed.startswith(b"BZh") else zlib.decompress(packed)
    except (ValueError, OSError, zlib.error):
        return payload  # not one of the pickler's: searched as it is


def test_the_pickled_graph_holds_no_token_of_the_headers_file(tmp_path):
    import apache_beam as beam

    from imagerecords.pipeline.config import BuildConfig
    from imagerecords.builder.engines.beam.graph import build_pipeline
    from imagerecords.pipeline.publish.build import Build
    from imagerecords.pipeline.sources.manifests import ManifestSource
    from imagerecords.transforms import WriteDataset

    token = b"Bearer t0ken-in-no-graph-81c2"
    headers = tmp_path / "headers.txt"
    headers.write_bytes(b"Authorization: " + token + b"\n")
    manifest = tmp_path / "urls.csv"
    manifest.write_text("url,label\nhttp://127.0.0.1:9/x.jpg,cat\n")
    agent = "probe-agent/7"  # travels in the same settings: proves the search sees them
    config = BuildConfig.of(input=str(manifest), output=str(tmp_path / "out"), path_column="url",
                         http_headers=str(headers), http_user_agent=agent)
    info = ManifestSource().check(config)
    p = beam.Pipeline()
    build_pipeline(p, Build(config, "b", {}), input_info=info)
    q = beam.Pipeline()
    _ = (q | beam.Create([{"path": "http://127.0.0.1:9/x.jpg", "label": "cat"}])
         | WriteDataset(str(tmp_path / "wd"), http_headers=str(headers), http_user_agent=agent))
    for graph in (p, q):
        payloads = _graph_payloads(graph)
        assert any(agent.encode() in b for b in payloads), "the search found no pickled download settings"
        assert not any(token in b for b in payloads)
