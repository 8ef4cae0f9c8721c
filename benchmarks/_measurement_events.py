"""Synthetic first-party events for the measurement benchmarks, and their fast load into ``marketing_event``.

Events come as a DataFrame (the in-memory references aggregate the very same rows): ``campaigns``
campaigns, 4 stages, 6 event types, actor ids drawn with repetition from a population (a small
share without actor), ``occurred_at`` uniform over the days and sorted, as an append-only event
log is. PostgreSQL loads through ``COPY`` from an in-memory CSV buffer, SQLite through
``executemany``; both are analyzed afterwards so the planner sees the real table.
"""

from __future__ import annotations

import io
from datetime import UTC, date, datetime, time
from time import perf_counter
from typing import Any

import numpy as np
import pandas as pd
import sqlalchemy as sa

from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine

STAGES = ("awareness", "interest", "signup", "activation")
EVENT_TYPES = ("view", "click", "open", "submit", "share", "download")
NULL_ACTOR_SHARE = 0.02
LOAD_CHUNK = 500_000
COLUMNS = ("event_id", "campaign_id", "stage", "event_type", "actor_id", "occurred_at", "source", "properties")
COPY_SQL = f"COPY marketing_event ({', '.join(COLUMNS)}, ingested_at) FROM STDIN WITH (FORMAT csv)"


def campaign_ids(campaigns: int) -> list[str]:
    return [f"bench-{i:02d}" for i in range(campaigns)]


def generate_events(
    events: int, first_day: date, days: int, actors: int, campaigns: int = 20, seed: int = 0
) -> pd.DataFrame:
    """``events`` rows over [first_day, first_day + days) with columns campaign_id, stage, event_type, actor_id,
    occurred_at (UTC), sorted by occurred_at."""
    rng = np.random.default_rng(seed)
    start = np.datetime64(datetime.combine(first_day, time.min), "us")
    offsets = np.sort(rng.integers(0, days * 86_400_000_000, size=events)).astype("timedelta64[us]")
    # Indexing small object vocabularies shares one str object per value instead of building one per row.
    actor_vocab = np.array([f"actor-{i}" for i in range(actors)], dtype=object)
    actor_id = actor_vocab[rng.integers(0, actors, size=events)]
    actor_id[rng.random(events) < NULL_ACTOR_SHARE] = None
    return pd.DataFrame(
        {
            "campaign_id": np.array(campaign_ids(campaigns), dtype=object)[rng.integers(0, campaigns, size=events)],
            "stage": np.array(STAGES, dtype=object)[rng.integers(0, len(STAGES), size=events)],
            "event_type": np.array(EVENT_TYPES, dtype=object)[rng.integers(0, len(EVENT_TYPES), size=events)],
            "actor_id": actor_id,
            "occurred_at": pd.DatetimeIndex(start + offsets).tz_localize(UTC),
        }
    )


def load_events(url: str, frame: pd.DataFrame) -> float:
    """Insert the campaigns and every row of ``frame`` into a fresh app database; returns the seconds taken."""
    began = perf_counter()
    engine = get_engine(url)
    with engine.begin() as conn:
        for campaign_id in sorted(frame["campaign_id"].unique()):
            upsert_campaign(conn, Campaign(campaign_id, campaign_id, "bench"))
    postgres = engine.dialect.name == "postgresql"
    raw = engine.raw_connection()
    try:
        for offset in range(0, len(frame), LOAD_CHUNK):
            chunk = _table_rows(frame.iloc[offset : offset + LOAD_CHUNK], offset, postgres)
            if postgres:
                _copy_chunk(raw, chunk)
            else:
                _insert_chunk(raw, chunk)
    finally:
        raw.close()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text("VACUUM ANALYZE marketing_event" if postgres else "ANALYZE"))
    return perf_counter() - began


def _table_rows(chunk: pd.DataFrame, offset: int, postgres: bool) -> pd.DataFrame:
    occurred = chunk["occurred_at"].to_numpy(dtype="datetime64[us]")
    if postgres:
        occurred_text = np.datetime_as_string(occurred, unit="us", timezone="UTC")  # ...T12:00:00.000000Z
    else:
        # UTCDateTime stores naive UTC text on SQLite in SQLAlchemy's format; the rollup compares strings.
        occurred_text = np.strings.replace(np.datetime_as_string(occurred, unit="us"), "T", " ")
    return pd.DataFrame(
        {
            "event_id": [f"ev-{i}" for i in range(offset, offset + len(chunk))],
            "campaign_id": chunk["campaign_id"].to_numpy(dtype=object),
            "stage": chunk["stage"].to_numpy(dtype=object),
            "event_type": chunk["event_type"].to_numpy(dtype=object),
            "actor_id": _nullable(chunk["actor_id"]),
            "occurred_at": occurred_text.astype(object),
            "source": "bench",
            "properties": "{}",
        }
    )


def _nullable(column: pd.Series) -> np.ndarray:
    # pandas' str dtype reads a missing value back as NaN; the drivers need None for NULL.
    missing = column.isna().to_numpy()
    values = column.to_numpy(dtype=object, copy=True)
    values[missing] = None
    return values


def _copy_chunk(raw: Any, rows: pd.DataFrame) -> None:
    buffer = io.StringIO()
    # An empty unquoted CSV field is NULL to COPY: that is how a missing actor_id arrives.
    rows.assign(ingested_at=datetime.now(UTC).isoformat()).to_csv(buffer, index=False, header=False)
    buffer.seek(0)
    with raw.cursor() as cursor:
        cursor.copy_expert(COPY_SQL, buffer)
    raw.commit()


def _insert_chunk(raw: Any, rows: pd.DataFrame) -> None:
    now = datetime.now(UTC).replace(tzinfo=None).isoformat(sep=" ", timespec="microseconds")
    values = [(*row, now) for row in rows.itertuples(index=False, name=None)]
    cursor = raw.cursor()
    cursor.execute("BEGIN")
    cursor.executemany(
        f"INSERT INTO marketing_event ({', '.join(COLUMNS)}, ingested_at) VALUES ({', '.join('?' * 9)})", values
    )
    cursor.execute("COMMIT")
