"""Milliseconds per execution inside ``marketing_execution_job``'s op, against the bare SQL floor.

For each ``--executions`` size, ``--repeat`` times, side by side:

* **op**: N ``log`` (or ``webhook``) executions due now in a throwaway PostgreSQL application
  database are claimed by one ``due_executions_sensor`` evaluation (``executions_per_run`` = N, so
  one run) and that run is executed in this process on a PostgreSQL Dagster instance, as a run
  worker executes it. Its time is the op's STEP_START to STEP_SUCCESS in the event log, so Dagster's
  own event-log writes from inside the op (its log lines, its output) are counted, run start-up is not.
  Every statement the op sends to the application database is recorded on the way
  (SQLAlchemy's ``before_cursor_execute``), with its transaction.
* **floor**: the same statements with the same parameters, transaction by transaction in commit
  order, sent bare with psycopg2 over one connection to a second database prepared identically
  (same rows, same claim). Afterwards both databases must hold the same outcomes, so the floor did
  the same work. No Python between the statements: what the SQL alone costs.

Prints ms per execution for both and their ratio, the median of the rounds, with the load average.

    python benchmarks/per_execution.py
    python benchmarks/per_execution.py --executions 250 1000 --repeat 3
    python benchmarks/per_execution.py --action webhook --executions 250
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
import psycopg2
import sqlalchemy as sa
from _common import ReceiverServer, insert_due, print_table, throwaway_database
from _daemon import dagster_storage_database, environ

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.jobs import OP_NAME, marketing_execution_job
from marketing_pipelines.executions.queue import EXECUTIONS
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.sensors import build_due_executions_sensor
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.leasing.lease import claim_batch
from marketing_pipelines_tests.factories import add_campaign

# Evaluated directly, as the daemon would: the interval only paces the daemon's ticks.
due_executions_sensor = build_due_executions_sensor(interval_seconds=1)

DEPLOY_YAML = Path(__file__).resolve().parent.parent / "deploy" / "dagster.yaml"


@dataclass
class Capture:
    """Statements per connection, moved to ``transactions`` when their transaction commits."""

    open: dict[int, list[tuple[str, Any, bool]]] = field(default_factory=lambda: defaultdict(list))
    transactions: list[list[tuple[str, Any, bool]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attach(self, engine: sa.Engine) -> None:
        @sa.event.listens_for(engine, "before_cursor_execute")
        def _statement(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
            with self.lock:
                self.open[id(conn.connection.dbapi_connection)].append((statement, parameters, executemany))

        @sa.event.listens_for(engine, "commit")
        def _commit(conn):  # type: ignore[no-untyped-def]
            with self.lock:
                statements = self.open.pop(id(conn.connection.dbapi_connection), [])
                if statements:
                    self.transactions.append(statements)

        @sa.event.listens_for(engine, "rollback")
        def _rollback(conn):  # type: ignore[no-untyped-def]
            with self.lock:
                # A read-only connection block ends in a rollback: its reads still cost the op.
                statements = self.open.pop(id(conn.connection.dbapi_connection), [])
                if statements:
                    self.transactions.append(statements)

    def statements(self) -> int:
        return sum(len(t) for t in self.transactions)


def _prepare(url: str, n: int, action: str, hook_url: str | None) -> None:
    engine = get_engine(url)
    add_campaign(engine)
    insert_due(engine, n, action, hook_url, "spring-launch")


def _claim(url: str, instance: dg.DagsterInstance, settings: ExecutionSettings) -> dg.RunRequest:
    context = dg.build_sensor_context(
        instance=instance, resources={"app_db": AppDatabase(url=url), "execution_settings": settings}
    )
    result = due_executions_sensor(context)
    assert isinstance(result, dg.SensorResult) and result.run_requests, f"the sensor claimed nothing: {result}"
    [request] = result.run_requests
    return request


def _outcomes(url: str) -> list[tuple[int, str, int]]:
    with get_engine(url).connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                sa.text(
                    "SELECT e.id, e.status, count(a.*) FROM marketing_execution e "
                    "LEFT JOIN marketing_execution_attempt a ON a.execution_id = e.id AND a.outcome IS NOT NULL "
                    "GROUP BY e.id, e.status ORDER BY e.id"
                )
            )
        ]


def _op_seconds(instance: dg.DagsterInstance, run_id: str) -> float:
    types = {dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE}
    events = {
        e.dagster_event_type: e.timestamp for e in instance.all_logs(run_id, of_type=types) if e.step_key == OP_NAME
    }
    assert dg.DagsterEventType.STEP_SUCCESS in events, f"the op did not succeed: {events}"
    return events[dg.DagsterEventType.STEP_SUCCESS] - events[dg.DagsterEventType.STEP_START]


def _replay(url: str, transactions: list[list[tuple[str, Any, bool]]]) -> float:
    dsn = sa.engine.make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = psycopg2.connect(dsn)
    try:
        began = time.perf_counter()
        with conn.cursor() as cur:
            for statements in transactions:
                for statement, parameters, many in statements:
                    # As SQLAlchemy's psycopg2 dialect sent them: executemany where it used executemany.
                    (cur.executemany if many else cur.execute)(statement, parameters)
                conn.commit()
        return time.perf_counter() - began
    finally:
        conn.close()


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def _receiver() -> Iterator[str]:
    server = ReceiverServer(("127.0.0.1", 0), _Receiver)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook"
    finally:
        server.shutdown()


def one_round(n: int, action: str, hook_url: str | None, home: Path, profile: int = 0) -> tuple[float, float, int]:
    """(op seconds, floor seconds, statements) for one batch of ``n``; ``profile``: print that many of the
    run's functions by own time (cProfile, the op's threads not included)."""
    settings = ExecutionSettings(executions_per_run=n, batch_size=n)
    with throwaway_database("postgres") as op_url, throwaway_database("postgres") as floor_url:
        _prepare(op_url, n, action, hook_url)
        _prepare(floor_url, n, action, hook_url)
        with dg.DagsterInstance.from_config(str(home)) as instance:
            request = _claim(op_url, instance, settings)
            claimed_by = request.tags["marketing/claimed_by"]
            # The floor's rows carry the same claim, so the recorded statements match them as they matched the op's.
            with get_engine(floor_url).begin() as conn:
                claim_batch(conn, EXECUTIONS, claimed_by, n, settings.lease_seconds)
            engine = get_engine(op_url)
            capture = Capture()
            capture.attach(engine)
            # The op prints a line per success to the run's stdout (captured by a real run worker).
            profiler = cProfile.Profile() if profile else None
            with contextlib.redirect_stdout(io.StringIO()), profiler or contextlib.nullcontext():
                result = marketing_execution_job.execute_in_process(
                    run_config=request.run_config,
                    tags=request.tags,
                    instance=instance,
                    resources={
                        "app_db": AppDatabase(url=op_url),
                        "webhook": WebhookClient(timeout_s=5, allow_networks=["127.0.0.1/32"]),
                        "execution_settings": settings,
                    },
                )
            op_s = _op_seconds(instance, result.run_id)
        if profiler is not None:
            pstats.Stats(profiler).sort_stats("tottime").print_stats(profile)
        floor_s = _replay(floor_url, capture.transactions)
        op_rows, floor_rows = _outcomes(op_url), _outcomes(floor_url)
        assert all(status == "SUCCEEDED" and attempts == 1 for _, status, attempts in op_rows), op_rows[:5]
        assert op_rows == floor_rows, "the floor's replay did not leave the same outcomes as the op"
        return op_s, floor_s, capture.statements()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--executions", type=int, nargs="+", default=[250, 1000], help="batch sizes (at most 1000)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds per size (default 3; the median is shown)")
    parser.add_argument("--action", choices=["log", "webhook"], default="log")
    parser.add_argument(
        "--profile", type=int, default=0, metavar="N", help="print each round's N costliest functions (cProfile)"
    )
    parser.add_argument(
        "--remember-secrets",
        type=int,
        default=0,
        metavar="N",
        help="secrets the process holds, as a deployment's does (API keys, the sealing key, endpoint secrets): "
        "every redaction looks for each (default 0)",
    )
    args = parser.parse_args()
    if args.remember_secrets:
        from marketing_pipelines.redact import remember_secrets

        remember_secrets(*(f"sk-bench-{i:04d}-{os.urandom(16).hex()}" for i in range(args.remember_secrets)))
    for n in args.executions:
        if not 1 <= n <= 1000:
            parser.error(f"--executions {n}: a run performs 1 to 1000 executions (MARKETING_EXECUTIONS_PER_RUN)")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")

    rows = []
    with (
        dagster_storage_database() as pg,
        environ(pg),
        _receiver() as hook_url,
    ):
        home = Path(os.environ.get("TMPDIR", "/tmp")) / f"mp-per-exec-{os.getpid()}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "dagster.yaml").write_text(DEPLOY_YAML.read_text())
        for n in args.executions:
            samples = []
            for i in range(args.repeat):
                op_s, floor_s, statements = one_round(
                    n, args.action, hook_url if args.action == "webhook" else None, home, args.profile
                )
                samples.append((op_s, floor_s))
                print(
                    f"{n} {args.action}, round {i + 1}: op {op_s * 1000 / n:.2f} ms/execution, "
                    f"floor {floor_s * 1000 / n:.2f} ms/execution ({statements} statements), "
                    f"load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
            op_ms = [s[0] * 1000 / n for s in samples]
            floor_ms = [s[1] * 1000 / n for s in samples]
            rows.append(
                (
                    n,
                    args.action,
                    statistics.median(op_ms),
                    f"{min(op_ms):.2f}-{max(op_ms):.2f}",
                    statistics.median(floor_ms),
                    statistics.median(o / f for o, f in zip(op_ms, floor_ms, strict=True)),
                )
            )
    print_table(
        f"ms per execution, median of {args.repeat} (load average {os.getloadavg()[0]:.1f})",
        ["executions", "action", "op ms", "op range", "floor ms", "op / floor"],
        rows,
    )


if __name__ == "__main__":
    main()
