"""Storing validated event rows in ``marketing_event``, with their duplicates and conflicts; ``record_events``.

Every path inserts with ``ON CONFLICT (event_id) DO NOTHING``, so recording or loading the same
event twice adds nothing: the caller's ``event_id`` is the dedupe key. On PostgreSQL a batch is
``COPY``-ed into a temporary staging table and moved with one ``INSERT ... SELECT``; small batches of
``record_events`` and every batch on SQLite use ``INSERT`` statements. All paths store the same rows
and find the same duplicates and conflicts.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import insert_ignoring_conflicts, is_postgres
from marketing_pipelines.db.schema import marketing_event
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.events.pg_copy import copy_into_staging, copy_line
from marketing_pipelines.measurement.events.validate import (
    COMPARED_FIELDS,
    EventRow,
    InvalidEvent,
    known_campaign_ids,
    validated_row,
)

# Events per write of record_events, and lines (events and rejects) per transaction of a file load (files.py
# also ends a chunk at LOAD_CHUNK_BYTES).
BATCH_SIZE = 50_000
# Below this many events record_events inserts directly: a staging table per call of an application that
# records a few events per request would only churn the catalog.
COPY_MIN_ROWS = 1000
# SQLite allows 32,766 bound parameters per statement; event_id lookups go in slices well below that.
LOOKUP_SLICE = 5000

_event_id = operator.itemgetter(0)
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


def store_events(
    conn: sa.Connection,
    rows: Sequence[EventRow],
    ingested_at: datetime,
    copy: bool,
    copy_lines: Sequence[str] | None = None,
) -> tuple[int, dict[int, list[str]]]:
    """Insert ``rows``, skipping event_ids already stored or repeated among them (the first is inserted).

    Returns the number inserted and, for every row not inserted whose event_id is stored, {index: the
    fields that differ from the stored row}: an empty list is a duplicate, a non-empty one a conflict.
    ``copy`` chooses COPY through a staging table on PostgreSQL; ``copy_lines`` are the rows' ``copy_line``
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
            copy_lines = [copy_line(row) for row in unique]
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
    copy_into_staging(conn, "marketing_event_load", _STAGING_SHAPE, _COPY_COLUMNS, copy_lines)
    result = conn.exec_driver_sql(_INSERT_FROM_STAGING, {"ingested_at": ingested_at})
    # libpq has received the RETURNING rows either way; they become Python objects only when some row was not
    # inserted, which spares 50,000 of them per chunk in the common case.
    inserted = None if result.rowcount == len(copy_lines) else set(result.scalars())
    conn.exec_driver_sql("DROP TABLE marketing_event_load")
    return inserted


def _insert_returning(conn: sa.Connection, rows: Sequence[EventRow], ingested_at: datetime) -> set[str]:
    """The event_ids inserted."""
    if not rows:
        return set()
    params = [{**dict(zip(EventRow._fields[:8], row[:8], strict=True)), "ingested_at": ingested_at} for row in rows]
    # RETURNING lists only the rows actually inserted; executemany rowcount does not.
    statement = insert_ignoring_conflicts(conn, marketing_event).returning(marketing_event.c.event_id)
    return set(conn.execute(statement, params).scalars())


def _insert_sqlite(conn: sa.Connection, rows: Sequence[EventRow], ingested_at: datetime) -> set[str] | None:
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
    columns = [*EventRow._fields[:8], "ingested_at"]
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


def _conflicting_fields(conn: sa.Connection, rows: Sequence[EventRow], indexes: Sequence[int]) -> dict[int, list[str]]:
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
    validated: list[EventRow] = []
    for index, raw in enumerate(events):
        try:
            validated.append(validated_row(raw, known, source, now, json_native=False))
        except InvalidEvent as exc:
            raise InvalidInput(f"event {index} ({raw.get('event_id')!r}): {exc}") from None
    counts = LoadCounts()
    for start in range(0, len(validated), BATCH_SIZE):
        batch = validated[start : start + BATCH_SIZE]
        inserted, not_inserted = store_events(conn, batch, now, copy=len(batch) >= COPY_MIN_ROWS)
        counts.loaded += inserted
        for index, fields in not_inserted.items():
            if fields:
                counts.conflict += 1
                counts.conflicts.append((batch[index].event_id, conflict_reason(batch[index].event_id, fields)))
            else:
                counts.duplicate += 1
    return counts


@dataclass(frozen=True)
class IngestionReading:
    """What the raw events table took in lately: the observation of ``marketing_event``."""

    last_ingested_at: datetime | None
    ingested_last_hour: int


def ingestion_reading(conn: sa.Connection, now: datetime) -> IngestionReading:
    """The last ingestion time and the events ingested in the hour before ``now``; both read from the
    ``ingested_at`` index, never the whole table."""
    e = marketing_event
    last = conn.execute(sa.select(sa.func.max(e.c.ingested_at))).scalar_one()
    hour = conn.execute(
        sa.select(sa.func.count()).select_from(e).where(e.c.ingested_at > now - timedelta(hours=1))
    ).scalar_one()
    return IngestionReading(last, hour)
