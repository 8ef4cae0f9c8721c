"""Rejected lines and conflicts of file loads: the ``marketing_event_reject`` rows, how they are written and listed."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from marketing_pipelines.db.engine import insert_ignoring_conflicts, is_postgres
from marketing_pipelines.db.schema import marketing_event_reject
from marketing_pipelines.measurement.events.pg_copy import copy_escape, copy_into_staging

MAX_REJECT_RAW_CHARS = 4000
_REJECT_COPY_COLUMNS = ("line_number", "raw", "raw_sha256", "reason")


class Reject(NamedTuple):
    number: int
    raw: str  # cut to MAX_REJECT_RAW_CHARS
    raw_sha256: str  # of the whole line as read
    reason: str

    @classmethod
    def of(cls, number: int, raw: str, reason: str) -> Reject:
        return cls(
            number, raw[:MAX_REJECT_RAW_CHARS], hashlib.sha256(raw.encode("utf-8", "replace")).hexdigest(), reason
        )


def reject_file_label(path: Path) -> str:
    """How marketing_event_reject names the file: its absolute path (the last 1000 characters)."""
    return str(path.resolve())[-1000:]


def insert_rejects(conn: sa.Connection, rejects: Sequence[Reject], file_label: str, rejected_at: datetime) -> None:
    """Store rejects (and conflicts); one already stored for the same file, line and content is skipped."""
    values = [(r.number, r.raw.replace("\x00", "\\x00"), r.raw_sha256, r.reason[:500]) for r in rejects]
    if not is_postgres(conn):
        rows = [
            {"file": file_label, **dict(zip(_REJECT_COPY_COLUMNS, v, strict=True)), "rejected_at": rejected_at}
            for v in values
        ]
        conn.execute(insert_ignoring_conflicts(conn, marketing_event_reject), rows)
        return
    lines = ["\t".join([str(n), copy_escape(raw), sha, copy_escape(reason)]) + "\n" for n, raw, sha, reason in values]
    shape = f"SELECT {', '.join(_REJECT_COPY_COLUMNS)} FROM marketing_event_reject"
    copy_into_staging(conn, "marketing_event_reject_load", shape, _REJECT_COPY_COLUMNS, lines)
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
