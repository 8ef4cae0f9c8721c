"""Reading JSON text with orjson where that reads exactly as ``strict_json.loads_json`` does, else with loads_json."""

from __future__ import annotations

from typing import Any

import orjson

from marketing_pipelines.strict_json import loads_json

# orjson reads an integer beyond 64 bits as a float (2**70 would be stored as 1.1805916207174113e+21); a
# text holding 19 digits in a row goes to the exact parser instead. Mapping every digit to "0" and looking
# for 19 zeros is a few times faster than a regular expression, and this runs once per line.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_ZEROS = b"0" * 19


def may_hold_a_long_integer(data: bytes) -> bool:
    return _NINETEEN_ZEROS in data.translate(_DIGITS_TO_ZERO)


def loads_strict(text: str) -> tuple[Any, bool]:
    """(value, json_native) of a JSON text, exactly as ``loads_json`` reads it and raising what it raises.

    orjson reads the common case, several times faster; anything it refuses or could read differently
    (integers beyond 64 bits) goes to ``loads_json``, so the value and every error message stay its own.
    ``json_native`` says the value came from orjson: only JSON types, valid Unicode, 64-bit integers.
    """
    if not may_hold_a_long_integer(text.encode("utf-8", "surrogatepass")):
        try:
            return orjson.loads(text), True
        except orjson.JSONDecodeError:
            pass
    return loads_json(text, max_depth=None), False  # as deep as orjson reads; past json's depth, RecursionError
