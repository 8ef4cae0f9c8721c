"""PostgreSQL COPY for event and reject rows: the COPY text format and the temporary staging table it fills."""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa

from marketing_pipelines.measurement.events.validate import EventRow

# occurred_at travels as integer microseconds since the epoch: formatting a datetime as text costs three
# times as much, per row, as this integer, and ``interval * float8`` is exact for integers below 2**53 (285 years).
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def copy_into_staging(
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


def copy_line(row: EventRow) -> str:
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
        line = "\t".join([copy_escape(v) for v in values])
    # A missing actor_id was joined as "" at the end of the line; COPY reads \\N as NULL.
    return line + "\n" if actor_id is not None else line + "\\N\n"


def copy_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
