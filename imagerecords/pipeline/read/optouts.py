"""Opt-outs: the machine-readable ways a site says "not for AI training", read before a URL's body:
X-Robots-Tag directives (global, or addressed to our token), the TDM reservation header, and the
origin's robots.txt for our token. Spelled once here; the downloader (download.py) asks, per hop.

A refused URL is not downloaded (its body is never read) and becomes an errors.jsonl row of stage
'opted_out', which no reject budget counts."""

from __future__ import annotations

import dataclasses
import re
from typing import Iterable, Optional, Tuple

# The product token robots.txt groups and X-Robots-Tag lines are matched against (the start of our User-Agent).
AGENT = "imagerecords"
# img2dataset's default --disallowed_header_directives: the same set, so a site that opted out there is out here.
DEFAULT_DIRECTIVES = ("noai", "noimageai", "noindex", "noimageindex")
ROBOTS_CHOICES = ("obey", "ignore")
# A robots.txt is read up to this many bytes (RFC 9309 asks crawlers to parse at least 500 KiB).
ROBOTS_MAX_BYTES = 512 * 1024
# X-Robots-Tag directives that carry a value after a colon: such a line does not name an agent.
_VALUED = frozenset({"unavailable_after", "max-snippet", "max-image-preview", "max-video-preview"})
_AGENT_TOKEN = re.compile(r"[A-Za-z0-9_.-]+")
_SAFE = re.compile(r"[^\x21-\x7e]")  # what a rule quoted in a reason may hold: visible ASCII


@dataclasses.dataclass(frozen=True)
class OptOutSettings:
    """What counts as an opt-out (BuildConfig's disallowed_header_directives and robots_txt).

    Attributes:
      directives: X-Robots-Tag directives that refuse a URL (lower case); empty: the header is not read.
      robots_txt: 'obey' (read each origin's robots.txt for AGENT) or 'ignore'.
      tdm: whether `tdm-reservation: 1` refuses a URL (on whenever the directives are).
    """

    directives: Tuple[str, ...] = DEFAULT_DIRECTIVES
    robots_txt: str = "obey"

    @property
    def tdm(self) -> bool:
        return bool(self.directives)

    @property
    def obey_robots(self) -> bool:
        return self.robots_txt == "obey"


def normalized(directives: Iterable[str]) -> Tuple[str, ...]:
    return tuple(sorted({d.strip().lower() for d in directives if d.strip()}))


def directive_problem(directive: str) -> Optional[str]:
    """Why `directive` cannot be one of --disallowed_header_directives, or None."""
    if not _AGENT_TOKEN.fullmatch(directive.strip()):
        return f"{directive[:40]!r} is not a directive (letters, digits, '_', '.', '-')"
    return None


def header_refusal(lines: Iterable[str], tdm: Iterable[str], settings: OptOutSettings) -> Optional[str]:
    """The reason a response's headers refuse its URL, or None: `lines` are its X-Robots-Tag header
    lines, `tdm` its tdm-reservation values. A line is `directive, directive` (for every agent) or
    `agent: directive, ...` (for that agent only); the first refusing directive is named."""
    wanted = set(settings.directives)
    if wanted:
        for line in lines:
            head, sep, rest = line.partition(":")
            agent = head.strip().lower()
            if sep and _AGENT_TOKEN.fullmatch(agent) and agent not in _VALUED:
                if agent != AGENT:
                    continue  # addressed to another crawler
                said, scope = rest, f"X-Robots-Tag for {AGENT}"
            else:
                said, scope = line, "X-Robots-Tag"
            for directive in said.split(","):
                d = directive.strip().lower()
                if d in wanted:
                    return f"opted out: {scope} says {d} (--disallowed_header_directives)"
    if settings.tdm and any(v.strip() == "1" for v in tdm):
        return "opted out: tdm-reservation: 1 (text and data mining rights reserved)"
    return None


class Robots:
    """One origin's robots.txt, parsed (protego), or its verdict when it did not load."""

    def __init__(self, origin: str, text: Optional[str] = None, refusal: Optional[str] = None):
        self.origin = origin
        self._refusal = refusal  # set: every URL of the origin is refused with it
        self._parser = None
        if text is not None:
            from protego import Protego  # the build extra; imported only by a build that reads robots.txt

            self._parser = Protego.parse(text)

    def refusal(self, url: str) -> Optional[str]:
        """The reason robots.txt refuses `url` for AGENT, or None when it may be fetched."""
        if self._refusal is not None:
            return self._refusal
        if self._parser is None or self._parser.can_fetch(url, AGENT):
            return None
        return f"opted out: robots.txt of {self.origin} {_rule(self._parser, url)}"


def unavailable(origin: str, why: str) -> Robots:
    """An origin whose robots.txt did not load for a server error or a timeout: all of it is refused."""
    return Robots(origin, refusal=f"opted out: robots.txt of {origin} did not load ({why}); the site is "
                                  "treated as disallowed for this build (RFC 9309)")


def _rule(parser, url: str) -> str:
    """'disallows PATTERN (User-agent: GROUP)': the rule that refused `url`, read from protego's rule
    set (not its public API: when it changes, the reason says less, never wrong)."""
    try:
        group = parser._get_matching_rule_set(AGENT)
        # protego: 10.5 ms to import; only a build that reads robots.txt needs it
        from protego._utils import _quote_path

        path = _quote_path(url)
        for rule in [*group._rules, *group._special_rules]:
            if rule.field == "disallow" and rule.value.match(path):
                pattern = _SAFE.sub("?", rule.value._pattern)[:100]
                return f"disallows {pattern} (User-agent: {_SAFE.sub('?', group.user_agent)[:40]})"
    except Exception:  # noqa: BLE001 - protego's internals moved: say less
        pass
    return f"disallows this path for {AGENT}"
