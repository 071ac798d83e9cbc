"""`imagerecords build --help` says what the code does and what the docs say."""

import os

from support.web import Server, jpeg

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _help(flag):
    """One flag's help text as --help prints it, whitespace collapsed."""
    from imagerecords.cli import flags

    (action,) = [a for a in flags.parser()._actions if flag in a.option_strings]
    return " ".join((action.help % {}).split())


def test_the_user_agent_help_shows_the_header_a_download_sends():
    from imagerecords.pipeline.read.download import Downloader, HttpSettings

    with Server({"a.jpg": jpeg(0)}) as server:
        assert Downloader(HttpSettings(), None).fetch(server.url("/img/a.jpg")) == jpeg(0)
    (sent,) = [h["User-Agent"] for h in server.headers]
    assert sent.startswith("imagerecords/") and _help("--http_user_agent").endswith(f"(default: {sent})")


def test_the_detached_help_says_what_docs_clusters_says():
    with open(os.path.join(ROOT, "docs", "clusters.md"), encoding="utf-8") as f:
        docs = " ".join(f.read().split())
    said = "the job's last step publishes the dataset"
    assert said in docs and "`imagerecords finish OUT` only completes a commit cut short" in docs
    text = _help("--detached")
    assert said in text and "only completes a commit that was cut short" in text, text
