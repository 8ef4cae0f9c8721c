"""Strict JSON for untrusted text: what PostgreSQL would refuse (NaN, Infinity, 1e400) is refused here first,
and so is nesting deeper than MAX_JSON_DEPTH, which Python's parser and encoder handle by recursion."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from marketing_pipelines.errors import InvalidInput

# No payload, tool argument or agent input needs more; json.loads and json.dumps recurse once per level and
# raise RecursionError (not ValueError) near 1000, sooner on a deeper call stack.
MAX_JSON_DEPTH = 64
# A document that wraps such values in a few levels of its own (a model's response around tool arguments).
MAX_ENVELOPE_DEPTH = 2 * MAX_JSON_DEPTH
# A string (brackets inside it do not count), to its closing quote or, unterminated, to the end of the text, or
# a bracket. A string always matches where it starts, so the scan never retries inside one: linear (a pattern
# that required the closing quote would rescan the rest of the text from every quote of '\\"[]' * 50000).
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\[\s\S]?[^"\\]*)*"?|[\[\]{}]')


# A code point of U+D800-U+DFFF in a Python str is always alone: a pair, even escaped in JSON
# ("\ud83d\ude00"), decodes to the one character it encodes. A lone one is no Unicode text: UTF-8
# cannot encode it, PostgreSQL refuses it in text and in jsonb, SQLite stores what no reader can print.
# Python reads each byte of a command line that is not UTF-8 as one of U+DC80-U+DCFF.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def holds_lone_surrogate(text: str) -> bool:
    return _LONE_SURROGATE.search(text) is not None


def escaped_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written ``\\udNNN``, as JSON would escape it; other text as it is."""
    if not holds_lone_surrogate(text):
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def lone_surrogate_text(value: Any) -> str | None:
    """The first string of ``value`` (its keys included, at any depth) that holds a lone surrogate, else None."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            if holds_lone_surrogate(item):
                return item
        elif isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return None


def refuse_lone_surrogates(value: Any, name: str) -> None:
    """Raise InvalidInput naming ``name`` and showing the text (escaped, cut at 80) when ``value`` holds a lone
    surrogate (``lone_surrogate_text``): no database stores it, so it is refused where it enters."""
    text = lone_surrogate_text(value)
    if text is not None:
        # Imported here: redaction compiles its patterns on import, and this module loads with the CLI's parsing.
        from marketing_pipelines.redact import visible_cell

        shown = visible_cell(escaped_surrogates(text))
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise InvalidInput(f"{name} holds text that is not valid Unicode (a lone surrogate): '{shown}'")


def without_lone_surrogates(value: Any) -> Any:
    """``value`` (parsed JSON) with every lone surrogate of its strings, keys included, replaced by U+FFFD.

    For text this process must keep rather than refuse, such as a model's reply: stored as it is, it
    would fail the statement that writes it on PostgreSQL.
    """
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {without_lone_surrogates(k): without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [without_lone_surrogates(v) for v in value]
    return value


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400 parses to inf
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def _too_deep(max_depth: int) -> ValueError:
    return ValueError(f"nested deeper than {max_depth} levels")


def check_text_depth(text: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError when the arrays and objects of JSON ``text`` nest deeper than ``max_depth``.

    Checked before parsing, so a hostile text never reaches the parser's recursion. Linear; a text with
    no more brackets than ``max_depth`` (nearly every one) costs two ``str.count`` calls.
    """
    if text.count("[") + text.count("{") <= max_depth:
        return
    depth = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        char = text[match.start()]
        if char in "[{":
            depth += 1
            if depth > max_depth:
                raise _too_deep(max_depth)
        elif char in "]}":
            depth -= 1


def check_depth(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise ValueError when the dicts and lists of an already-parsed ``value`` nest deeper than ``max_depth``.

    For JSON another parser read (an HTTP client's ``response.json()``), before anything recurses over it.
    Iterative, so the check itself cannot hit the recursion limit.
    """
    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > max_depth:
            raise _too_deep(max_depth)
        pending.extend((child, depth + 1) for child in children)


def loads_json(text: str, max_depth: int | None = MAX_JSON_DEPTH) -> Any:
    """``json.loads`` that refuses what is not JSON to PostgreSQL: NaN, Infinity, 1e400 (ValueError).

    Python's json accepts all three; PostgreSQL refuses them, and SQLite would store non-JSON. Nesting
    deeper than ``max_depth`` is refused too (ValueError), before parsing. ``None`` leaves the depth to
    the parser (RecursionError past its limit), for callers that store deeper JSON and handle that.
    """
    if max_depth is not None:
        check_text_depth(text, max_depth)
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def parse_json_object(value: str | None, name: str) -> dict[str, Any]:
    """Parse a user-given JSON object (empty means {}); errors name ``name`` and the position."""
    if value is None or value.strip() == "":
        return {}
    try:
        parsed = loads_json(value)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # NaN / Infinity (Python's json accepts them, JSON and PostgreSQL do not), depth
        raise InvalidInput(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(f"{name} must be a JSON object, got {type(parsed).__name__}")
    refuse_lone_surrogates(parsed, name)
    return parsed
