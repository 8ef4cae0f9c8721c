"""First-party marketing events: validation, ``record_events`` for the application, and the streaming file loader.

Every path inserts with ``ON CONFLICT (event_id) DO NOTHING``, so recording or loading the same
event twice adds nothing: the caller's ``event_id`` is the dedupe key.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import InvalidInput, loads_json
from marketing_pipelines.db.engine import insert_ignoring_conflicts
from marketing_pipelines.db.schema import campaign, marketing_event, marketing_event_reject

REQUIRED_FIELDS = ("event_id", "campaign_id", "stage", "event_type", "occurred_at")
CSV_COLUMNS = (*REQUIRED_FIELDS, "actor_id", "source", "properties")
MAX_LENGTHS = {"event_id": 200, "campaign_id": 64, "stage": 64, "event_type": 64, "actor_id": 200, "source": 64}
MAX_PROPERTIES_BYTES = 16 * 1024
# A line this long is not an event; refusing it keeps one corrupt line from costing much memory downstream.
MAX_LINE_BYTES = 256 * 1024
MAX_REJECT_RAW_CHARS = 4000
# Clocks of senders drift; an event a day ahead of ours is a bad timestamp, not clock skew.
MAX_FUTURE_SKEW = timedelta(days=1)
MIN_OCCURRED_AT = datetime(2000, 1, 1, tzinfo=UTC)
BATCH_SIZE = 1000
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
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        raise InvalidEvent(f"occurred_at {value!r} has no UTC offset; the day boundary needs one")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:00:00-05:00 is past the last representable instant
        raise InvalidEvent(f"occurred_at {value!r} is out of range in UTC") from None


def _text(raw: Mapping[str, Any], name: str, required: bool) -> str | None:
    value = raw.get(name)
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


def validate_event(
    raw: Mapping[str, Any], known_campaigns: Container[str], default_source: str, now: datetime
) -> MarketingEvent:
    """A MarketingEvent from a decoded row, or InvalidEvent naming the first problem."""
    event_id, campaign_id, stage, event_type = (_text(raw, f, required=True) for f in REQUIRED_FIELDS[:4])
    assert event_id and campaign_id and stage and event_type
    if campaign_id not in known_campaigns:
        raise InvalidEvent(f"unknown campaign {campaign_id!r}")
    if raw.get("occurred_at") in (None, ""):
        raise InvalidEvent("missing required field 'occurred_at'")
    occurred_at = parse_occurred_at(raw["occurred_at"])
    if occurred_at > now + MAX_FUTURE_SKEW:
        raise InvalidEvent(f"occurred_at {occurred_at.isoformat()} is more than a day in the future")
    if occurred_at < MIN_OCCURRED_AT:
        raise InvalidEvent(f"occurred_at {occurred_at.isoformat()} is before {MIN_OCCURRED_AT.year}")
    properties = raw.get("properties")
    if properties is None or properties == "":
        properties = {}
    elif isinstance(properties, str):  # CSV carries properties as a JSON text cell
        try:
            properties = loads_json(properties)
        except json.JSONDecodeError:
            raise InvalidEvent("properties is not valid JSON") from None
        except ValueError as exc:
            raise InvalidEvent(f"properties is not valid JSON: {exc}") from None
    if not isinstance(properties, dict):
        raise InvalidEvent(f"properties must be a JSON object, got {type(properties).__name__}")
    try:
        # allow_nan=False: neither database may be handed NaN or Infinity (the application's dicts too).
        encoded = json.dumps(properties, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidEvent("properties hold NaN or Infinity, which is not JSON") from None
    if len(encoded) > MAX_PROPERTIES_BYTES:
        raise InvalidEvent(f"properties are larger than {MAX_PROPERTIES_BYTES} bytes")
    if "\\u0000" in encoded:  # JSONB refuses it
        raise InvalidEvent("properties contain a NUL character")
    if not _is_utf8(json.dumps(properties, ensure_ascii=False)):
        raise InvalidEvent("properties are not valid Unicode (a lone surrogate)")
    return MarketingEvent(
        event_id=event_id,
        campaign_id=campaign_id,
        stage=stage,
        event_type=event_type,
        occurred_at=occurred_at,
        source=_text(raw, "source", required=False) or default_source,
        actor_id=_text(raw, "actor_id", required=False),
        properties=properties,
    )


def known_campaign_ids(conn: sa.Connection) -> set[str]:
    return set(conn.execute(sa.select(campaign.c.id)).scalars())


COMPARED_FIELDS = ("campaign_id", "stage", "event_type", "occurred_at", "source", "actor_id", "properties")


def insert_events(conn: sa.Connection, events: Sequence[MarketingEvent], ingested_at: datetime) -> int:
    """Insert a batch, skipping event_ids already stored (or repeated in the batch); returns rows inserted."""
    return len(insert_events_returning(conn, events, ingested_at))


def insert_events_returning(conn: sa.Connection, events: Sequence[MarketingEvent], ingested_at: datetime) -> set[str]:
    """Insert a batch, skipping event_ids already stored; returns the event_ids inserted."""
    if not events:
        return set()
    rows = [{**e.__dict__, "ingested_at": ingested_at} for e in events]
    # RETURNING lists only the rows actually inserted, on both dialects; executemany rowcount does not.
    stmt = insert_ignoring_conflicts(conn, marketing_event).returning(marketing_event.c.event_id)
    return set(conn.execute(stmt, rows).scalars())


def conflicting_fields(conn: sa.Connection, events: Sequence[MarketingEvent]) -> dict[int, list[str]]:
    """For events whose event_id was not inserted: {index in ``events``: fields that differ from the stored
    row}. An empty list is a plain duplicate (same content); an index is missing when nothing is stored."""
    if not events:
        return {}
    t = marketing_event
    stored = {
        row.event_id: row
        for row in conn.execute(
            sa.select(t.c.event_id, *(t.c[f] for f in COMPARED_FIELDS)).where(
                t.c.event_id.in_({e.event_id for e in events})
            )
        )
    }
    result = {}
    for index, event in enumerate(events):
        row = stored.get(event.event_id)
        if row is not None:
            result[index] = [f for f in COMPARED_FIELDS if getattr(row, f) != getattr(event, f)]
    return result


def not_inserted(event_ids: Sequence[str], inserted: set[str]) -> list[int]:
    """Indexes of the events that were not inserted: already stored, or a repeat within the batch
    (the first of a repeated event_id is the one inserted)."""
    first: set[str] = set()
    skipped = []
    for index, event_id in enumerate(event_ids):
        if event_id in inserted and event_id not in first:
            first.add(event_id)
        else:
            skipped.append(index)
    return skipped


def conflict_reason(event_id: str, fields: Sequence[str]) -> str:
    return f"event_id {event_id!r} is already stored with a different {', '.join(fields)}; not loaded"


def record_events(conn: sa.Connection, events: Iterable[Mapping[str, Any]], source: str = "app") -> LoadCounts:
    """Record events from the application; all are validated before any is written.

    Raises InvalidInput naming the event and the problem, so an application bug surfaces
    at the call rather than as a reject row nobody reads. Duplicates (same event_id) are counted, not errors.
    """
    now = datetime.now(UTC)
    known = known_campaign_ids(conn)
    validated: list[MarketingEvent] = []
    for index, raw in enumerate(events):
        try:
            validated.append(validate_event(raw, known, source, now))
        except InvalidEvent as exc:
            raise InvalidInput(f"event {index} ({raw.get('event_id')!r}): {exc}") from None
    counts = LoadCounts()
    for start in range(0, len(validated), BATCH_SIZE):
        batch = validated[start : start + BATCH_SIZE]
        inserted = insert_events_returning(conn, batch, now)
        counts.loaded += len(inserted)
        skipped = [batch[i] for i in not_inserted([e.event_id for e in batch], inserted)]
        for index, fields in conflicting_fields(conn, skipped).items():
            if fields:
                counts.conflict += 1
                counts.conflicts.append((skipped[index].event_id, conflict_reason(skipped[index].event_id, fields)))
            else:
                counts.duplicate += 1
    return counts


# --- the file loader ---------------------------------------------------------------------------------


_PhysicalLine = tuple[int, bytes, str | None]


@dataclass(frozen=True)
class _Line:
    number: int
    raw: str
    record: Mapping[str, Any] | None  # None when the line is not a record; reason says why
    reason: str | None = None


@dataclass(frozen=True)
class _Reject:
    number: int
    raw: str
    reason: str


def _decode(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _jsonl_records(lines: Iterator[_PhysicalLine]) -> Iterator[_Line]:
    for number, data, problem in lines:
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
    """
    number = 0
    while True:
        data = handle.readline(MAX_LINE_BYTES + 1)
        if not data:
            return
        number += 1
        read, problem = len(data), None
        if number == 1 and data.startswith(b"\xef\xbb\xbf"):
            data = data[3:]  # a UTF-8 byte-order mark, as spreadsheet programs write it
        if len(data) > MAX_LINE_BYTES and not data.endswith(b"\n"):
            problem = f"line is longer than {MAX_LINE_BYTES} bytes"
            while True:
                rest = handle.readline(MAX_LINE_BYTES)
                read += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            data = data[:MAX_REJECT_RAW_CHARS]
        if progress is not None:
            progress(read)
        yield number, data.rstrip(b"\r\n"), problem


def reject_file_label(path: Path) -> str:
    """How marketing_event_reject names the file: its absolute path (the last 1000 characters)."""
    return str(path.resolve())[-1000:]


def file_format(path: Path) -> str:
    fmt = SUPPORTED_SUFFIXES.get(path.suffix.lower())
    if fmt is None:
        raise InvalidInput(f"{path}: unsupported file type {path.suffix!r}; use .jsonl, .ndjson or .csv")
    return fmt


def load_events_file(
    engine: sa.Engine,
    path: Path | str,
    progress: Callable[[int], None] | None = None,
    source: str = "file",
    batch_size: int = BATCH_SIZE,
) -> LoadCounts:
    """Stream a .jsonl/.csv file of events into ``marketing_event``; invalid rows go to ``marketing_event_reject``.

    ``progress`` is called with the bytes read since its last call. Each batch commits on its own,
    so an interrupted load keeps what it wrote and a re-run skips it (event_id dedupe).
    """
    path = Path(path)
    fmt = file_format(path)
    with engine.connect() as conn:
        known = known_campaign_ids(conn)
    counts = LoadCounts()
    file_label = reject_file_label(path)
    events: list[tuple[MarketingEvent, _Line]] = []
    rejects: list[_Reject] = []
    seen_record = False
    with path.open("rb") as handle:
        lines = _physical_lines(handle, progress)
        records = _jsonl_records(lines) if fmt == "jsonl" else _csv_records(lines, path)
        for line in records:
            now = datetime.now(UTC)
            if line.record is None:
                counts.unparseable += 1
                rejects.append(_Reject(line.number, line.raw, line.reason or "unreadable"))
            else:
                seen_record = True
                try:
                    events.append((validate_event(line.record, known, source, now), line))
                except InvalidEvent as exc:
                    rejects.append(_Reject(line.number, line.raw, str(exc)))
            if len(events) + len(rejects) >= batch_size:
                _flush(engine, events, rejects, file_label, counts)
                events, rejects = [], []
        _flush(engine, events, rejects, file_label, counts)
    if counts.read == 0:
        raise InvalidInput(f"{path}: no events found (the file is empty or has only a header)")
    if not seen_record:
        raise InvalidInput(
            f"{path}: not one line could be read as a {fmt.upper()} record ({counts.rejected} rejected); "
            "is this the right file?"
        )
    return counts


def _flush(
    engine: sa.Engine,
    events: list[tuple[MarketingEvent, _Line]],
    rejects: list[_Reject],
    file_label: str,
    counts: LoadCounts,
) -> None:
    if not events and not rejects:
        return
    now = datetime.now(UTC)
    conflicts: list[_Reject] = []
    with engine.begin() as conn:
        inserted = insert_events_returning(conn, [e for e, _ in events], now)
        skipped = [events[i] for i in not_inserted([e.event_id for e, _ in events], inserted)]
        for index, fields in conflicting_fields(conn, [e for e, _ in skipped]).items():
            event, line = skipped[index]
            if fields:
                conflicts.append(_Reject(line.number, line.raw, conflict_reason(event.event_id, fields)))
        if rejects or conflicts:
            rows = [
                {
                    "file": file_label,
                    "line_number": r.number,
                    "raw": r.raw[:MAX_REJECT_RAW_CHARS].replace("\x00", "\\x00"),
                    "raw_sha256": hashlib.sha256(r.raw.encode("utf-8", "replace")).hexdigest(),
                    "reason": r.reason[:500],
                    "rejected_at": now,
                }
                for r in [*rejects, *conflicts]
            ]
            conn.execute(insert_ignoring_conflicts(conn, marketing_event_reject), rows)
    counts.loaded += len(inserted)
    counts.conflict += len(conflicts)
    counts.duplicate += len(events) - len(inserted) - len(conflicts)
    counts.rejected += len(rejects)
    for r in [*rejects, *conflicts]:
        counts.note(r.reason, r.number)


def list_rejects(conn: sa.Connection, file: str | None = None, limit: int = 200) -> list[sa.RowMapping]:
    """Rejected lines (and conflicts), newest file first, in line order; ``file`` as ``reject_file_label`` gives it."""
    t = marketing_event_reject
    query = sa.select(t.c.file, t.c.line_number, t.c.reason, t.c.raw, t.c.rejected_at)
    if file is not None:
        query = query.where(t.c.file == file)
    return list(conn.execute(query.order_by(t.c.rejected_at.desc(), t.c.file, t.c.line_number).limit(limit)).mappings())
