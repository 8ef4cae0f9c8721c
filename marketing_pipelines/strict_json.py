"""Strict JSON for untrusted text: what PostgreSQL would refuse (NaN, Infinity, 1e400) is refused here first."""

from __future__ import annotations

import json
import math
from typing import Any

from marketing_pipelines.errors import InvalidInput


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):  # 1e400 parses to inf
        raise ValueError(f"number {text[:40]} is out of range")
    return number


def loads_json(text: str) -> Any:
    """``json.loads`` that refuses what is not JSON to PostgreSQL: NaN, Infinity, 1e400 (ValueError).

    Python's json accepts all three; PostgreSQL refuses them, and SQLite would store non-JSON.
    """
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)


def parse_json_object(value: str | None, name: str) -> dict[str, Any]:
    """Parse a user-given JSON object (empty means {}); errors name ``name`` and the position."""
    if value is None or value.strip() == "":
        return {}
    try:
        parsed = loads_json(value)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"{name} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except ValueError as exc:  # NaN / Infinity: Python's json accepts them, JSON and PostgreSQL do not
        raise InvalidInput(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(f"{name} must be a JSON object, got {type(parsed).__name__}")
    return parsed
