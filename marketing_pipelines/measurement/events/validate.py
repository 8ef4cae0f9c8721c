"""Validating one decoded event: field limits, the timestamp, the properties' JSON; the event and row it yields."""

from __future__ import annotations

import json
from collections.abc import Container, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import orjson
import sqlalchemy as sa

from marketing_pipelines.db.schema import campaign
from marketing_pipelines.measurement.events.json_text import loads_strict

REQUIRED_FIELDS = ("event_id", "campaign_id", "stage", "event_type", "occurred_at")
MAX_LENGTHS = {"event_id": 200, "campaign_id": 64, "stage": 64, "event_type": 64, "actor_id": 200, "source": 64}
_MAX_EVENT_ID = MAX_LENGTHS["event_id"]
_MAX_SHORT = min(MAX_LENGTHS["campaign_id"], MAX_LENGTHS["stage"], MAX_LENGTHS["event_type"])
MAX_PROPERTIES_BYTES = 16 * 1024
# Clocks of senders drift; an event a day ahead of ours is a bad timestamp, not clock skew.
MAX_FUTURE_SKEW = timedelta(days=1)
MIN_OCCURRED_AT = datetime(2000, 1, 1, tzinfo=UTC)
COMPARED_FIELDS = ("campaign_id", "stage", "event_type", "occurred_at", "source", "actor_id", "properties")


class InvalidEvent(ValueError):
    """One event cannot be accepted; the message is the reject reason."""


class EventRow(NamedTuple):
    """A validated event as the write paths take it; fields 1 to 7 are COMPARED_FIELDS, in that order."""

    event_id: str
    campaign_id: str
    stage: str
    event_type: str
    occurred_at: datetime
    source: str
    actor_id: str | None
    properties: dict[str, Any]
    properties_json: str  # the properties as JSON text, for COPY


_new_tuple = tuple.__new__


def parse_occurred_at(value: Any) -> datetime:
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, str) and value.strip():
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            raise InvalidEvent(f"occurred_at {value!r} is not an ISO-8601 timestamp") from None
    else:
        raise InvalidEvent(f"occurred_at {value!r} is not an ISO-8601 timestamp")
    if parsed.tzinfo is UTC:  # what fromisoformat gives for "Z" and "+00:00": nothing to convert
        return parsed
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidEvent(f"occurred_at {value!r} has no UTC offset; the day boundary needs one")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:00:00-05:00 is past the last representable instant
        raise InvalidEvent(f"occurred_at {value!r} is out of range in UTC") from None


def _text(raw: Mapping[str, Any], name: str, required: bool) -> str | None:
    value = raw.get(name)
    # The common case first: a short ASCII string without NUL passes every check below.
    if type(value) is str and 0 < len(value) <= MAX_LENGTHS[name] and value.isascii() and "\x00" not in value:
        return value
    if value is None or (isinstance(value, str) and value == ""):
        if required:
            raise InvalidEvent(f"missing required field {name!r}")
        return None
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise InvalidEvent(f"field {name!r} must be a string, got {type(value).__name__}")
    text = str(value)
    # PostgreSQL text holds neither NUL nor lone surrogates; one such row must not fail its whole batch.
    if "\x00" in text:
        raise InvalidEvent(f"field {name!r} contains a NUL character")
    if not _is_utf8(text):
        raise InvalidEvent(f"field {name!r} is not valid Unicode (a lone surrogate)")
    if len(text) > MAX_LENGTHS[name]:
        raise InvalidEvent(f"field {name!r} is longer than {MAX_LENGTHS[name]} characters")
    return text


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _properties(value: Any, json_native: bool) -> tuple[dict[str, Any], str]:
    """The event's properties and their JSON text, or InvalidEvent naming the problem."""
    if value is None or value == "":
        return {}, "{}"
    if isinstance(value, str):  # CSV carries properties as a JSON text cell
        try:
            value, json_native = loads_strict(value)
        except json.JSONDecodeError:
            raise InvalidEvent("properties is not valid JSON") from None
        except ValueError as exc:
            raise InvalidEvent(f"properties is not valid JSON: {exc}") from None
        except RecursionError:
            raise InvalidEvent("properties is not valid JSON: nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidEvent(f"properties must be a JSON object, got {type(value).__name__}")
    if json_native:
        try:
            encoded = orjson.dumps(value)
        except orjson.JSONEncodeError:  # nested deeper than orjson writes: the checks below decide
            pass
        else:
            # json.dumps(ensure_ascii) writes at most 6 characters per byte of orjson's UTF-8 ("\x7f" becomes
            # "\u007f"), so this bound proves the size check below passes; a NUL is "\u0000" in both.
            if len(encoded) * 6 <= MAX_PROPERTIES_BYTES and b"\\u0000" not in encoded:
                return value, encoded.decode()
    try:
        # allow_nan=False: neither database may be handed NaN or Infinity (the application's dicts too).
        encoded_text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidEvent("properties hold NaN or Infinity, which is not JSON") from None
    except RecursionError:
        raise InvalidEvent("properties are nested too deeply") from None
    if len(encoded_text) > MAX_PROPERTIES_BYTES:
        raise InvalidEvent(f"properties are larger than {MAX_PROPERTIES_BYTES} bytes")
    if "\\u0000" in encoded_text:  # JSONB refuses it
        raise InvalidEvent("properties contain a NUL character")
    # ensure_ascii JSON writes every lone surrogate (and every non-BMP character) as a \\udXXX escape.
    if "\\ud" in encoded_text and not _is_utf8(json.dumps(value, ensure_ascii=False)):
        raise InvalidEvent("properties are not valid Unicode (a lone surrogate)")
    return value, encoded_text


def validated_row(
    raw: Mapping[str, Any], known_campaigns: Container[str], default_source: str, now: datetime, json_native: bool
) -> EventRow:
    """``raw`` checked (field limits, the timestamp, the properties' JSON) as the row to write, or InvalidEvent
    naming the first problem."""
    get = raw.get
    event_id, campaign_id, stage, event_type = get("event_id"), get("campaign_id"), get("stage"), get("event_type")
    # One test for the common case of the four (each a short ASCII string without NUL); otherwise _text
    # checks them one by one, in order, for the first problem's reason.
    if not (
        type(event_id) is type(campaign_id) is type(stage) is type(event_type) is str
        and 0 < len(event_id) <= _MAX_EVENT_ID
        and 0 < len(campaign_id) <= _MAX_SHORT
        and 0 < len(stage) <= _MAX_SHORT
        and 0 < len(event_type) <= _MAX_SHORT
        and (joined := event_id + campaign_id + stage + event_type).isascii()
        and "\x00" not in joined
    ):
        event_id = _text(raw, "event_id", required=True)
        campaign_id = _text(raw, "campaign_id", required=True)
        stage = _text(raw, "stage", required=True)
        event_type = _text(raw, "event_type", required=True)
    assert event_id and campaign_id and stage and event_type
    if campaign_id not in known_campaigns:
        raise InvalidEvent(f"unknown campaign {campaign_id!r}")
    given_at = get("occurred_at")
    if given_at in (None, ""):
        raise InvalidEvent("missing required field 'occurred_at'")
    occurred_at = parse_occurred_at(given_at)
    if occurred_at > now + MAX_FUTURE_SKEW:
        raise InvalidEvent(f"occurred_at {occurred_at.isoformat()} is more than a day in the future")
    if occurred_at < MIN_OCCURRED_AT:
        raise InvalidEvent(f"occurred_at {occurred_at.isoformat()} is before {MIN_OCCURRED_AT.year}")
    properties, properties_json = _properties(get("properties"), json_native)
    source = _text(raw, "source", required=False) or default_source
    actor_id = _text(raw, "actor_id", required=False)
    # tuple.__new__ skips NamedTuple's Python-level __new__, which costs as much again per row.
    return _new_tuple(
        EventRow,
        (event_id, campaign_id, stage, event_type, occurred_at, source, actor_id, properties, properties_json),
    )


def known_campaign_ids(conn: sa.Connection) -> set[str]:
    return set(conn.execute(sa.select(campaign.c.id)).scalars())
