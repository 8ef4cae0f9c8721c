"""Seconds to load a JSONL file of events with ``load_events_file`` (what ``marketing-pipelines events load`` runs),
next to the database's own floor for storing the same rows, on PostgreSQL.

- ``floor``: the rows the loader stores, already as COPY text in memory before the clock starts, ``COPY`` into a
  temporary staging table, then one ``INSERT ... SELECT ... ON CONFLICT (event_id) DO NOTHING`` into
  ``marketing_event`` (same table, indexes and foreign key), one transaction: the database's work alone.
- ``loader``: ``load_events_file(engine, path)`` in this process: read, parse, validate, write, record rejects,
  commit per chunk; with ``--via cli``, ``marketing-pipelines events load FILE`` as a subprocess, which adds
  its start-up (imports, the schema check) to that.

Two files: ``clean`` (every line valid) and ``rejects`` (every 10th line bad, of several kinds); each is
measured against the floor of its own outcome: for ``rejects`` the floor also COPYs its reject rows (line
number, raw line, hash, a reason) into a staging table and inserts them into ``marketing_event_reject`` with
``ON CONFLICT DO NOTHING``, as the loader must. ``marketing_event`` and ``marketing_event_reject`` are
truncated before every run; the methods alternate within each round and the order flips every round. The
fraction of floor is floor seconds / loader seconds (1.0: the loader costs nothing beyond the database's work).

    python benchmarks/events_load.py --events 300000 --rounds 3
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, date, datetime
from pathlib import Path
from typing import NamedTuple

import orjson
import pandas as pd
import sqlalchemy as sa
from _common import print_table, throwaway_database
from _measurement_events import campaign_ids, generate_events

from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.measurement.events.files import load_events_file

FIRST_DAY = date(2026, 1, 1)
DAYS = 30
CAMPAIGNS = 20
BAD_EVERY = 10
COLUMNS = ("event_id", "campaign_id", "stage", "event_type", "actor_id", "occurred_at", "source", "properties")
REJECT_COLUMNS = ("file", "line_number", "raw", "raw_sha256", "reason", "rejected_at")


def event_lines(events: int) -> list[tuple[bytes, tuple[str, ...] | None]]:
    """(JSONL line, COPY text fields or None for a bad line): a valid file's lines and the rows they store."""
    frame = generate_events(events, FIRST_DAY, DAYS, max(1, events // 4), CAMPAIGNS)
    occurred = frame["occurred_at"].dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ").tolist()
    lines = []
    for i, (campaign_id, stage, event_type, actor_id, at) in enumerate(
        zip(frame["campaign_id"], frame["stage"], frame["event_type"], frame["actor_id"], occurred, strict=True)
    ):
        record = {
            "event_id": f"ev-{i:09d}",
            "campaign_id": campaign_id,
            "stage": stage,
            "event_type": event_type,
            "actor_id": None if pd.isna(actor_id) else actor_id,
            "occurred_at": at,
            "source": "web",
            "properties": {"path": f"/pricing/{i % 97}", "referrer": "newsletter", "scroll": (i % 100) / 100},
        }
        row = (
            record["event_id"],
            campaign_id,
            stage,
            event_type,
            record["actor_id"] or "\\N",
            at,
            "web",
            orjson.dumps(record["properties"]).decode(),
        )
        lines.append((orjson.dumps(record), row))
    return lines


def bad_line(i: int, good: bytes) -> bytes:
    """A rejected line of one of several kinds, cycling with ``i``."""
    record = orjson.loads(good)
    kind = i % 6
    if kind == 0:
        return good[: len(good) // 2]  # truncated JSON
    if kind == 1:
        record["campaign_id"] = "no-such-campaign"
    elif kind == 2:
        del record["occurred_at"]
    elif kind == 3:
        record["occurred_at"] = record["occurred_at"].rstrip("Z")  # no UTC offset
    elif kind == 4:
        return good[:-1] + b', "properties": {"score": NaN}}'
    else:
        record["stage"] = "s" * 65
    return orjson.dumps(record)


class Workload(NamedTuple):
    path: Path
    rows: list[tuple[str, ...]]  # what a load stores in marketing_event, as COPY text fields
    rejects: list[tuple[str, ...]]  # what it stores in marketing_event_reject (the reason is a stand-in)


def write_files(folder: Path, events: int) -> dict[str, Workload]:
    """The clean and the reject-heavy file, with the rows a load of each stores."""
    lines = event_lines(events)
    files = {}
    for kind in ("clean", "rejects"):
        path = folder / f"{kind}.jsonl"
        label = str(path.resolve())
        rows, rejects = [], []
        with path.open("wb") as handle:
            for i, (line, row) in enumerate(lines, 1):
                if kind == "rejects" and i % BAD_EVERY == 0:
                    line = bad_line(i // BAD_EVERY, line)
                    text = line.decode()
                    sha = hashlib.sha256(line).hexdigest()
                    rejects.append((label, str(i), copy_escape(text), sha, "a reason of about this length: 'value'"))
                else:
                    rows.append(row)
                handle.write(line + b"\n")
        files[kind] = Workload(path, rows, rejects)
    return files


def copy_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def copy_buffer(rows: list[tuple[str, ...]]) -> bytes:
    """Rows as COPY text, with a last column of now (ingested_at or rejected_at); values come escaped."""
    now = datetime.now(UTC).isoformat()
    return "".join("\t".join(row) + "\t" + now + "\n" for row in rows).encode()


def floor(engine: sa.Engine, events: bytes, rejects: bytes) -> float:
    """COPY into staging tables, then INSERT ... SELECT ... ON CONFLICT DO NOTHING, in one transaction."""
    raw = engine.raw_connection()
    targets = [("marketing_event", (*COLUMNS, "ingested_at"), events, "(event_id)")]
    if rejects:
        targets.append(("marketing_event_reject", REJECT_COLUMNS, rejects, ""))
    try:
        began = time.perf_counter()
        with raw.cursor() as cursor:
            for table, columns, data, conflict_target in targets:
                names = ", ".join(columns)
                cursor.execute(f"CREATE TEMP TABLE floor_{table} ON COMMIT DROP AS SELECT {names} FROM {table} LIMIT 0")
                cursor.copy_expert(f"COPY floor_{table} ({names}) FROM STDIN", io.BytesIO(data), size=1 << 20)
                cursor.execute(
                    f"INSERT INTO {table} ({names}) SELECT {names} FROM floor_{table} "
                    f"ON CONFLICT {conflict_target} DO NOTHING"
                )
        raw.commit()
        return time.perf_counter() - began
    finally:
        raw.close()


def loader(engine: sa.Engine, path: Path, expected_rows: int, via: str) -> float:
    began = time.perf_counter()
    if via == "cli":
        url = engine.url.render_as_string(hide_password=False)
        done = subprocess.run(
            [str(Path(sys.executable).parent / "marketing-pipelines"), "events", "load", str(path)],
            env={**os.environ, "MARKETING_DATABASE_URL": url},
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - began
        if done.returncode != 0 or f"loaded {expected_rows}," not in done.stdout:
            raise SystemExit(f"{path.name}: {done.stdout} {done.stderr[-2000:]}")
        return seconds
    counts = load_events_file(engine, path)
    seconds = time.perf_counter() - began
    if counts.loaded != expected_rows:
        raise SystemExit(f"{path.name}: loaded {counts.loaded}, expected {expected_rows}")
    return seconds


def stored_rows(engine: sa.Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        return tuple(
            conn.execute(
                sa.text("SELECT (SELECT count(*) FROM marketing_event), (SELECT count(*) FROM marketing_event_reject)")
            ).one()
        )


def empty_tables(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.execute(sa.text("TRUNCATE marketing_event, marketing_event_reject"))
        conn.execute(sa.text("CHECKPOINT"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300_000, help="lines of each file (300000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the median is printed (3)")
    parser.add_argument(
        "--via", choices=["function", "cli"], default="function", help="call load_events_file, or run the CLI"
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mp-events-load-") as folder, throwaway_database("postgres") as url:
        files = write_files(Path(folder), args.events)
        buffers = {kind: (copy_buffer(w.rows), copy_buffer(w.rejects)) for kind, w in files.items()}
        engine = get_engine(url)
        with engine.begin() as conn:
            for campaign_id in campaign_ids(CAMPAIGNS):
                upsert_campaign(conn, Campaign(campaign_id, campaign_id, "bench"))
        times: dict[tuple[str, str], list[float]] = {}
        run_rows = []
        for round_number in range(args.rounds):
            for kind, work in files.items():
                methods: list[tuple[str, Callable[[], float]]] = [
                    ("floor", lambda kind=kind: floor(engine, *buffers[kind])),
                    ("loader", lambda work=work: loader(engine, work.path, len(work.rows), args.via)),
                ]
                if round_number % 2:
                    methods.reverse()
                measured = {}
                for method, run in methods:
                    empty_tables(engine)
                    measured[method] = run()
                    if stored_rows(engine) != (len(work.rows), len(work.rejects)):
                        raise SystemExit(f"{method} stored {stored_rows(engine)} rows of {kind}")
                    times.setdefault((kind, method), []).append(measured[method])
                run_rows.append(
                    (
                        round_number + 1,
                        kind,
                        len(work.rows),
                        len(work.rejects),
                        measured["floor"],
                        measured["loader"],
                        measured["floor"] / measured["loader"],
                    )
                )
        print_table(
            f"events load ({args.via}), PostgreSQL, {args.events:,} lines a file (seconds; fraction = floor / loader)",
            ["round", "file", "rows", "rejects", "floor s", "loader s", "fraction of floor"],
            run_rows,
        )
        median_rows = []
        for kind, work in files.items():
            floor_s = statistics.median(times[(kind, "floor")])
            loader_s = statistics.median(times[(kind, "loader")])
            fraction = statistics.median(f for _, k, *_, f in run_rows if k == kind)
            median_rows.append(
                (kind, args.events, len(work.rejects), floor_s, loader_s, args.events / loader_s, fraction)
            )
        print_table(
            f"medians of {args.rounds} round(s)",
            ["file", "lines", "rejects", "floor s", "loader s", "lines/s", "fraction of floor"],
            median_rows,
        )


if __name__ == "__main__":
    main()
