"""Failures by host: the hosts with the most URLs that failed to download or were opted out, by reason
(what the build summary and the report list: link rot and opt-outs gather on a few hosts)."""

from __future__ import annotations

import collections
import re
from typing import Dict, Iterable, List, Mapping, Tuple

from imagerecords.pipeline.refs import OPTED_OUT
from imagerecords.pipeline import urls

TOP = 10  # hosts listed
_STAGES = ("download", OPTED_OUT)
_HTTP = re.compile(r"HTTP (\d{3})\b")
_DIRECTIVE = re.compile(r"says (\S+)")

# (host, URLs, ((reason kind, URLs), ...)), the kinds by count: one row of the list.
HostRow = Tuple[str, int, Tuple[Tuple[str, int], ...]]


def reason_kind(stage: str, error: str, reason: str) -> str:
    """A row's reason in a few words that group across URLs: 'HTTP 404', 'Timeout', 'opted out:
    robots.txt', 'opted out: X-Robots-Tag noai', 'opted out: tdm-reservation'."""
    if stage == OPTED_OUT:
        if "robots.txt" in reason:
            return "opted out: robots.txt" + (" unavailable" if "did not load" in reason else "")
        if "tdm-reservation" in reason:
            return "opted out: tdm-reservation"
        m = _DIRECTIVE.search(reason)
        return f"opted out: X-Robots-Tag {m.group(1)}" if m else "opted out"
    m = _HTTP.match(reason)
    return f"HTTP {m.group(1)}" if m else (error or reason[:40])


class HostCounts:
    """Counts errors.jsonl rows of URLs by host and reason kind; `add` each row, then `top()`."""

    def __init__(self):
        self._counts: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def add(self, uri: str, stage: str, error: str, reason: str) -> None:
        if stage not in _STAGES or not urls.is_url(uri):
            return
        try:
            host = urls.host_key(uri)
        except urls.BadUrl:
            return
        self._counts[host][reason_kind(stage, error, reason)] += 1

    def add_row(self, row: Mapping) -> None:
        """A parsed errors.jsonl row (the report reads them so)."""
        self.add(str(row.get("uri", "")), str(row.get("stage", "")), str(row.get("error", "")),
                 str(row.get("reason", "")))

    def top(self, n: int = TOP) -> Tuple[HostRow, ...]:
        """The `n` hosts with the most such URLs (ties by name), each with its kinds by count."""
        rows = [(host, sum(c.values()), tuple(sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))))
                for host, c in self._counts.items()]
        return tuple(sorted(rows, key=lambda r: (-r[1], r[0]))[:n])


def top_hosts(rejected: Iterable) -> Tuple[HostRow, ...]:
    """HostCounts.top over Rejected rows."""
    counts = HostCounts()
    for r in rejected:
        counts.add(r.uri, r.stage, r.error, r.reason)
    return counts.top()


def lines(rows: Iterable[HostRow]) -> List[str]:
    """The list as text, a host a line: 'host:port  N  (kind N, kind N)'."""
    return [f"{host:<30} {total:>7}  ({', '.join(f'{kind} {count}' for kind, count in kinds)})"
            for host, total, kinds in rows]


def from_json(data) -> Tuple[HostRow, ...]:
    """The rows as results.json holds them (lists), back to tuples."""
    return tuple((str(h), int(t), tuple((str(k), int(c)) for k, c in kinds)) for h, t, kinds in data or ())
