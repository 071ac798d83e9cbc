"""Every link in README.md and docs/*.md leads somewhere: a file of the repository, and, with an
anchor, a heading of that file (GitHub's anchors: lower case, punctuation dropped, spaces as '-')."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


# A README section named in words: `README, "Publishing a dataset"`, `the README's "Scale" section`,
# `(README, Benchmarks)`.
README_SECTION = re.compile(r"""README(?:'s|,)\s+"([^"]+)"|\(README,\s+([A-Z][^()"]*?)\)""")


def headings(path):
    """The text of a markdown file's headings, outside fenced blocks."""
    with open(path, encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    return re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M)


def anchors(path):
    """The anchors GitHub makes for a markdown file's headings."""
    out, seen = set(), {}
    for heading in headings(path):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(doc):
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = FENCE.sub("", f.read())
    for target in LINK.findall(text):
        if not re.match(r"[a-z]+:", target):  # a URL is not ours to check here
            yield target


@pytest.mark.parametrize("doc", DOCS)
def test_every_link_leads_to_a_file_and_a_heading(doc):
    broken = []
    for target in links(doc):
        path, _, anchor = target.partition("#")
        file = os.path.normpath(os.path.join(ROOT, os.path.dirname(doc), path)) if path else os.path.join(ROOT, doc)
        if not os.path.exists(file):
            broken.append(f"{target}: no file {os.path.relpath(file, ROOT)}")
        elif anchor and file.endswith(".md") and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {os.path.relpath(file, ROOT)}")
    assert not broken, f"{doc}: " + "; ".join(broken)


def readme_sections(text):
    """The README sections a text names in words, each as written."""
    return [" ".join((a or b).split()) for a, b in README_SECTION.findall(FENCE.sub("", text))]


@pytest.mark.parametrize("doc", DOCS[1:])
def test_every_readme_section_named_in_words_is_a_heading_of_the_readme(doc):
    """Links are checked above; a section named in prose must exist too, or the reader finds nothing."""
    have = {h.lower() for h in headings(os.path.join(ROOT, "README.md"))}
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        named = readme_sections(f.read())
    assert [name for name in named if name.lower() not in have] == [], f"{doc} names README sections it lacks"


def test_the_checker_reads_readme_sections_named_in_words():
    text = ('see README, "Publishing a dataset" and the README\'s "Scale" section (README,\nBenchmarks);\n'
            "the README's test command, (a README, a CSV)\n```\nREADME, \"In a fence\"\n```\n")
    assert readme_sections(text) == ["Publishing a dataset", "Scale", "Benchmarks"]


def test_the_checker_sees_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## Two words, here\n```\n# not a heading\n```\n")
    assert anchors(str(tmp_path / "a.md")) == {"title", "two-words-here"}


def test_the_readme_is_a_front_door():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        assert sum(1 for _ in f) < 400  # the rest belongs in docs/
