"""Secrets out of anything shown: URLs lose their credentials and their query string.

A webhook URL is the user's, and users put tokens in it (``https://user:pw@host/x?token=...``).
Wherever a URL is shown (``last_error``, run logs, the CLI), only scheme, host, port and path
remain; the rest is replaced by ``***`` so the reader still sees that something was there.
"""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

# A URL inside free text (an error message): scheme, then anything up to white space or a quote.
_URL_IN_TEXT = re.compile(r"""\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'"<>]+""")


def redact_url(url: str) -> str:
    """``https://user:pw@host:8443/path?token=x#frag`` -> ``https://***@host:8443/path?***``."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "<unparseable URL>"
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    netloc = ("***@" if parts.username is not None or parts.password is not None else "") + host
    if port is not None:
        netloc += f":{port}"
    query = "***" if parts.query else ""
    fragment = "***" if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def redact_urls(text: str) -> str:
    """Every URL inside ``text`` redacted as by ``redact_url``."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)
