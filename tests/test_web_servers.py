"""Servers and URLs that misbehave, against two real HTTP servers (tests/support/web.py): one on
127.0.0.1, another reached as localhost on its own port (a second host to the client). One build
downloads every case; each test asserts on one case's record or errors.jsonl row, and on what the
servers received."""

import socket
import time
import urllib.parse

import pytest

from conftest import build, read_examples
from support.web import SERVER_WORDS, Server, jpeg
from test_web_inputs import FAST, _errors, _manifest
from imagerecords.pipeline.read import download

IMAGES = {f"q{i}.jpg": jpeg(40 + i) for i in range(6)}
IMAGES["ü.jpg"] = jpeg(50)
SECRET = "Bearer s3cr3t-for-the-first-host"
LOCATION_PASSWORD = "pw-in-a-location-9c1e"


def _to(server, target: str) -> str:
    """A URL on `server` that redirects (302) to `target`, sent as its raw bytes."""
    return server.url("/to/" + urllib.parse.quote(target.encode("utf-8"), safe=""))


@pytest.fixture(scope="module")
def web(tmp_path_factory):
    """The servers, a port that refuses connections, and the one build of every case's row."""
    tmp = tmp_path_factory.mktemp("web")
    refusing = socket.socket()  # bound, never listening: a connect is refused while we hold it
    refusing.bind(("127.0.0.1", 0))
    refused_port = refusing.getsockname()[1]
    with Server(IMAGES) as first, Server(IMAGES, name="localhost") as second, refusing:
        rows = {
            "plain": first.url("/img/q0.jpg"),
            "to_other_host": _to(first, second.url("/img/q1.jpg")),
            "to_other_port": _to(first, second.url("/img/q2.jpg", name="127.0.0.1")),
            "same_host": first.url("/redirect/q3.jpg"),
            "gzip": first.url("/gzip/q4.jpg"),
            "utf8_location": _to(first, "/img/ü.jpg"),
            "bad_row_bracket": "http://[::1/x.jpg",
            "bad_row_host": "http://[zz]:80/x.jpg",
            "bad_row_port": f"http://127.0.0.1:{10 ** 6}/x.jpg",
            "bad_location_bracket": _to(first, "http://[::1/x.jpg"),
            "bad_location_port": _to(first, f"http://user:{LOCATION_PASSWORD}@127.0.0.1:99999/x.jpg"),
            "bad_location_scheme": _to(first, "gopher://127.0.0.1/x.jpg"),
            "refused": f"http://127.0.0.1:{refused_port}/x.jpg",
            "no_such_name": "http://nonexistent.invalid/x.jpg",
            "501": first.url("/status/501"),
            "505": first.url("/status/505"),
            "599": first.url("/status/599"),
            "type": first.url("/status/200"),
            "not_http": first.url("/nothttp"),
            "not_gzip": first.url("/notgzip/q5.jpg"),
            "unknown_encoding": first.url("/encoded/q5.jpg"),
            "4gib": first.url("/huge"),
        }
        headers = tmp / "headers.txt"
        headers.write_text(f"Authorization: {SECRET}\n")
        out = tmp / "out"
        started = time.monotonic()
        manifest = build(_manifest(tmp, [(url, "cat") for url in rows.values()]), out, *FAST,
                         "--http_headers", headers, "--http_user_agent", "servers-test/1.0")
        took = time.monotonic() - started
        yield {"rows": rows, "first": first, "second": second, "manifest": manifest, "out": out,
               "examples": read_examples(out), "errors": _errors(out), "took": took}


def _reason(web, case):
    row = web["errors"][web["rows"][case]]
    assert row["stage"] == "download", row
    return row["reason"]


def test_a_token_reaches_the_first_host_and_no_other_after_a_redirect(web):
    first, second, rows = web["first"], web["second"], web["rows"]
    for case in ("to_other_host", "to_other_port"):
        sent = first.headers_of[urllib.parse.urlsplit(rows[case]).path]
        assert [h.get("Authorization") for h in sent] == [SECRET], case
    received = {path: hs for path, hs in second.headers_of.items()}
    assert sorted(received) == ["/img/q1.jpg", "/img/q2.jpg"]  # localhost:B and 127.0.0.1:B: other origins
    for path, hs in received.items():
        assert [h.get("Authorization") for h in hs] == [None], path
        assert all(h.get("User-Agent") == "servers-test/1.0" and h.get("Accept") for h in hs), hs
    for name in ("q1.jpg", "q2.jpg"):  # and the redirect was followed to the image
        stored = web["examples"][rows[f"to_other_{'host' if name == 'q1.jpg' else 'port'}"]]
        assert stored.features.feature["image"].bytes_list.value[0] == IMAGES[name]


def test_a_same_host_redirect_keeps_the_token(web):
    first = web["first"]
    assert [h.get("Authorization") for h in first.headers_of["/redirect/q3.jpg"]] == [SECRET]
    assert [h.get("Authorization") for h in first.headers_of["/img/q3.jpg"]] == [SECRET]


def test_only_the_origin_of_the_row_gets_the_headers():
    same = download._same_origin
    assert same("http://a.example/x", "HTTP://A.example:80/y")
    assert not same("https://a.example/x", "http://a.example/x")  # down to http: another origin
    assert not same("https://a.example:8443/x", "http://a.example:8443/x")
    assert not same("http://a.example/x", "http://a.example:8080/x")
    assert not same("http://a.example/x", "http://b.example/x")


def test_malformed_urls_and_locations_are_one_row_each_and_the_rest_is_published(web):
    manifest, rows = web["manifest"], web["rows"]
    good = ["plain", "to_other_host", "to_other_port", "same_host", "gzip", "utf8_location"]
    assert sorted(web["examples"]) == sorted(rows[c] for c in good)
    assert manifest.num_examples == len(good) and manifest.num_rejected == len(rows) - len(good)
    assert sorted(web["errors"]) == sorted(u for c, u in rows.items() if c not in good)
    expected = {
        "bad_row_bracket": "the URL does not parse (an unclosed [ or ] in its host)",
        "bad_row_host": "the URL does not parse (a [...] host that is not an IP address)",
        "bad_row_port": "the URL does not parse (the port is out of range 0-65535)",
        "bad_location_bracket": "HTTP 302 redirect refused (the Location: the URL does not parse (an unclosed [ or ] "
                                "in its host))",
        "bad_location_port": "HTTP 302 redirect refused (the Location: the URL does not parse (the port is out of "
                             "range 0-65535))",
        "bad_location_scheme": "HTTP 302 redirect to a gopher: URL refused: only http and https are followed",
    }
    for case, reason in expected.items():
        assert _reason(web, case) == reason, case
        assert web["errors"][rows[case]]["error"] in ("BadUrl", "RefusedScheme")
    for case in ("bad_location_bracket", "bad_location_port", "bad_location_scheme"):  # not retried
        assert web["first"].requests[urllib.parse.urlsplit(rows[case]).path] == 1, case


def test_a_refused_port_and_a_name_that_does_not_resolve_say_so_untried_again(web):
    assert _reason(web, "refused") == "connection refused: nothing listens at that host and port"
    assert _reason(web, "no_such_name") == "the host name does not resolve"
    assert web["took"] < 30, f"the build took {web['took']:.0f} s"


def test_only_the_listed_statuses_are_retried_and_no_reason_holds_the_servers_words(web):
    assert download.RETRY_STATUSES == {429, 500, 502, 503, 504}  # docs/building.md lists these
    assert _reason(web, "501") == "HTTP 501 (Not Implemented)"
    assert _reason(web, "505") == "HTTP 505 (HTTP Version Not Supported)"
    assert _reason(web, "599") == "HTTP 599 (unknown status)"
    assert _reason(web, "type") == "not an image: the server sent a type under text/"
    assert _reason(web, "not_http") == "the server's answer is not valid HTTP"
    for path in ("/status/501", "/status/505", "/status/599", "/nothttp"):
        assert web["first"].requests[path] == 1, path  # FAST allows one retry: none was made
    for row in web["errors"].values():
        assert SERVER_WORDS not in row["reason"] and LOCATION_PASSWORD not in row["reason"], row


def test_a_gzip_body_longer_than_its_plain_form_is_stored_byte_exact(web):
    import gzip

    assert len(gzip.compress(IMAGES["q4.jpg"], compresslevel=0)) > len(IMAGES["q4.jpg"])  # the case: as served
    stored = web["examples"][web["rows"]["gzip"]].features.feature["image"].bytes_list.value[0]
    assert stored == IMAGES["q4.jpg"]  # the decoded body, as a plain answer would give
    assert web["first"].requests["/gzip/q4.jpg"] == 1


def test_a_body_that_does_not_decode_as_its_encoding_says_is_one_row_not_retried(web):
    assert _reason(web, "not_gzip") == "the body does not decode as its Content-Encoding says"
    assert _reason(web, "unknown_encoding").startswith(
        "the body is in a Content-Encoding this client does not decode (it decodes gzip, x-gzip, deflate")
    assert web["first"].requests["/notgzip/q5.jpg"] == 1 and web["first"].requests["/encoded/q5.jpg"] == 1


def test_a_utf8_location_is_followed_to_its_image(web):
    stored = web["examples"][web["rows"]["utf8_location"]].features.feature["image"].bytes_list.value[0]
    assert stored == IMAGES["ü.jpg"]
    assert web["first"].requests["/img/%C3%BC.jpg"] == 1


def test_a_4gib_content_length_is_refused_unread(web):
    assert _reason(web, "4gib") == ("too large: the server declares 4,294,967,296 bytes, over the 1,000,000-byte "
                                    "limit (--max_file_mb); nothing was read")
    assert web["first"].requests["/huge"] == 1


def test_a_reset_mid_body_says_how_far_it_got_over_the_wire():
    with Server({}) as s:
        with pytest.raises(download.Failed) as e:
            download.Downloader(download.HttpSettings(retries=0), max_bytes=None).fetch(s.url("/resetmid"))
    assert e.value.error == "ConnectionError"
    assert str(e.value).startswith("truncated: the connection ended after 10,000 of 20,000 bytes"), e.value
