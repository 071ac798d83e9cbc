"""The code examples of README.md and docs/*.md, read one way for every test that runs them: the
fenced blocks with their language, and in shell blocks the `imagerecords` commands."""

import glob
import os
import re
from typing import List, NamedTuple, Optional

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = ["README.md"] + sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)
SHELL = ("bash", "sh", "shell", "console")
COMMAND = re.compile(r"(?:\$ )?((?:imagerecords|python -m imagerecords)(?: |$).*)")


class Block(NamedTuple):
    doc: str  # relative to the repository root
    line: int  # of the opening fence
    lang: str  # what follows the opening fence ("" for none)
    code: str


class Example(NamedTuple):
    """What a test runs: a whole python block, or one command of a shell block."""

    doc: str
    line: int
    kind: str  # "python" or "command"
    code: str


def blocks(doc: str, after: Optional[str] = None) -> List[Block]:
    """The fenced blocks of `doc`, in order; with `after`, only those after the first occurrence of it."""
    with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
        text = f.read()
    start = text.index(after) + len(after) if after else 0
    return [Block(doc, text.count("\n", 0, m.start()) + 1, m.group(1).strip(), m.group(2))
            for m in FENCE.finditer(text, start)]


def python_blocks(doc: str) -> List[str]:
    return [b.code for b in blocks(doc) if b.lang == "python"]


def commands(block: Block) -> List[Example]:
    """The `imagerecords ...` (or `python -m imagerecords ...`) commands of a shell block, each with
    its continuation lines (a trailing backslash) and a leading `$ ` prompt dropped."""
    if block.lang not in SHELL:
        return []
    out, lines = [], block.code.splitlines()
    i = 0
    while i < len(lines):
        first = i
        m = COMMAND.fullmatch(lines[i].strip())
        text = [m.group(1)] if m else None
        while lines[i].rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            if text is not None:
                text.append(lines[i])
        if text is not None:
            out.append(Example(block.doc, block.line + 1 + first, "command", "\n".join(text)))
        i += 1
    return out


def examples(doc: str) -> List[Example]:
    """Every python block and every `imagerecords` command of `doc`, in order."""
    out = []
    for b in blocks(doc):
        if b.lang == "python":
            out.append(Example(doc, b.line, "python", b.code))
        out += commands(b)
    return out
