"""Which database errors a measurement step retries (``may_succeed_later``), met on the real databases."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import may_succeed_later
from marketing_pipelines.db.schema import measurement_rollup_day, source_daily_metric

ROW = {"source": "posthog", "day": date(2026, 11, 24), "key": "spring26", "dimension": "", "metric": "events"}


def error_of(engine: sa.Engine, statement: sa.Executable) -> sa.exc.IntegrityError:
    with pytest.raises(sa.exc.IntegrityError) as raised, engine.begin() as conn:
        conn.execute(statement)
    return raised.value


def test_a_key_another_writer_inserted_first_may_pass_later(engine: sa.Engine) -> None:
    now = datetime.now(UTC)
    row = {"day": date(2026, 11, 24), "rolled_up_at": now, "row_count": 0}
    with engine.begin() as conn:
        conn.execute(sa.insert(measurement_rollup_day).values(row))
    assert may_succeed_later(error_of(engine, sa.insert(measurement_rollup_day).values(row)))


def test_a_check_violation_fails_every_attempt_alike(engine: sa.Engine) -> None:
    # value >= 0 (ck_source_daily_metric_value): the row's own fault, which no retry changes.
    statement = sa.insert(source_daily_metric).values({**ROW, "value": -1, "fetched_at": datetime.now(UTC)})
    assert not may_succeed_later(error_of(engine, statement))


def test_a_missing_value_fails_every_attempt_alike(engine: sa.Engine) -> None:
    statement = sa.insert(source_daily_metric).values({**ROW, "value": None, "fetched_at": datetime.now(UTC)})
    assert not may_succeed_later(error_of(engine, statement))
