"""First-party marketing events: validation, ``record_events`` for the application, and the streaming file loader.

Every path inserts with ``ON CONFLICT (event_id) DO NOTHING``, so recording or loading the same
event twice adds nothing: the caller's ``event_id`` is the dedupe key. On PostgreSQL a batch is
``COPY``-ed into a temporary staging table and moved with one ``INSERT ... SELECT``; small batches of
``record_events`` and every batch on SQLite use ``INSERT`` statements. All paths store the same rows
and find the same duplicates and conflicts.
"""

from __future__ import annotations

import csv
import gc
import hashlib
import io
import json
import operator
import queue
import threading
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple

import orjson
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from marketing_pipelines.db.engine import insert_ignoring_conflicts, is_postgres
from marketing_pipelines.db.schema import campaign, marketing_event, marketing_event_reject
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.strict_json import loads_json

REQUIRED_FIELDS = ("event_id", "campaign_id", "stage", "event_type", "occurred_at")
CSV_COLUMNS = (*REQUIRED_FIELDS, "actor_id", "source", "properties")
MAX_LENGTHS = {"event_id": 200, "campaign_id": 64, "stage": 64, "event_type": 64, "actor_id": 200, "source": 64}
_MAX_EVENT_ID = MAX_LENGTHS["event_id"]
_MAX_SHORT = min(MAX_LENGTHS["campaign_id"], MAX_LENGTHS["stage"], MAX_LENGTHS["event_type"])
MAX_PROPERTIES_BYTES = 16 * 1024
# A line this long is not an event; refusing it keeps one corrupt line from costing much memory downstream.
MAX_LINE_BYTES = 256 * 1024
MAX_REJECT_RAW_CHARS = 4000
# Clocks of senders drift; an event a day ahead of ours is a bad timestamp, not clock skew.
MAX_FUTURE_SKEW = timedelta(days=1)
MIN_OCCURRED_AT = datetime(2000, 1, 1, tzinfo=UTC)
# Lines (events and rejects) per transaction of a file load, and events per write of record_events. A chunk
# also ends once its rows' lines hold LOAD_CHUNK_BYTES (50,000 typical lines hold about 12 MB), so memory stays
# bounded however long the lines are: in Python a row takes several times its line's size.
BATCH_SIZE = 50_000
LOAD_CHUNK_BYTES = 16 * 1024 * 1024
# Below this many events record_events inserts directly: a staging table per call of an application that
# records a few events per request would only churn the catalog.
COPY_MIN_ROWS = 1000
# The file loader calls ``progress`` about this often (in bytes read), not once per line.
PROGRESS_STEP_BYTES = 1024 * 1024
# SQLite allows 32,766 bound parameters per statement; event_id lookups go in slices well below that.
LOOKUP_SLICE = 5000
SUPPORTED_SUFFIXES = {".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv"}


class InvalidEvent(ValueError):
    """One event cannot be accepted; the message is the reject reason."""


@dataclass(frozen=True)
class MarketingEvent:
    """A validated event, ready to insert."""

    event_id: str
    campaign_id: str
    stage: str
    event_type: str
    occurred_at: datetime
    source: str
    actor_id: str | None = None
    properties: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadCounts:
    loaded: int = 0
    duplicate: int = 0  # event_id already stored with the same content
    conflict: int = 0  # event_id already stored with different content: not loaded, recorded with its reason
    rejected: int = 0
    # Lines that were not even a record (bad UTF-8, not JSON, malformed CSV); all-unparseable means nothing was read.
    unparseable: int = 0
    # reason -> line numbers (rejects and conflicts), for the loader's summary
    reasons: dict[str, list[int]] = field(default_factory=dict)
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (event_id, reason), for record_events

    @property
    def read(self) -> int:
        return self.loaded + self.duplicate + self.conflict + self.rejected

    def note(self, reason: str, line_number: int) -> None:
        self.reasons.setdefault(reason, []).append(line_number)


class _EventRow(NamedTuple):
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
_event_id = operator.itemgetter(0)
COMPARED_FIELDS = ("campaign_id", "stage", "event_type", "occurred_at", "source", "actor_id", "properties")


# --- validation ------------------------------------------------------------------------------------


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


# orjson reads an integer beyond 64 bits as a float (2**70 would be stored as 1.1805916207174113e+21); a
# text holding 19 digits in a row goes to the exact parser instead. Mapping every digit to "0" and looking
# for 19 zeros is a few times faster than a regular expression, and this runs once per line.
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_NINETEEN_ZEROS = b"0" * 19


def _may_hold_a_long_integer(data: bytes) -> bool:
    return _NINETEEN_ZEROS in data.translate(_DIGITS_TO_ZERO)


def _loads_strict(text: str) -> tuple[Any, bool]:
    """(value, json_native) of a JSON text, exactly as ``loads_json`` reads it and raising what it raises.

    orjson reads the common case, several times faster; anything it refuses or could read differently
    (integers beyond 64 bits) goes to ``loads_json``, so the value and every error message stay its own.
    ``json_native`` says the value came from orjson: only JSON types, valid Unicode, 64-bit integers.
    """
    if not _may_hold_a_long_integer(text.encode("utf-8", "surrogatepass")):
        try:
            return orjson.loads(text), True
        except orjson.JSONDecodeError:
            pass
    return loads_json(text), False


def _properties(value: Any, json_native: bool) -> tuple[dict[str, Any], str]:
    """The event's properties and their JSON text, or InvalidEvent naming the problem."""
    if value is None or value == "":
        return {}, "{}"
    if isinstance(value, str):  # CSV carries properties as a JSON text cell
        try:
            value, json_native = _loads_strict(value)
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


def _validated_row(
    raw: Mapping[str, Any], known_campaigns: Container[str], default_source: str, now: datetime, json_native: bool
) -> _EventRow:
    """validate_event's checks, in its order, returning the row to write."""
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
        _EventRow,
        (event_id, campaign_id, stage, event_type, occurred_at, source, actor_id, properties, properties_json),
    )


def validate_event(
    raw: Mapping[str, Any], known_campaigns: Container[str], default_source: str, now: datetime
) -> MarketingEvent:
    """A MarketingEvent from a decoded row, or InvalidEvent naming the first problem."""
    row = _validated_row(raw, known_campaigns, default_source, now, json_native=False)
    return MarketingEvent(*row[:8])


def known_campaign_ids(conn: sa.Connection) -> set[str]:
    return set(conn.execute(sa.select(campaign.c.id)).scalars())


# --- writing ---------------------------------------------------------------------------------------


# occurred_at travels as integer microseconds since the epoch: formatting a datetime as text costs three
# times as much, per row, as this integer, and ``interval * float8`` is exact for integers below 2**53 (285 years).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)
_STAGING_SHAPE = (
    "SELECT event_id, campaign_id, stage, event_type, 0::bigint AS occurred_at_us, source, properties, actor_id "
    "FROM marketing_event"
)
_COPY_COLUMNS = ("event_id", "campaign_id", "stage", "event_type", "occurred_at_us", "source", "properties", "actor_id")
_INSERT_FROM_STAGING = (
    "INSERT INTO marketing_event "
    "(event_id, campaign_id, stage, event_type, occurred_at, source, properties, actor_id, ingested_at) "
    "SELECT event_id, campaign_id, stage, event_type, timestamptz 'epoch' + occurred_at_us * interval '1 microsecond', "
    "source, properties, actor_id, %(ingested_at)s FROM marketing_event_load "
    "ON CONFLICT (event_id) DO NOTHING RETURNING event_id"
)
_REJECT_COPY_COLUMNS = ("line_number", "raw", "raw_sha256", "reason")


def _store_events(
    conn: sa.Connection,
    rows: Sequence[_EventRow],
    ingested_at: datetime,
    copy: bool,
    copy_lines: Sequence[str] | None = None,
) -> tuple[int, dict[int, list[str]]]:
    """Insert ``rows``, skipping event_ids already stored or repeated among them (the first is inserted).

    Returns the number inserted and, for every row not inserted whose event_id is stored, {index: the
    fields that differ from the stored row}: an empty list is a duplicate, a non-empty one a conflict.
    ``copy`` chooses COPY through a staging table on PostgreSQL; ``copy_lines`` are the rows' ``_copy_line``
    if the caller has them already.
    """
    first: dict[str, int] = {}
    repeats: list[int] = []
    # This may run on the file loader's writer thread beside the reading one: the common case (no event_id
    # repeated, all inserted) stays in C-level set operations instead of a Python loop per row.
    if len(set(map(_event_id, rows))) != len(rows):
        for index, row in enumerate(rows):
            if row.event_id in first:
                repeats.append(index)
            else:
                first[row.event_id] = index
    unique = [rows[i] for i in first.values()] if repeats else rows
    if not is_postgres(conn):
        inserted = _insert_sqlite(conn, unique, ingested_at)
    elif copy:
        if copy_lines is None:
            copy_lines = [_copy_line(row) for row in unique]
        elif repeats:
            copy_lines = [copy_lines[i] for i in first.values()]
        inserted = _insert_copy(conn, copy_lines, ingested_at)
    else:
        inserted = _insert_returning(conn, unique, ingested_at)
    if inserted is None:
        return len(unique), _conflicting_fields(conn, rows, repeats) if repeats else {}
    first = first or {row.event_id: index for index, row in enumerate(rows)}
    skipped = sorted([i for event_id, i in first.items() if event_id not in inserted] + repeats)
    return len(inserted), _conflicting_fields(conn, rows, skipped)


def _insert_copy(conn: sa.Connection, copy_lines: Sequence[str], ingested_at: datetime) -> set[str] | None:
    """The event_ids inserted, or None when every row was."""
    if not copy_lines:
        return None
    _copy_into_staging(conn, "marketing_event_load", _STAGING_SHAPE, _COPY_COLUMNS, copy_lines)
    result = conn.exec_driver_sql(_INSERT_FROM_STAGING, {"ingested_at": ingested_at})
    # libpq has received the RETURNING rows either way; they become Python objects only when some row was not
    # inserted, which spares 50,000 of them per chunk in the common case.
    inserted = None if result.rowcount == len(copy_lines) else set(result.scalars())
    conn.exec_driver_sql("DROP TABLE marketing_event_load")
    return inserted


def _copy_into_staging(
    conn: sa.Connection, name: str, shape: str, columns: Sequence[str], copy_lines: Iterable[str]
) -> None:
    """A temporary table ``name`` with the columns of the query ``shape`` (no constraints), filled by COPY from
    ``copy_lines`` (COPY text format). The caller drops it.

    No ON COMMIT DROP: record_events may write several batches in one transaction (the demo does), or run
    on an autocommit connection, where ON COMMIT DROP would drop the table before the COPY. A table left by
    a failed autocommit call is dropped first; inside a transaction a failure rolls its creation back.
    """
    conn.exec_driver_sql(f"DROP TABLE IF EXISTS pg_temp.{name}; CREATE TEMP TABLE {name} AS {shape} WITH NO DATA")
    # psycopg2 encodes the text in the connection's client encoding; reading it in one piece spares the GIL
    # hand-overs of many small reads when another thread is parsing.
    text = "".join(copy_lines)
    with conn.connection.dbapi_connection.cursor() as cursor:  # type: ignore[union-attr]
        cursor.copy_expert(f"COPY {name} ({', '.join(columns)}) FROM STDIN", io.StringIO(text), size=len(text) + 1)


def _copy_line(row: _EventRow) -> str:
    """One row in COPY's text format: tab-separated, \\N for NULL, backslash escapes for \\ tab CR LF."""
    actor_id = row.actor_id
    values = (
        row.event_id,
        row.campaign_id,
        row.stage,
        row.event_type,
        str((row.occurred_at - _EPOCH) // _MICROSECOND),
        row.source,
        row.properties_json,
        "" if actor_id is None else actor_id,
    )
    line = "\t".join(values)
    # The common case needs no escaping: exactly the 7 separators, no backslash, CR or LF. (NUL cannot occur:
    # validation rejects it.)
    if line.count("\t") != 7 or "\\" in line or "\n" in line or "\r" in line:
        line = "\t".join([_copy_escape(v) for v in values])
    # A missing actor_id was joined as "" at the end of the line; COPY reads \\N as NULL.
    return line + "\n" if actor_id is not None else line + "\\N\n"


def _copy_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def _insert_returning(conn: sa.Connection, rows: Sequence[_EventRow], ingested_at: datetime) -> set[str]:
    """The event_ids inserted."""
    if not rows:
        return set()
    params = [{**dict(zip(_EventRow._fields[:8], row[:8], strict=True)), "ingested_at": ingested_at} for row in rows]
    # RETURNING lists only the rows actually inserted; executemany rowcount does not.
    statement = insert_ignoring_conflicts(conn, marketing_event).returning(marketing_event.c.event_id)
    return set(conn.execute(statement, params).scalars())


def _insert_sqlite(conn: sa.Connection, rows: Sequence[_EventRow], ingested_at: datetime) -> set[str] | None:
    """Insert with executemany; SQLite has one writer and this transaction holds the write lock (BEGIN
    IMMEDIATE), so the event_ids not stored before the insert are exactly the ones it inserts."""
    stored = _stored_event_ids(conn, [row.event_id for row in rows])
    new = [row for row in rows if row.event_id not in stored]
    if not new:
        return set()
    dialect = conn.dialect
    timestamp = marketing_event.c.occurred_at.type.dialect_impl(dialect).bind_processor(dialect)
    to_json = marketing_event.c.properties.type.dialect_impl(dialect).bind_processor(dialect)
    assert timestamp is not None and to_json is not None
    ingested = timestamp(ingested_at)
    columns = [*_EventRow._fields[:8], "ingested_at"]
    params = [(*r[:4], timestamp(r.occurred_at), r.source, r.actor_id, to_json(r.properties), ingested) for r in new]
    conn.exec_driver_sql(
        f"INSERT INTO marketing_event ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))}) "
        "ON CONFLICT (event_id) DO NOTHING",
        params,
    )
    return None if len(new) == len(rows) else {row.event_id for row in new}


def _stored_event_ids(conn: sa.Connection, event_ids: Sequence[str]) -> set[str]:
    stored: set[str] = set()
    for start in range(0, len(event_ids), LOOKUP_SLICE):
        chunk = event_ids[start : start + LOOKUP_SLICE]
        query = sa.select(marketing_event.c.event_id).where(marketing_event.c.event_id.in_(chunk))
        stored.update(conn.execute(query).scalars())
    return stored


def _conflicting_fields(conn: sa.Connection, rows: Sequence[_EventRow], indexes: Sequence[int]) -> dict[int, list[str]]:
    """{index: fields of rows[index] that differ from the stored row} for the given indexes whose event_id is
    stored, in the order given. The stored row is read back, so both sides went through the column types."""
    t = marketing_event
    ids = sorted({rows[i].event_id for i in indexes})
    stored: dict[str, sa.Row[Any]] = {}
    for start in range(0, len(ids), LOOKUP_SLICE):
        query = sa.select(t.c.event_id, *(t.c[f] for f in COMPARED_FIELDS)).where(
            t.c.event_id.in_(ids[start : start + LOOKUP_SLICE])
        )
        stored.update((row.event_id, row) for row in conn.execute(query))
    result = {}
    for index in indexes:
        row, found = rows[index], stored.get(rows[index].event_id)
        if found is not None:
            result[index] = [f for n, f in enumerate(COMPARED_FIELDS, 1) if found[n] != row[n]]
    return result


def conflict_reason(event_id: str, fields: Sequence[str]) -> str:
    return f"event_id {event_id!r} is already stored with a different {', '.join(fields)}; not loaded"


def record_events(conn: sa.Connection, events: Iterable[Mapping[str, Any]], source: str = "app") -> LoadCounts:
    """Record events from the application; all are validated before any is written.

    Raises InvalidInput naming the event and the problem, so an application bug surfaces
    at the call rather than as a reject row nobody reads. Duplicates (same event_id) are counted, not errors.
    """
    now = datetime.now(UTC)
    known = known_campaign_ids(conn)
    validated: list[_EventRow] = []
    for index, raw in enumerate(events):
        try:
            validated.append(_validated_row(raw, known, source, now, json_native=False))
        except InvalidEvent as exc:
            raise InvalidInput(f"event {index} ({raw.get('event_id')!r}): {exc}") from None
    counts = LoadCounts()
    for start in range(0, len(validated), BATCH_SIZE):
        batch = validated[start : start + BATCH_SIZE]
        inserted, not_inserted = _store_events(conn, batch, now, copy=len(batch) >= COPY_MIN_ROWS)
        counts.loaded += inserted
        for index, fields in not_inserted.items():
            if fields:
                counts.conflict += 1
                counts.conflicts.append((batch[index].event_id, conflict_reason(batch[index].event_id, fields)))
            else:
                counts.duplicate += 1
    return counts


# --- the file loader ---------------------------------------------------------------------------------


_PhysicalLine = tuple[int, bytes, str | None]


class _Line(NamedTuple):
    number: int
    raw: str
    record: Mapping[str, Any] | None  # None when the line is not a record; reason says why
    reason: str | None = None
    json_native: bool = False  # record came from orjson (see _loads_strict)


class _Reject(NamedTuple):
    number: int
    raw: str  # cut to MAX_REJECT_RAW_CHARS
    raw_sha256: str  # of the whole line as read
    reason: str

    @classmethod
    def of(cls, number: int, raw: str, reason: str) -> _Reject:
        return cls(
            number, raw[:MAX_REJECT_RAW_CHARS], hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest(), reason
        )


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _jsonl_records(lines: Iterator[_PhysicalLine]) -> Iterator[_Line]:
    for number, data, problem in lines:
        # The common case: orjson reads a JSON object (it checks UTF-8 too). Everything else takes the
        # path below, which gives the reject reasons; see _loads_strict for why long digit runs do.
        if problem is None and not _may_hold_a_long_integer(data):
            try:
                record = orjson.loads(data)
            except orjson.JSONDecodeError:
                pass
            else:
                if type(record) is dict:
                    yield _new_tuple(_Line, (number, data.decode("utf-8"), record, None, True))
                    continue
        text = _decode(data)
        if problem is None and text is None:
            problem = "line is not valid UTF-8"
        shown = text if text is not None else data.decode("utf-8", "replace")
        if problem is not None:
            yield _Line(number, shown, None, problem)
            continue
        if not shown.strip():
            continue
        try:
            record = loads_json(shown)
        except json.JSONDecodeError as exc:
            yield _Line(number, shown, None, f"not valid JSON: {exc.msg} at column {exc.colno}")
            continue
        except ValueError as exc:
            yield _Line(number, shown, None, f"not valid JSON: {exc}")
            continue
        except RecursionError:
            yield _Line(number, shown, None, "not valid JSON: nested too deeply")
            continue
        if not isinstance(record, dict):
            yield _Line(number, shown, None, f"line must be a JSON object, got {type(record).__name__}")
            continue
        yield _Line(number, shown, record)


def _csv_records(lines: Iterator[_PhysicalLine], path: Path) -> Iterator[_Line]:
    consumed: list[tuple[int, str]] = []
    undecodable: set[int] = set()
    too_long: list[_Line] = []

    def text_lines() -> Iterator[str]:
        for number, data, problem in lines:
            text = _decode(data)
            if problem is not None:
                # Its truncated text could open a quote that swallows the following rows; csv sees a blank line.
                too_long.append(_Line(number, data.decode("utf-8", "replace"), None, problem))
                yield "\n"
                continue
            if text is None:
                undecodable.add(number)
                text = data.decode("utf-8", "replace")
            consumed.append((number, text))
            yield text + "\n"

    reader = csv.reader(text_lines(), strict=True)
    try:
        header = [h.strip() for h in next(reader)]
    except StopIteration:
        return
    except csv.Error as exc:
        raise InvalidInput(f"{path}: the CSV header cannot be read: {exc}") from None
    missing = [c for c in REQUIRED_FIELDS if c not in header]
    if missing:
        raise InvalidInput(
            f"{path}: the CSV header lacks {', '.join(missing)} (expected columns {', '.join(CSV_COLUMNS)})"
        )
    consumed.clear()
    while True:
        try:
            row: list[str] | None = next(reader)
            problem = None
        except StopIteration:
            row, problem = None, "end"
        except csv.Error as exc:
            row, problem = None, f"malformed CSV: {exc}"
        yield from too_long
        too_long.clear()
        if problem == "end":
            if consumed:  # an unterminated quote ran to the end of the file
                yield _Line(consumed[0][0], "".join(t for _, t in consumed), None, "malformed CSV: unterminated quote")
            return
        number = consumed[0][0] if consumed else 0
        raw = "\n".join(t for _, t in consumed)
        numbers = {n for n, _ in consumed}
        consumed.clear()
        if row is None:
            yield _Line(number, raw, None, problem)
        elif not row or all(not cell.strip() for cell in row):
            continue
        elif numbers & undecodable:
            yield _Line(number, raw, None, "line is not valid UTF-8")
        elif len(row) != len(header):
            yield _Line(number, raw, None, f"expected {len(header)} CSV fields, got {len(row)}")
        else:
            yield _Line(number, raw, dict(zip(header, row, strict=True)))


def _physical_lines(handle: BinaryIO, progress: Callable[[int], None] | None) -> Iterator[_PhysicalLine]:
    """(line number, bytes without the newline, problem or None), reading at most MAX_LINE_BYTES at a time.

    Binary reading with a bounded readline keeps memory constant however large the file or a
    single line is, and a bad byte sequence rejects its own line instead of stopping the load.
    ``progress`` gets the bytes read about every PROGRESS_STEP_BYTES, and the rest at the end.
    """
    number = 0
    unreported = 0
    readline = handle.readline
    while True:
        data = readline(MAX_LINE_BYTES + 1)
        if not data:
            if progress is not None and unreported:
                progress(unreported)
            return
        number += 1
        unreported += len(data)
        problem = None
        if number == 1 and data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]  # a UTF-8 byte-order mark, as spreadsheet programs write it
        if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
            problem = f"line is longer than {MAX_LINE_BYTES} bytes"
            while True:
                rest = readline(MAX_LINE_BYTES)
                unreported += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            data = data[:MAX_REJECT_RAW_CHARS]
        if progress is not None and unreported >= PROGRESS_STEP_BYTES:
            progress(unreported)
            unreported = 0
        yield number, data.rstrip(b"\r\n"), problem


def reject_file_label(path: Path) -> str:
    """How marketing_event_reject names the file: its absolute path (the last 1000 characters)."""
    return str(path.resolve())[-1000:]


def file_format(path: Path) -> str:
    fmt = SUPPORTED_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InvalidInput(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .ndjson or .csv")
    return fmt


@dataclass
class _Chunk:
    """The lines of one transaction of a file load."""

    rows: list[_EventRow] = field(default_factory=list)
    lines: list[tuple[int, str]] = field(default_factory=list)  # (number, raw text) of each row, for conflicts
    # The rows as COPY text, on PostgreSQL: built by the reading thread, so the writer's thread only waits on
    # the database (Python code on it would compete with the reader for the GIL).
    copy_lines: list[str] | None = None
    rejects: list[_Reject] = field(default_factory=list)


class _ChunkWriter:
    """Writes and commits chunks in the order given, on one thread of its own.

    The database inserts chunk n while the caller parses chunk n+1: the drivers release the GIL while the
    server works. What is committed stays what a sequential loader commits: chunks in file order, each in its
    own transaction, and after a failed chunk nothing more. Memory holds at most three chunks: the one being
    written, one waiting, and the one being read.
    """

    def __init__(self, engine: sa.Engine, file_label: str, counts: LoadCounts) -> None:
        self._engine, self._file_label, self._counts = engine, file_label, counts
        self.copies = is_postgres(engine)  # whether chunks should carry their COPY text
        self._waiting: queue.Queue[_Chunk | None] = queue.Queue(maxsize=1)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="events-load-writer", daemon=True)
        self._thread.start()

    def write(self, chunk: _Chunk) -> None:
        """Queue ``chunk``; raises the error of an earlier chunk, which stops the load as it would have then."""
        if self._error is not None:
            raise self._error
        if chunk.rows or chunk.rejects:
            self._waiting.put(chunk)

    def close(self, raise_error: bool = True) -> None:
        """Wait until every queued chunk is committed (or the writer failed), then raise its error if any."""
        self._waiting.put(None)
        self._thread.join()
        if raise_error and self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (chunk := self._waiting.get()) is not None:
            if self._error is None:  # after a failure, queued chunks are dropped, not written
                try:
                    _flush(self._engine, chunk, self._file_label, self._counts)
                except BaseException as exc:
                    self._error = exc


def load_events_file(
    engine: sa.Engine,
    path: Path | str,
    progress: Callable[[int], None] | None = None,
    source: str = "file",
    batch_size: int = BATCH_SIZE,
) -> LoadCounts:
    """Stream a .jsonl/.csv file of events into ``marketing_event``; invalid rows go to ``marketing_event_reject``.

    ``progress`` is called with the bytes read since its last call. Each chunk of ``batch_size`` lines
    commits on its own, so an interrupted load keeps what it wrote and a re-run skips it (event_id dedupe).
    """
    path = Path(path)
    fmt = file_format(path)
    with engine.connect() as conn:
        known = known_campaign_ids(conn)
    counts = LoadCounts()
    writer = _ChunkWriter(engine, reject_file_label(path), counts)
    # A chunk holds some 100,000 objects the cyclic GC tracks; each full collection would also walk every object
    # the process had before the load (a CLI process with Dagster imported holds over 100,000), which cost a
    # fifth of the reading. Frozen, those are left out of collections until the load ends.
    gc.freeze()
    try:
        seen_record = _read_chunks(path, fmt, known, source, batch_size, progress, counts, writer)
    except BaseException:
        # Chunks handed over were, to the reader, already written: they commit before the error surfaces.
        writer.close(raise_error=False)
        raise
    finally:
        gc.unfreeze()
    writer.close()
    if counts.read == 0:
        raise InvalidInput(f"{path}: no events found (the file is empty or has only a header)")
    if not seen_record:
        raise InvalidInput(
            f"{path}: not one line could be read as a {fmt.upper()} record ({counts.rejected} rejected); "
            "is this the right file?"
        )
    return counts


def _read_chunks(
    path: Path,
    fmt: str,
    known: Container[str],
    source: str,
    batch_size: int,
    progress: Callable[[int], None] | None,
    counts: LoadCounts,
    writer: _ChunkWriter,
) -> bool:
    """Read, parse and validate ``path`` into chunks handed to ``writer``; returns whether any line was a record."""
    copy = writer.copies
    seen_record = False
    with path.open("rb") as handle:
        lines = _physical_lines(handle, progress)
        records = _jsonl_records(lines) if fmt == "jsonl" else _csv_records(lines, path)
        while True:
            chunk = _Chunk(copy_lines=[] if copy else None)
            # Bound methods and counters in locals: this loop runs once per line of the file.
            add_row, add_line, add_reject = chunk.rows.append, chunk.lines.append, chunk.rejects.append
            add_copy_line = chunk.copy_lines.append if chunk.copy_lines is not None else None
            held_chars = 0
            for lines_in_chunk, (number, raw, record, reason, json_native) in enumerate(records, 1):
                if record is None:
                    counts.unparseable += 1
                    add_reject(_Reject.of(number, raw, reason or "unreadable"))
                else:
                    seen_record = True
                    try:
                        row = _validated_row(record, known, source, datetime.now(UTC), json_native)
                    except InvalidEvent as exc:
                        add_reject(_Reject.of(number, raw, str(exc)))
                    else:
                        add_row(row)
                        add_line((number, raw))  # not the parsed record: see load_events_file
                        held_chars += len(raw)
                        if add_copy_line is not None:
                            add_copy_line(_copy_line(row))
                if lines_in_chunk >= batch_size or held_chars >= LOAD_CHUNK_BYTES:
                    break
            else:
                writer.write(chunk)  # the last one
                return seen_record
            writer.write(chunk)


def _flush(engine: sa.Engine, chunk: _Chunk, file_label: str, counts: LoadCounts) -> None:
    now = datetime.now(UTC)
    conflicts: list[_Reject] = []
    with engine.begin() as conn:
        inserted, not_inserted = _store_events(conn, chunk.rows, now, copy=True, copy_lines=chunk.copy_lines)
        for index, fields in not_inserted.items():
            if fields:
                number, raw = chunk.lines[index]
                conflicts.append(_Reject.of(number, raw, conflict_reason(chunk.rows[index].event_id, fields)))
        if chunk.rejects or conflicts:
            _insert_rejects(conn, [*chunk.rejects, *conflicts], file_label, now)
    counts.loaded += inserted
    counts.conflict += len(conflicts)
    counts.duplicate += len(chunk.rows) - inserted - len(conflicts)
    counts.rejected += len(chunk.rejects)
    for r in [*chunk.rejects, *conflicts]:
        counts.note(r.reason, r.number)


def _insert_rejects(conn: sa.Connection, rejects: Sequence[_Reject], file_label: str, rejected_at: datetime) -> None:
    """Store rejects (and conflicts); one already stored for the same file, line and content is skipped."""
    values = [(r.number, r.raw.replace("\x00", "\\x00"), r.raw_sha256, r.reason[:500]) for r in rejects]
    if not is_postgres(conn):
        rows = [
            {"file": file_label, **dict(zip(_REJECT_COPY_COLUMNS, v, strict=True)), "rejected_at": rejected_at}
            for v in values
        ]
        conn.execute(insert_ignoring_conflicts(conn, marketing_event_reject), rows)
        return
    lines = ["\t".join([str(n), _copy_escape(raw), sha, _copy_escape(reason)]) + "\n" for n, raw, sha, reason in values]
    shape = f"SELECT {', '.join(_REJECT_COPY_COLUMNS)} FROM marketing_event_reject"
    _copy_into_staging(conn, "marketing_event_reject_load", shape, _REJECT_COPY_COLUMNS, lines)
    staging = sa.table("marketing_event_reject_load", *(sa.column(c) for c in _REJECT_COPY_COLUMNS))
    t = marketing_event_reject
    conn.execute(
        postgresql.insert(t)
        .from_select(
            [*_REJECT_COPY_COLUMNS, "file", "rejected_at"],
            sa.select(
                *staging.c,
                sa.literal(file_label, t.c.file.type),
                sa.literal(rejected_at, t.c.rejected_at.type),
            ),
        )
        .on_conflict_do_nothing()
    )
    conn.exec_driver_sql(f"DROP TABLE {staging.name}")


def list_rejects(conn: sa.Connection, file: str | None = None, limit: int = 200) -> list[sa.RowMapping]:
    """Rejected lines (and conflicts), newest file first, in line order; ``file`` as ``reject_file_label`` gives it."""
    t = marketing_event_reject
    query = sa.select(t.c.file, t.c.line_number, t.c.reason, t.c.raw, t.c.rejected_at)
    if file is not None:
        query = query.where(t.c.file == file)
    return list(conn.execute(query.order_by(t.c.rejected_at.desc(), t.c.file, t.c.line_number).limit(limit)).mappings())
