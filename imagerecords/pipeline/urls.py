"""What the builder reads out of an http(s) URL, spelled once: whether a uri is one, whether it
parses, the host and port a per-host limit counts, the origin that request headers belong to, and
the URL as it may be written anywhere (its password masked)."""

from __future__ import annotations

import re
import urllib.parse
from typing import NamedTuple, Optional

_DEFAULT_PORTS = {"http": 80, "https": 443}
# user:password@ in an authority; used when the URL does not parse and urlsplit cannot say where it is.
_USERINFO_AT = r"(https?://)([^/?#@]*)@"
_USERINFO = re.compile("^" + _USERINFO_AT, re.IGNORECASE)
_USERINFO_ANYWHERE = re.compile(_USERINFO_AT, re.IGNORECASE)
MASK = "***"


class BadUrl(ValueError):
    """A URL that cannot be requested; str() is a reason that never holds the URL's password."""


class Origin(NamedTuple):
    """The (scheme, host, port) a request goes to: headers and credentials belong to one origin."""

    scheme: str
    host: str
    port: int


def is_url(uri: str) -> bool:
    lower = uri[:8].lower()
    return lower.startswith("http://") or lower.startswith("https://")


def parse(url: str) -> urllib.parse.SplitResult:
    """urlsplit(url), checked: an http(s) scheme, a host, a port in range. Raises BadUrl."""
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number or out of range
        host = parts.hostname
    except ValueError as e:
        raise _unparsable(e) from None
    if parts.scheme.lower() not in _DEFAULT_PORTS:
        raise BadUrl(f"the URL's scheme is {parts.scheme or 'missing'!r}: only http and https are read")
    if not host:
        raise BadUrl("the URL has no host")
    if port == 0:
        raise BadUrl("the URL's port is 0")
    return parts


def origin(url: str) -> Origin:
    """The URL's origin; raises BadUrl."""
    parts = parse(url)
    scheme = parts.scheme.lower()
    return Origin(scheme, parts.hostname.lower(), parts.port or _DEFAULT_PORTS[scheme])


def host_key(url: str) -> str:
    """'host:port' (lower case, default port filled in, no user name): what --http_per_host counts."""
    o = origin(url)
    host = f"[{o.host}]" if ":" in o.host else o.host
    return f"{host}:{o.port}"


def has_userinfo(url: str) -> bool:
    return _USERINFO.match(url) is not None


def masked(url: str) -> str:
    """`url` with the password of a user:password@ part replaced by ***; safe to write or log."""
    m = _USERINFO.match(url)
    return url if m is None else _mask(m) + url[m.end():]


def masked_text(text: str) -> str:
    """`text` (a manifest line, a message) with the password of every http(s) URL in it masked."""
    return _USERINFO_ANYWHERE.sub(_mask, text) if "@" in text else text


def _mask(m: "re.Match") -> str:
    user, sep, _ = m.group(2).partition(":")
    return f"{m.group(1)}{user}{':' + MASK if sep else ''}@"


def join(base: str, reference: str) -> str:
    """The URL `reference` (a Location header's value, as http.client decoded it) leads to from
    `base`. http.client decodes header bytes as latin-1: the bytes are got back and the non-ASCII ones
    percent-quoted, so a UTF-8 path stays UTF-8 (as browsers send it). Raises BadUrl."""
    raw = reference.encode("latin-1", "replace").strip(bytes(range(0x21)))  # as browsers: no edge spaces or controls
    quoted = "".join(chr(b) if 0x20 < b < 0x7F else f"%{b:02X}" for b in raw)
    try:
        return urllib.parse.urljoin(base, quoted)
    except ValueError as e:
        raise _unparsable(e) from None


# Python's messages, in our words: a message may quote the URL's text (a server's, for a Location).
_REASONS = (("Invalid IPv6 URL", "an unclosed [ or ] in its host"),
            ("cannot be in brackets", "an IPv4 address in [...]"),
            ("out of range", "the port is out of range 0-65535"),
            ("could not be cast", "the port is not a number"),
            ("does not appear to be an IPv4 or IPv6 address", "a [...] host that is not an IP address"))


def _unparsable(e: ValueError) -> BadUrl:
    said = next((ours for theirs, ours in _REASONS if theirs in str(e)), "malformed")
    return BadUrl(f"the URL does not parse ({said})")


def describe(url: Optional[str]) -> str:
    """A URL for a message: masked, and cut to 300 characters."""
    if url is None:
        return "(none)"
    text = masked(url)
    return text if len(text) <= 300 else text[:297] + "..."
