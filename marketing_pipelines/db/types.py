"""Column types that behave the same on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    PostgreSQL stores ``timestamptz``. SQLite has no time zone type, so values are stored as
    naive UTC text; normalising on the way in keeps string comparison (``due_at <= :now``)
    correct there, and re-attaching UTC on the way out keeps Python code free of naive times.
    """

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware time")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):  # raw text from a SQLite expression result
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# JSONB on PostgreSQL (indexable, compact), JSON text on SQLite.
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY.
BigIntId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
