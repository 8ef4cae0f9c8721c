"""Secrets and control characters out of anything shown.

A webhook URL is the user's, and users put tokens anywhere in it: ``https://user:pw@host/x?token=...``,
and in the path itself (Slack's ``/services/T0/B0/<token>``, Telegram's ``/bot<token>/``, Discord's
``/webhooks/<id>/<token>``). Wherever a URL is shown (``last_error``, run logs, the CLI), only scheme,
host and port remain, with ``/***`` appended when anything followed, so the reader still sees that
something was there (``redact_url``); ``url_origin`` (alerts) drops even that.

Free text (an error, a receiver's answer, a model's output) is searched for URLs whatever they hold: a
URL ends only at white space, so a quote or a parenthesis inside one cannot end it early and leave its
query shown (``redact_urls``). ``redact_text`` also hides credential echoes: ``Bearer ...``, a bytes
literal (httpx's "Illegal header value b'...'" quotes a header, i.e. an API key) and ``name: value`` /
``name=value`` for secret-like names. A secret this process knows by value (``remember_secrets``: secret
settings, endpoints' secrets, header values sent) is hidden first, wherever it appears, as a service may
echo one bare ("Incorrect API key provided: sk-..."). ``redact_value`` does the same inside JSON-like values, where a
secret-like key's value and every header value become ``***``. ``shown_text`` also writes control and
bidirectional characters visibly, so untrusted text cannot drive a terminal or reorder what a person reads.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import contextlib
import html
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import SplitResult, unquote, urlsplit, urlunsplit

# A URL inside free text: a scheme, "://", then everything up to white space. Quotes, brackets and
# backslashes are valid in (or next to) a query, and ending the match at one would show what follows;
# as everything after the host is hidden anyway, matching too far costs nothing but hidden text.
_URL_IN_TEXT = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]{0,31}://\S*")
# Most likely the sentence's, not the URL's: left after the redacted URL.
_TRAILING_PUNCTUATION = ".,;:)]}>'\""
# What a host name or an IP literal is made of; a host is cut at the first other character (text
# matched beyond a URL's end, e.g. ``https://host'token``).
_HOST_CHARACTERS = re.compile(r"[a-z0-9._~-]*")
_IP6_CHARACTERS = re.compile(r"[0-9a-f:.]+(?:%[a-z0-9._~-]+)?")

# C0 and C1 controls except tab and newline; the bidirectional marks and overrides that make a terminal
# or a page show text in another order than it is stored ("Trojan source"), U+061C among them; the line
# and paragraph separators (a line break to str.splitlines and many viewers); the characters that take
# no room or show as nothing: soft hyphen, combining grapheme joiner, Khmer inherent vowels, the Mongolian
# free variation selectors and vowel separator, zero-width space, joiners, word joiner, invisible operators
# and the other format characters of U+2060-U+206F, the Hangul fillers (blank letters that pass for a
# name), the BOM, interlinear annotation marks, shorthand and musical formatting controls, and the tag
# characters (invisible text that a model still reads); and lone surrogates, which no encoder writes (one
# stored before replies were cleaned shows as its code). Variation selectors: U+FE0E and U+FE0F stay, as
# many everyday emoji end in one (a red heart is U+2764 U+FE0F); the others (U+FE00-U+FE0D, U+E0100-U+E01EF) select rare
# glyph variants and are what "emoji smuggling" hides a byte per character in, so they are written out.
CONTROL_CHARACTERS = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\xad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f"
    r"\u2028\u2029\u202a-\u202e\u2060-\u206f\u3164\ud800-\udfff\ufe00-\ufe0d\ufeff\uffa0\ufff0-\ufffb"
    r"\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0000-\U000e007f\U000e0100-\U000e01ef]"
)

HIDDEN = "***"
# A secret-like name, in a JSON key or in ``name: value`` text. "tokens" (plural) is a count
# (``max_tokens``, ``input_tokens``), not a credential; "key" counts as a word of the name only,
# so ``X-Api-Key`` and ``secret_key`` are hidden and ``keywords`` or ``monkey`` are not.
_SECRET_WORDS = r"token(?!s(?:\b|_))|secret|passw(?:or)?d|authori[sz]ation|signature|cookie|credential|api_?key"
_SECRET_NAME = re.compile(rf"(?:{_SECRET_WORDS})", re.IGNORECASE)
_NAME_WORDS = re.compile(r"[a-z0-9]+")
_CAMEL_BOUNDARY = re.compile(r"([a-z0-9])([A-Z])")
# In free text: a name (a header such as X-Api-Key, a parameter such as password), an optional closing
# quote, then ``:`` or ``=``. Only the name is matched here, never its value, so a name that is not a
# secret's does not swallow a secret assignment after it; each match starts at a name's first character
# and is at most 80 long, so the scan stays linear however the text repeats.
_NAME_BEFORE_VALUE = re.compile(r"""(?<![\w-])([\w-]{1,80})(['"]?\s*[:=]\s*['"]?)""")
# In text, "key" alone is too common a word ("Key: ..."), so only the names of API and access keys count.
_KEY_NAME_IN_TEXT = re.compile(r"(?i)(?:^|[-_])(?:api|access|secret|private|client|signing)[-_]?key$")
# A value: up to white space, a quote or a separator; an authorization scheme before it goes with it.
_VALUE = re.compile(r"""(?i)(?:(?:bearer|basic|token)\s+)?[^\s'",;&})\]]+""")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[^\s'\",;]{4,}")
# A Python bytes literal, as an HTTP library quotes a header it refused (``b'Bearer sk-...'``): a ``b``
# that starts a word (not ``camp-b'``), a quote, text that neither starts nor ends with white space, and
# the same quote not followed by a letter or a quote; or, cut before its closing quote, an optional
# scheme and one word ending the text. Free text with a stray ``b'`` ("moved b' to 'camp-b' only") holds
# no such literal, and its words stay shown.
_BYTES_LITERAL = re.compile(
    r"""(?<![\w'"-])b(['"])"""
    r"""(?:(?=[^\s'"])(?:(?!\1)[^\\]|\\.)*(?<!\s)\1(?![\w'"])"""
    r"""|(?i:(?:bearer|basic|token)\s+)?[^\s'"]*\\?\Z)""",
    re.DOTALL,
)
# Whatever ``redact_text`` changes holds one of these, in ASCII text compared lower-case: a URL's "://",
# "bearer", or a piece of every secret-like name (a name ``_hide_assignments`` hides a value after holds
# one of _SECRET_WORDS or ends in "key"); a bytes literal holds b' or b". Text without any (most log
# lines and payload strings) is returned as it is, for a few substring tests instead of four regex
# scans. Other text always takes the scans: regular expressions match some non-ASCII letters
# case-insensitively ("\u017f" as "s") that a substring test would miss.
_REDACTION_HINTS = ("://", "bearer", "key", "token", "secret", "passw", "authori", "signature", "cookie", "credential")
# How deep ``redact_value`` looks; anything deeper is hidden whole.
MAX_DEPTH = 32


def _host_port(parts: SplitResult) -> tuple[str, bool]:
    """``host:port`` of a split URL (an IPv6 literal in brackets) and whether the host had to be cut.

    Raises ValueError on a bad port.
    """
    host, port = parts.hostname or "", parts.port
    if ":" in host:  # an IPv6 literal keeps its brackets
        literal = _IP6_CHARACTERS.match(host)
        kept = literal.group(0) if literal else ""
        cut, host = kept != host, f"[{kept}]"
    else:
        name = _HOST_CHARACTERS.match(host)
        kept = name.group(0) if name else ""
        cut, host = kept != host, kept
    return (host if port is None else f"{host}:{port}"), cut


def redact_url(url: str) -> str:
    """``https://user:pw@host:8443/path?token=x#frag`` -> ``https://host:8443/***``; ``https://host`` as it is.

    A path, query, fragment or user info may each hold a secret (a Slack webhook's path is its token):
    none is shown, ``/***`` says that something was there.
    """
    try:
        parts = urlsplit(url)
        host_port, cut = _host_port(parts)
    except ValueError:
        return "<unparseable URL>"
    hidden = (
        cut
        or parts.username is not None
        or parts.password is not None
        or parts.path not in ("", "/")
        or bool(parts.query)
        or bool(parts.fragment)
    )
    origin = urlunsplit((parts.scheme, host_port, "", "", ""))
    return f"{origin}/{HIDDEN}" if hidden else origin


def _each_url(text: str, shown: Callable[[str], str]) -> str:
    def replace(match: re.Match[str]) -> str:
        url = match.group(0)
        kept = url.rstrip(_TRAILING_PUNCTUATION)
        return shown(kept) + url[len(kept) :]

    return _URL_IN_TEXT.sub(replace, text)


def redact_urls(text: str) -> str:
    """Every URL inside ``text`` redacted as by ``redact_url``; a URL ends only at white space."""
    return _each_url(text, redact_url)


def url_origin(url: str) -> str:
    """``https://u:p@hooks.slack.com/services/T0/B0/secret?x`` -> ``https://hooks.slack.com``."""
    try:
        parts = urlsplit(url)
        return urlunsplit((parts.scheme, _host_port(parts)[0], "", "", ""))
    except ValueError:
        return "<unparseable URL>"


def url_origins(text: str) -> str:
    """Every URL inside ``text`` cut to its scheme and host, as by ``url_origin``."""
    return _each_url(text, url_origin)


# Secrets this process knows by value (``remember_secrets``): settings marked secret, endpoint URLs' secret
# parts and signing secrets, header values it sent. A service's error may echo one with nothing around it
# that a pattern could spot (OpenAI's 401: "Incorrect API key provided: sk-..."). Shorter values are
# not remembered: "hook" or a port would hide every word holding it.
MIN_REMEMBERED_CHARS = 8
# A process remembers at most this many (a run sends at most a batch's headers); past it, new ones are not
# remembered, so a process sending endless distinct header values cannot grow without bound.
MAX_REMEMBERED = 20_000
# The shortest piece of a secret that is hidden wherever it appears: a service that quotes a key and is cut
# by a snippet's length, or a model that repeats half of one, shows a piece, not the whole. A secret shorter
# than this is hidden only whole.
PIECE_CHARS = 12
# The authorization schemes whose token is also remembered alone ("Bearer X" -> X too).
_SCHEME_AND_TOKEN = re.compile(r"(?i)(?:bearer|basic|token|digest|bot)\s+(\S.*)")
# Standard Webhooks secrets are "whsec_" and the base64 of the key; its libraries strip the prefix and decode.
_STANDARD_WEBHOOKS_PREFIX = "whsec_"
# Headers whose values are no secret and recur in ordinary text (``application/json``, an API version
# date, a request id): never remembered. Every other header value is, as ``redact_value`` hides it.
PUBLIC_HEADERS = frozenset(
    {
        *("accept", "accept-encoding", "accept-language", "cache-control", "connection", "content-encoding"),
        *("content-length", "content-type", "host", "if-modified-since", "if-none-match", "transfer-encoding"),
        *("user-agent", "traceparent", "anthropic-version", "anthropic-beta", "openai-beta", "x-github-api-version"),
        # Ours: one execution's id and attempt, and a per-request HMAC that reveals nothing of its key.
        *("idempotency-key", "marketing-attempt", "webhook-id", "webhook-timestamp", "webhook-signature"),
    }
)

# Where an echo may be re-encoded: a run of at least PIECE_CHARS non-space characters (every encoding of a
# piece is at least that long), and inside it what hex and base64 are made of.
_ENCODED_RUN = re.compile(rf"\S{{{PIECE_CHARS},}}")
_HEX_RUN = re.compile(rf"[0-9a-fA-F]{{{2 * PIECE_CHARS},}}")
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/_-]{16,}")
_ESCAPE = re.compile(r"\\(?:u([0-9a-fA-F]{4})|x([0-9a-fA-F]{2})|U([0-9a-fA-F]{8})|(.))", re.DOTALL)
_URLSAFE_TO_STANDARD = str.maketrans("-_", "+/")
# What splits an echo over lines: a line break or the escape a JSON or Python string writes it as, with the
# indentation around it.
_LINE_BREAK = r"[\r\n\x0b\x0c\x85\u2028\u2029]|\\[nr]"
_SPACES = re.compile(r"[ \t]+")
_LINE_SPLIT = re.compile(rf"[ \t]*(?:{_LINE_BREAK})(?:[ \t]|\\t|{_LINE_BREAK})*")


def _unescaped(match: re.Match[str]) -> str:
    code = match.group(1) or match.group(2) or match.group(3)
    if code is None:
        return match.group(4)  # \" or \/ or \\: the character itself
    value = int(code, 16)
    return chr(value) if value <= 0x10FFFF else ""


def _decodings(run: str, *, whole: bool) -> Iterator[tuple[str, int, int]]:
    """What ``run`` (no white space) or a part of it may be an encoding of, with that part's span in ``run``:
    hex and base64 (standard or URL-safe, at every alignment) parts, and with ``whole`` the run URL-decoded,
    ``\\u``/``\\x``-unescaped (JSON, Python) or with its HTML character references resolved. Bytes as Latin-1,
    so an ASCII secret's piece reads the same."""
    if whole and "%" in run:
        once = unquote(run, errors="replace")
        yield once, 0, len(run)
        if "%" in once:  # encoded twice (a URL inside a query)
            yield unquote(once, errors="replace"), 0, len(run)
    if whole and "\\" in run:
        yield _ESCAPE.sub(_unescaped, run), 0, len(run)
    if whole and "&" in run:
        yield html.unescape(run), 0, len(run)
    for match in _HEX_RUN.finditer(run):
        digits = match.group(0)
        for start in (0, 1):
            usable = digits[start : start + (len(digits) - start) // 2 * 2]
            yield bytes.fromhex(usable).decode("latin-1"), match.start(), match.end()
    for match in _BASE64_RUN.finditer(run):
        alphabet = match.group(0).translate(_URLSAFE_TO_STANDARD)
        for start in range(4):
            usable = alphabet[start : start + (len(alphabet) - start) // 4 * 4]
            try:
                yield base64.b64decode(usable, validate=True).decode("latin-1"), match.start(), match.end()
            except binascii.Error:
                continue


def _may_be_encoded(text: str) -> bool:
    return "%" in text or "\\" in text or "&" in text or _BASE64_RUN.search(text) is not None


# Runs whose decodings a SecretSet keeps (``SecretSet._decoded``); past this many it starts again.
_DECODED_CACHE_SIZE = 4096
# Texts up to this long are kept as hidden (``SecretSet._hidden``), at most _DECODED_CACHE_SIZE of them.
_CACHED_TEXT_CHARS = 256
_QUAD_SLICES = tuple(slice(p, p + 4) for p in range(0, 4096, 4))


def _quad_slices(length: int) -> Sequence[slice]:
    """The slices of the quads at multiples of 4 that a text of ``length`` characters holds whole."""
    count = len(range(0, length - 3, 4))
    return _QUAD_SLICES[:count] if count <= len(_QUAD_SLICES) else [slice(p, p + 4) for p in range(0, length - 3, 4)]


class SecretSet:
    """Secrets known by value, and ``hide``: every piece of ``PIECE_CHARS`` characters of each (a shorter secret
    whole), raw, split over lines, or re-encoded as URL-encoding, ``\\u`` escapes, HTML references, hex or base64,
    replaced by ``***`` in a text.

    A piece is found by its 12-character windows: a window holds the 4-character pieces starting at the two
    multiples of 4 after its start, so the text is walked 4 characters at a time and a window is looked up only
    where two such quads of some secret follow each other (text holding none of the secrets' quads at those places
    costs one set operation). An encoded piece is found by decoding each run of non-space characters that could hold
    one, and hides the encoded part (the whole run for URL-encoding, escapes and references; the hex or base64 part).
    """

    def __init__(self, min_chars: int, limit: int | None = None) -> None:
        self.min_chars, self.limit = min_chars, limit
        self.secrets: set[str] = set()
        self._pieces: set[str] = set()
        self._quads: set[str] = set()
        self._short: tuple[str, ...] = ()  # longest first, so a secret holding another is hidden whole
        # What decoding a run found, by run: the same words recur from text to text (a campaign/stage label in
        # every execution's line), and decoding is most of what hiding costs. Emptied when a secret is added.
        self._decoded: dict[tuple[str, bool], list[tuple[int, int]]] = {}
        # Short texts as hidden: a campaign, a stage, an action recur in every execution's line of a batch.
        self._hidden: dict[str, str] = {}

    def add(self, *values: str) -> None:
        new = {v for v in values if len(v) >= self.min_chars} - self.secrets
        if self.limit is not None:
            new = set(sorted(new)[: max(self.limit - len(self.secrets), 0)])
        if not new:
            return
        short = set(self._short)
        for secret in new:
            if len(secret) < PIECE_CHARS:
                short.add(secret)
                continue
            self._pieces.update(secret[i : i + PIECE_CHARS] for i in range(len(secret) - PIECE_CHARS + 1))
            self._quads.update(secret[i : i + 4] for i in range(len(secret) - 3))
        self.secrets |= new
        self._short = tuple(sorted(short, key=len, reverse=True))
        self._decoded, self._hidden = {}, {}

    def copy(self) -> SecretSet:
        other = SecretSet(self.min_chars, self.limit)
        other.secrets, other._pieces, other._quads = set(self.secrets), set(self._pieces), set(self._quads)
        other._short = self._short
        return other

    def _found(self, view: str) -> list[tuple[int, int]]:
        """Spans of ``view`` that are pieces (or short secrets), as they stand."""
        spans: list[tuple[int, int]] = []
        pieces, quads = self._pieces, self._quads
        # A window holds the quad at the first multiple of 4 after its start: text holding none of the secrets' quads
        # at those places (most text) is done with one set operation over slices, without a Python-level loop.
        if pieces and not quads.isdisjoint(map(view.__getitem__, _quad_slices(len(view)))):
            for p in range(0, len(view) - 7, 4):
                if view[p : p + 4] in quads and view[p + 4 : p + 8] in quads:
                    starts = range(max(p - 3, 0), p + 1)
                    spans += [(s, s + PIECE_CHARS) for s in starts if view[s : s + PIECE_CHARS] in pieces]
        for secret in self._short:
            at = view.find(secret)
            while at >= 0:
                spans.append((at, at + len(secret)))
                at = view.find(secret, at + 1)
        return spans

    def _spans(self, view: str, *, whole_runs: bool = True) -> list[tuple[int, int]]:
        """``_found`` in ``view`` and each part of a run of ``view`` whose decoding holds a piece (``_decodings``)."""
        spans = self._found(view)
        if _may_be_encoded(view):
            for run in _ENCODED_RUN.finditer(view):
                key = (run.group(0), whole_runs)
                found = self._decoded.get(key)
                if found is None:
                    found = [
                        (start, end)
                        for decoded, start, end in _decodings(key[0], whole=whole_runs)
                        if self._found(decoded)
                    ]
                    if len(self._decoded) >= _DECODED_CACHE_SIZE:
                        self._decoded = {}
                    self._decoded[key] = found
                spans += [(run.start() + start, run.start() + end) for start, end in found]
        return spans

    def hide(self, text: str) -> str:
        """``text`` with every piece of every secret, raw, split over lines or re-encoded, replaced by ``***``."""
        if not self.secrets or len(text) < self.min_chars:
            return text
        if len(text) > _CACHED_TEXT_CHARS:
            return self._hide(text)
        hidden = self._hidden.get(text)
        if hidden is None:
            hidden = self._hide(text)
            if len(self._hidden) >= _DECODED_CACHE_SIZE:
                self._hidden = {}
            self._hidden[text] = hidden
        return hidden

    def _hide(self, text: str) -> str:
        spans = self._spans(text)
        # A line break is not printable, nor is any other character _LINE_SPLIT matches but the escapes' backslash.
        if ("\\" in text or not text.isprintable()) and _LINE_SPLIT.search(text):
            spans += self._split_spans(text, _LINE_SPLIT, decode=True)
        if " " in text:
            # A wrapped echo whose line breaks became spaces (a snippet kept on one line): its pieces, not decoded
            # (the words of a sentence joined would make one long run to decode).
            spans += self._split_spans(text, _SPACES, decode=False)
        if not spans:
            return text
        spans.sort()
        kept: list[str] = []
        shown_up_to = 0
        for start, end in spans:
            # A piece of "Bearer <token>" may start with the space before the token: no secret, and the text's.
            while start < end and text[start].isspace():
                start += 1
            while end > start and text[end - 1].isspace():
                end -= 1
            if end <= shown_up_to or start == end:
                continue
            if start >= shown_up_to:
                kept += [text[shown_up_to:start], HIDDEN]
            shown_up_to = end
        return "".join(kept) + text[shown_up_to:]

    def _split_spans(self, text: str, separators: re.Pattern[str], *, decode: bool) -> list[tuple[int, int]]:
        """Spans of ``text`` whose characters, with the ``separators`` between them left out, are a piece or (with
        ``decode``) an encoded one: a key wrapped over lines, base64 broken every 76 characters. Only hex and base64
        parts are decoded here: a whole run of the joined text spans several words of ``text``."""
        joined = separators.sub("", text)
        found = self._spans(joined, whole_runs=False) if decode else self._found(joined)
        if not found:
            return []
        starts: list[tuple[int, int]] = []  # (position in the joined text, position in text) of each segment
        length = position = 0
        for separator in separators.finditer(text):
            starts.append((length, position))
            length += separator.start() - position
            position = separator.end()
        starts.append((length, position))
        keys = [joined_at for joined_at, _ in starts]

        def original(at: int) -> int:
            segment = bisect.bisect_right(keys, at) - 1
            return starts[segment][1] + at - starts[segment][0]

        return [(original(start), original(end - 1) + 1) for start, end in found]


_remembered = SecretSet(MIN_REMEMBERED_CHARS, MAX_REMEMBERED)
_remembering = threading.Lock()


def remember_secrets(*values: str | None) -> None:
    """Hide each of ``values`` (and, after an authorization scheme, its token alone; a Standard Webhooks secret
    without its prefix and as its key's bytes) from all text this process redacts from now on: ``redact_text``
    and everything built on it, each piece of ``PIECE_CHARS`` and its encodings too. Empty and short values are
    ignored."""
    wanted: set[str] = set()
    for value in values:
        value = (value or "").strip()
        scheme = _SCHEME_AND_TOKEN.fullmatch(value)
        wanted.update((value, scheme.group(1).strip() if scheme else ""))
        if value.startswith(_STANDARD_WEBHOOKS_PREFIX):
            with contextlib.suppress(binascii.Error):
                wanted.add(base64.b64decode(value[len(_STANDARD_WEBHOOKS_PREFIX) :], validate=True).decode("latin-1"))
    wanted.discard("")
    if wanted <= _remembered.secrets:  # the usual case, a key sent again: no lock
        return
    with _remembering:
        _remembered.add(*wanted)


def remember_headers(headers: Mapping[str, str]) -> None:
    """``remember_secrets`` of every header value but those of ``PUBLIC_HEADERS``."""
    remember_secrets(*(value for name, value in headers.items() if name.lower() not in PUBLIC_HEADERS))


def remember_url_secrets(url: str | None, *, path_is_secret: bool = False) -> None:
    """``remember_secrets`` of what in ``url`` may be a credential: its password (with the user name), query and query
    values, fragment, and (``path_is_secret``: a webhook's, Slack's ``/services/T0/B0/<token>``) its path and
    token-like path segments. A host, a port or a plain path (``/v1``, a database file) is no secret."""
    if not url or "://" not in url:
        return
    try:
        split = urlsplit(url.strip())
        password = split.password
    except ValueError:
        return
    user_info = split.netloc.rpartition("@")[0]
    # A user name alone (a database's "postgres") is no secret; in a webhook's URL it is a token's place.
    values = [user_info if password is not None or path_is_secret else "", password, split.query, split.fragment]
    values += [value for pair in split.query.split("&") for value in pair.split("=", 1)[1:]]
    if path_is_secret:
        values += [split.path, *(s for s in split.path.split("/") if len(s) >= 16 or any(c.isdigit() for c in s))]
    remember_secrets(*values)


def remembered_snapshot() -> SecretSet:
    """A copy of what this process remembers, for ``forget_since`` (tests: one test's key must not be hidden in the
    next test's text)."""
    with _remembering:
        return _remembered.copy()


def forget_since(snapshot: SecretSet) -> None:
    """Remember exactly what ``snapshot`` (``remembered_snapshot``) held."""
    global _remembered
    with _remembering:
        _remembered = snapshot.copy()


def hide_secrets(value: Any, _depth: int = 0) -> Any:
    """``value`` (JSON-like: a transcript step, an agent's output) with every piece of every remembered secret hidden
    in its strings and keys, and nothing else changed: what is stored keeps its URLs and fields for the engine and
    an audit, but no secret this process holds (a model that repeats its key, a tool argument quoting a header)."""
    if _depth > MAX_DEPTH:
        return HIDDEN
    if isinstance(value, str):
        return _remembered.hide(value)
    if isinstance(value, Mapping):
        return {
            (_remembered.hide(k) if isinstance(k, str) else k): hide_secrets(v, _depth + 1) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [hide_secrets(item, _depth + 1) for item in value]
    return value


def redact_text(text: str) -> str:
    """``text`` with the secrets this process remembers (``remember_secrets``) hidden, its URLs redacted and
    credential echoes hidden: ``Bearer ***``, ``b'***'``, ``X-Api-Key: ***``."""
    text = _remembered.hide(text)
    return _redact_text_scanned(text) if _may_hide(text) else text


def _may_hide(text: str) -> bool:
    """False only when ``text`` (ASCII) holds none of _REDACTION_HINTS and no bytes literal's opening."""
    if not text.isascii() or "b'" in text or 'b"' in text:
        return True
    lower = text.lower()
    return any(hint in lower for hint in _REDACTION_HINTS)


def _redact_text_scanned(text: str) -> str:
    """``redact_text`` without its shortcut for text that holds nothing to redact (nor remembered secrets)."""
    text = redact_urls(text)
    text = _BYTES_LITERAL.sub(lambda m: f"b{m.group(1)}{HIDDEN}{m.group(1)}", text)
    return _BEARER.sub(lambda m: f"{m.group(1)} {HIDDEN}", _hide_assignments(text))


def _hide_assignments(text: str) -> str:
    """``X-Api-Key: v``, ``password=v``, ``"api_key": "v"`` -> the same with ``***`` for ``v``."""
    kept: list[str] = []
    shown_up_to = 0
    for name in _NAME_BEFORE_VALUE.finditer(text):
        if name.start() < shown_up_to or not (
            _SECRET_NAME.search(name.group(1)) or _KEY_NAME_IN_TEXT.search(name.group(1))
        ):
            continue
        value = _VALUE.match(text, name.end())
        if value is not None:
            kept += [text[shown_up_to : name.end()], HIDDEN]
            shown_up_to = value.end()
    return "".join(kept) + text[shown_up_to:]


def error_text(exc: BaseException) -> str:
    """``"ExceptionType: message"`` with the message redacted as by ``redact_text``.

    For errors of the HTTP stack, whose messages quote URLs and, when a request cannot be built, the
    header value it refused (an API key): stored and logged only like this.
    """
    return redact_text(f"{type(exc).__name__}: {exc}")


def is_secret_name(name: str) -> bool:
    """Whether a key or header named ``name`` holds a secret (token, secret, password, API key...)."""
    return _may_hide(name) and _names_a_secret(name)


def _names_a_secret(name: str) -> bool:
    """``is_secret_name`` without its shortcut for names that hold no secret word."""
    if _SECRET_NAME.search(name):
        return True
    return "key" in _NAME_WORDS.findall(_CAMEL_BOUNDARY.sub(r"\1_\2", name).lower())


def redact_value(value: Any, _depth: int = 0) -> Any:
    """``value`` (JSON-like) as it may be shown: a secret-like key's value and every header value ``***``,
    every string (and key) through ``redact_text``; deeper than ``MAX_DEPTH``, hidden whole.

    ``headers`` may name a secret in any header (``X-Custom: <token>``), so none of its values shows.
    """
    if _depth > MAX_DEPTH:
        return HIDDEN
    if isinstance(value, Mapping):
        shown: dict[Any, Any] = {}
        for key, item in value.items():
            name = str(key)
            shown_key = redact_text(key) if isinstance(key, str) else key
            if is_secret_name(name):
                shown[shown_key] = HIDDEN
            elif name.lower() == "headers":
                shown[shown_key] = (
                    {redact_text(str(header)): HIDDEN for header in item} if isinstance(item, Mapping) else HIDDEN
                )
            else:
                shown[shown_key] = redact_value(item, _depth + 1)
        return shown
    if isinstance(value, list | tuple):
        return [redact_value(item, _depth + 1) for item in value]
    if isinstance(value, str):
        return redact_text(value)
    return value


# A known secret shorter than this is not hidden in free text: "T0" or "hook" would hide every word holding it.
MIN_HIDDEN_CHARS = 6


def secret_parts(value: Any, _depth: int = 0) -> set[str]:
    """The pieces of ``value`` (JSON-like, e.g. a webhook payload) that ``redact_value`` hides.

    A URL's user info, path, each token-like path segment (with a digit, or long), query, each query
    value and fragment; header values and secret-like keys' values. A receiver that quotes its request
    in an error ("no hook /services/T0/B0/<token>", "bad key <value>") quotes them without a URL
    around them, which ``redact_text`` cannot spot.
    """
    parts: set[str] = set()
    if _depth > MAX_DEPTH:
        return parts
    if isinstance(value, Mapping):
        for key, item in value.items():
            name = str(key)
            if is_secret_name(name) and isinstance(item, str):
                parts.add(item)
            elif name.lower() == "headers" and isinstance(item, Mapping):
                parts.update(str(header_value) for header_value in item.values())
            else:
                parts |= secret_parts(item, _depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            parts |= secret_parts(item, _depth + 1)
    elif isinstance(value, str) and "://" in value:  # every URL holds it; the scan costs more than the test
        for match in _URL_IN_TEXT.finditer(value):
            parts |= _url_parts(match.group(0).rstrip(_TRAILING_PUNCTUATION))
    return {part for part in parts if len(part) >= MIN_HIDDEN_CHARS}


def _url_parts(url: str) -> set[str]:
    try:
        split = urlsplit(url)
    except ValueError:
        return {url}
    user_info = split.netloc.rpartition("@")[0]
    segments = [s for s in split.path.split("/") if len(s) >= 16 or any(c.isdigit() for c in s)]
    parts = {user_info, *user_info.split(":"), split.path, *segments, split.query, split.fragment}
    parts.update(value for pair in split.query.split("&") for value in pair.split("=", 1)[1:])
    return parts


def hide_values(text: str, values: set[str]) -> str:
    """``text`` with every piece of each of ``values`` hidden as ``SecretSet.hide`` hides a remembered secret's."""
    secrets = SecretSet(MIN_HIDDEN_CHARS)
    secrets.add(*values)
    return secrets.hide(text)


def _escape_control(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def shown_text(text: str) -> str:
    """``text`` as it may be shown: redacted (``redact_text``), control characters written ``\\xNN`` / ``\\uNNNN``."""
    return visible_controls(redact_text(text))


def visible_controls(text: str) -> str:
    """``text`` with each control, bidirectional, line-separator and invisible character written as ``\\xNN`` /
    ``\\uNNNN`` (``\\UNNNNNNNN`` beyond U+FFFF); tab and newline kept, for text shown on lines of its own."""
    return CONTROL_CHARACTERS.sub(_escape_control, text)


_TAB_AND_NEWLINE = str.maketrans({"\t": "\\t", "\n": "\\n"})


def visible_cell(text: str) -> str:
    """``text`` as one cell of a table row: as ``visible_controls`` writes it, and tab and newline as the two
    characters ``\\t`` and ``\\n``, so no value can break its row or forge another (``str.splitlines``
    finds no break in the result)."""
    return visible_controls(text).translate(_TAB_AND_NEWLINE)


def shown_cell(text: str) -> str:
    """``text`` redacted (``redact_text``) and on one line as ``visible_cell`` writes it."""
    return visible_cell(redact_text(text))


# OWASP's CSV-injection list: a spreadsheet evaluates a cell starting with these as a formula (tab and CR
# because some spreadsheets strip them and evaluate what follows).
_FORMULA_PREFIXES = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(text: str) -> str:
    """``text`` as a CSV cell a spreadsheet will not evaluate: ``'`` before a formula prefix, controls visible.

    Only for text values: a writer keeps an int or float (``-3``) as it is, so numbers stay numbers.
    """
    return visible_controls("'" + text if text.startswith(_FORMULA_PREFIXES) else text)


# What a Markdown renderer (GitHub-flavoured, as Dagster's UI renders metadata) or a chat's autolinker (Slack,
# Mattermost, Rocket.Chat, Discord) makes a link of needs one of: a scheme's colon ("https://", "mailto:",
# "javascript:"), a dot between a host's labels ("www.x", "evil.com/x", "1.2.3.4", "a@evil.com", the host left
# in "https://evil.com/***"), or an IPv6 literal's colons. Such a dot is written U+2024 ONE DOT LEADER and such a
# colon U+2236 RATIO: both read as what they replace, no autolinker or URL parser takes either for one, and both
# are in common Latin fonts (DejaVu Sans Mono has both). Not U+FF0E for the dot: IDNA maps it,
# U+3002 and U+FF61 to "." in a host name (so those are replaced too), while it refuses U+2024. Not U+FF1A for
# the colon: without a CJK font (headless Chromium on Debian) it shows as a box, and takes the dots beside it
# along. Nothing invisible is inserted: a receiver that drops zero-width characters would leave the link whole.
# A colon inside a name ("queue:due_lag") or a time stays as it is.
_LINKABLE = re.compile(
    r"(?P<dot>[.\u3002\uff0e\uff61](?=\S))"  # a dot with something after it: a host's label separator
    r"|(?<![\w:])(?P<ip6>[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){2,})(?![\w:])"  # an IPv6 literal
    r"|(?<![\w+-])[A-Za-z][A-Za-z0-9+.-]*(?P<scheme>:)(?=\S)"  # a scheme's colon, "//" after it or not
    r"|(?P<punct>:)(?=[^\w\s])"  # a colon before "//", "\", ":", "?", ...
)
_NOT_A_DOT, _NOT_A_COLON = "\u2024", "\u2236"


def _unlinked(match: re.Match[str]) -> str:
    if match.group("dot"):
        return _NOT_A_DOT
    if match.group("ip6") is not None:
        return match.group("ip6").replace(":", _NOT_A_COLON)
    # A scheme-shaped word may hold dots ("x.javascript:"), each followed by more of it.
    return match.group(0)[:-1].replace(".", _NOT_A_DOT) + _NOT_A_COLON


def unlinkable(text: str) -> str:
    """``text`` with nothing in it that a Markdown renderer or a chat autolinker makes a link of: schemes
    (``https:``, ``mailto:``, ``javascript:``...), ``www.``, domains, IPv4 and IPv6 addresses and e-mail
    addresses, written with look-alikes that still read the same (``https\u2236//evil\u2024com``). The same
    length as ``text``: cut before or after, alike."""
    return _LINKABLE.sub(_unlinked, text)
