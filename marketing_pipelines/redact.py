"""Secrets and control characters out of anything shown.

A webhook URL is the user's, and users put tokens in it (``https://user:pw@host/x?token=...``).
Wherever a URL is shown (``last_error``, run logs, the CLI), only scheme, host, port and path
remain; the rest is replaced by ``***`` so the reader still sees that something was there. Where
even the path may be a secret (an alert webhook: Slack's path is its token), ``url_origins`` keeps
scheme and host only. ``shown_text`` also writes control and bidirectional characters visibly, so
untrusted text cannot drive a terminal or reorder what a person reads.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

# A URL inside free text (an error message): scheme, then anything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"""\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'"<>]+""")


# C0 and C1 controls except tab and newline, and the bidirectional overrides that make a terminal
# or a page show text in another order than it is stored ("Trojan source").
CONTROL_CHARACTERS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _host_port(parts: SplitResult) -> str:
    """``host:port`` of a split URL, an IPv6 literal in brackets; raises ValueError on a bad port."""
    host, port = parts.hostname or "", parts.port
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    return host if port is None else f"{host}:{port}"


def redact_url(url: str) -> str:
    """``https://user:pw@host:8443/path?token=x#frag`` -> ``https://***@host:8443/path?***``."""
    try:
        parts = urlsplit(url)
        host_port = _host_port(parts)
    except ValueError:
        return "<unparseable URL>"
    netloc = ("***@" if parts.username is not None or parts.password is not None else "") + host_port
    query = "***" if parts.query else ""
    fragment = "***" if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_urls(text: str) -> str:
    """Every URL inside ``text`` redacted as by ``redact_url``."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def url_origin(url: str) -> str:
    """``https://u:p@hooks.slack.com/services/T0/B0/secret?x`` -> ``https://hooks.slack.com``."""
    try:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, _host_port(parts), "", "", ""))
    except ValueError:
        return "<unparseable URL>"


def url_origins(text: str) -> str:
    """Every URL inside ``text`` cut to its scheme and host, as by ``url_origin``."""
    return _URL_IN_TEXT.sub(lambda m: url_origin(m.group(0)), text)


def _escape_control(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def shown_text(text: str) -> str:
    """``text`` as it may be shown: URLs redacted, each control character written as ``\\xNN`` / ``\\uNNNN``."""
    return CONTROL_CHARACTERS.sub(_escape_control, redact_urls(text))
