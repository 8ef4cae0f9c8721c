"""Due executions worked end to end by the real ``dagster-daemon``: batched runs next to one run per execution.

For each shape this starts ``dagster-daemon run`` on a PostgreSQL Dagster instance (a throwaway
database of its own, ``deploy/dagster.yaml``) and a throwaway application database, waits until
the daemon has ticked ``due_executions_sensor`` once with nothing due (so start-up is not
measured), then makes N executions due at once and polls the application database until every
row is SUCCEEDED. Everything in between is real: sensor ticks, the queued run coordinator, one
process per run, the actions, the outcome written by the run.

Shapes, measured side by side in one invocation (absolute numbers drift on a shared machine,
the ratio holds):

* ``batched``: MARKETING_EXECUTIONS_PER_RUN left at its default (or ``--per-run N``);
* ``one``: MARKETING_EXECUTIONS_PER_RUN=1, one Dagster run per execution.

Reported per shape: Dagster runs used, seconds from the due time to the last ``finished_at``,
executions per minute, median and p95 of ``finished_at - due_at``, and whether every execution
happened exactly once (one attempt, SUCCEEDED, and for webhooks one POST received). A shape that
hits ``--timeout`` reports what finished and the extrapolated rate.

``--single N`` also measures the latency of a lone execution due now, N times in sequence, with
the default settings (a random 0-5 s pause between samples so they do not line up with the
sensor's interval). ``--agent N`` does the same for an agent run requested while a pool slot is
free: from ``requested_at`` to the row turning RUNNING (claimed) and to the agent's first
transcript step (its op running in the slot), offline provider.

    python benchmarks/e2e_executions.py
    python benchmarks/e2e_executions.py --executions 60 --shapes batched one --timeout 300
    python benchmarks/e2e_executions.py --action webhook --executions 400 --receiver-delay-ms 200
    python benchmarks/e2e_executions.py --shapes batched --per-run 250 --executions 1000
    python benchmarks/e2e_executions.py --single 10 --agent 10 --executions 0
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import random
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import dagster as dg
import sqlalchemy as sa
from _common import ReceiverServer, insert_due, print_table
from _daemon import Daemon, deployment, log_findings

from marketing_pipelines.db.campaigns import Campaign, upsert_campaign
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution, marketing_execution_attempt
from marketing_pipelines.settings import load_settings

SENSOR = "due_executions_sensor"
JOB = "marketing_execution_job"
CAMPAIGN = "bench"
BOOT_TIMEOUT_S = 240.0  # daemon start until its first tick of the sensor
DRAIN_TIMEOUT_S = 120.0  # after the last row: until the Dagster runs themselves have ended
IDEMPOTENCY_KEY = re.compile(r"^marketing-execution-(\d+)$")  # one key per execution; attempt in its own header
SERIOUS = re.compile(r"ERROR|Traceback|CRITICAL")
TERMINAL = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _status_counts(engine: sa.Engine) -> Counter[str]:
    t = marketing_execution
    with engine.connect() as conn:
        return Counter(dict(conn.execute(sa.select(t.c.status, sa.func.count()).group_by(t.c.status)).all()))


# --- the webhook receiver ----------------------------------------------------------------------


@dataclass
class Receiver:
    delay_s: float
    port: int = 0
    posts: Counter[int] = field(default_factory=Counter)  # execution id (from Idempotency-Key) -> POSTs
    bodies: Counter[int] = field(default_factory=Counter)  # body["execution"] -> POSTs
    unparsed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"


@contextlib.contextmanager
def webhook_receiver(delay_s: float) -> Iterator[Receiver]:
    """A threaded HTTP server on 127.0.0.1 answering 200 after ``delay_s``, counting POSTs per execution."""
    import json

    receiver = Receiver(delay_s)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length", "0")))
            key = IDEMPOTENCY_KEY.match(self.headers.get("Idempotency-Key", ""))
            try:
                body = json.loads(raw or b"null")
                index = body.get("execution") if isinstance(body, dict) else None
            except ValueError:
                index = None
            with receiver.lock:
                if key:
                    receiver.posts[int(key.group(1))] += 1
                if isinstance(index, int):
                    receiver.bodies[index] += 1
                if not key or not isinstance(index, int):
                    receiver.unparsed += 1
            time.sleep(receiver.delay_s)
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"ok": true}')

        def log_message(self, *args: Any) -> None:
            pass

    server = ReceiverServer(("127.0.0.1", 0), Handler)
    receiver.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


# --- one daemon session ------------------------------------------------------------------------


@dataclass
class Session:
    """A running daemon on fresh databases, with the instance it writes to."""

    engine: sa.Engine
    instance: dg.DagsterInstance
    daemon: Daemon
    boot_s: float


@contextlib.contextmanager
def daemon_session(label: str, overrides: Mapping[str, str], log_dir: Path) -> Iterator[Session]:
    """Fresh application and Dagster databases, a DAGSTER_HOME, a running daemon that has ticked once."""
    with deployment() as deployed:
        home = deployed.home
        engine = get_engine(deployed.app_url)
        with engine.begin() as conn:
            upsert_campaign(conn, Campaign(id=CAMPAIGN, name="Bench", owner="bench"))
        # Opening the instance once creates Dagster's tables before the daemon starts.
        with dg.DagsterInstance.from_config(str(home)) as instance:
            began = time.monotonic()
            daemon = Daemon.start(deployed.env(overrides), log_dir / f"daemon-{label}.log")
            try:
                _wait_first_tick(instance, daemon)
                yield Session(engine, instance, daemon, time.monotonic() - began)
            finally:
                daemon.stop()
                engine.dispose()


def _sensor_ticks(instance: dg.DagsterInstance) -> list[Any]:
    states = [
        s
        for s in instance.all_instigator_state()
        if s.instigator_type.value == "SENSOR" and s.instigator_name == SENSOR
    ]
    return [t for s in states for t in instance.get_ticks(s.instigator_origin_id, s.selector_id)]


def _wait_first_tick(instance: dg.DagsterInstance, daemon: Daemon) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while time.monotonic() < deadline:
        daemon.check_alive()
        if any(t.status.value in ("SKIPPED", "SUCCESS") for t in _sensor_ticks(instance)):
            return
        failed = [t for t in _sensor_ticks(instance) if t.status.value == "FAILURE"]
        if failed:
            raise RuntimeError(f"{SENSOR} tick failed: {failed[-1].error}")
        time.sleep(0.5)
    raise RuntimeError(f"no {SENSOR} tick within {BOOT_TIMEOUT_S:.0f}s; daemon log:\n{daemon.log_tail()}")


def _tick_gap_note(instance: dg.DagsterInstance) -> str:
    """How often the daemon actually ticked the sensor (its minimum interval is only a lower bound)."""
    stamps = sorted(t.timestamp for t in _sensor_ticks(instance))
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    if not gaps:
        return f"{SENSOR}: {len(stamps)} tick(s)"
    return f"{SENSOR} ticked every {statistics.median(gaps):.1f} s (median of {len(gaps)} gaps, max {max(gaps):.1f} s)"


def _wait_runs_ended(
    instance: dg.DagsterInstance, daemon: Daemon, timeout: float, job: str | None = JOB
) -> Counter[str]:
    """Wait (bounded) until every run of ``job`` (every run, when None) has ended; returns runs per status."""
    deadline = time.monotonic() + timeout
    while True:
        runs = instance.get_runs(filters=dg.RunsFilter(job_name=job) if job else None)
        if all(r.status in TERMINAL for r in runs) or time.monotonic() > deadline or daemon.process.poll() is not None:
            return Counter(r.status.value for r in runs)
        time.sleep(1)


def _run_failures(instance: dg.DagsterInstance, limit: int = 3) -> list[str]:
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=JOB, statuses=[dg.DagsterRunStatus.FAILURE]), limit=limit)
    found = []
    for run in runs:
        records = instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
        message = records[-1].event_log_entry.dagster_event.message if records else "(no failure event)"
        found.append(f"run {run.run_id}: {message}")
    return found


# --- measurements ------------------------------------------------------------------------------


def _p95(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


@dataclass
class Result:
    shape: str
    per_run: str
    action: str
    n: int
    runs: int
    finished: int
    total_s: float
    per_minute: float
    median_s: float
    p95_s: float
    exactly_once: str
    timed_out: bool
    notes: list[str]
    phases: dict[str, float]


def measure_throughput(
    session: Session, shape: str, per_run: str, args: argparse.Namespace, receiver: Receiver | None
) -> Result:
    engine, n = session.engine, args.executions
    due = insert_due(engine, n, args.action, receiver.url if receiver else None, CAMPAIGN)
    measure_began = time.monotonic()
    deadline = measure_began + args.timeout
    timed_out = False
    while True:
        session.daemon.check_alive()
        counts = _status_counts(engine)
        if counts.get("SUCCEEDED", 0) == n or counts.get("FAILED", 0) + counts.get("SUCCEEDED", 0) == n:
            break
        if time.monotonic() > deadline:
            timed_out = True
            break
        time.sleep(args.poll)
    measure_s = time.monotonic() - measure_began

    t, a = marketing_execution, marketing_execution_attempt
    with engine.connect() as conn:
        rows = conn.execute(sa.select(t.c.id, t.c.status, t.c.attempts, t.c.run_id, t.c.due_at, t.c.finished_at)).all()
        attempt_rows = dict(conn.execute(sa.select(a.c.execution_id, sa.func.count()).group_by(a.c.execution_id)).all())
    done = [r for r in rows if r.status == "SUCCEEDED" and r.finished_at is not None]
    latencies = [(r.finished_at - r.due_at).total_seconds() for r in done]
    total_s = max(((r.finished_at - due).total_seconds() for r in done), default=0.0)
    runs = len({r.run_id for r in rows if r.run_id})
    notes: list[str] = []
    statuses = Counter(r.status for r in rows)
    if set(statuses) != {"SUCCEEDED"}:
        notes.append(f"row statuses: {dict(statuses)}")
    once = len(done) == n and all(r.attempts == 1 and attempt_rows.get(r.id) == 1 for r in rows)
    retried = [r.id for r in rows if r.attempts != 1 or attempt_rows.get(r.id, 0) != 1]
    if retried:
        notes.append(f"{len(retried)} executions with attempts != 1, e.g. ids {retried[:5]}")
    if receiver is not None:
        ids = {r.id for r in rows}
        with receiver.lock:
            posts, bodies, unparsed = Counter(receiver.posts), Counter(receiver.bodies), receiver.unparsed
        wrong = {i: posts.get(i, 0) for i in ids if posts.get(i, 0) != 1}
        wrong_bodies = {i: bodies.get(i, 0) for i in range(n) if bodies.get(i, 0) != 1}
        if wrong or wrong_bodies or unparsed or set(posts) - ids:
            once = False
            notes.append(
                "webhook POSTs not exactly once: "
                f"{len(wrong)} ids by Idempotency-Key (e.g. {dict(list(wrong.items())[:5])}), "
                f"{len(wrong_bodies)} by body, {unparsed} unparsed, {len(set(posts) - ids)} unknown ids"
            )
    drain_began = time.monotonic()
    run_statuses = _wait_runs_ended(session.instance, session.daemon, DRAIN_TIMEOUT_S)
    drain_s = time.monotonic() - drain_began
    if set(run_statuses) - {"SUCCESS"}:
        notes.append(f"Dagster runs of {JOB}: {dict(run_statuses)}")
        notes += _run_failures(session.instance)
    notes.append(_tick_gap_note(session.instance))
    if timed_out:
        rate = len(done) / total_s * 60 if total_s else 0.0
        eta = f"{n / rate * 60:,.0f} s" if rate else "unknown"
        notes.append(
            f"TIMEOUT after {args.timeout:.0f} s: {len(done)} of {n} finished; "
            f"extrapolated {rate:,.1f} executions/min, so all {n} in about {eta}"
        )
    return Result(
        shape=shape + (" (TIMEOUT)" if timed_out else ""),
        per_run=per_run,
        action=args.action,
        n=n,
        runs=runs,
        finished=len(done),
        total_s=total_s,
        per_minute=len(done) / total_s * 60 if total_s else 0.0,
        median_s=statistics.median(latencies) if latencies else float("nan"),
        p95_s=_p95(latencies) if latencies else float("nan"),
        exactly_once="n/a (timeout)" if timed_out else ("yes" if once else "no"),
        timed_out=timed_out,
        notes=notes,
        phases={"boot": session.boot_s, "measure": measure_s, "drain": drain_s},
    )


def measure_single(session: Session, samples: int, timeout: float) -> tuple[list[float], list[str]]:
    """Latency of one execution due now, ``samples`` times in sequence."""
    t = marketing_execution
    latencies: list[float] = []
    notes: list[str] = []
    for sample in range(samples):
        if sample:
            # The previous run has ended too (not just its row), then a pause off the sensor's beat.
            _wait_runs_ended(session.instance, session.daemon, DRAIN_TIMEOUT_S)
            time.sleep(random.uniform(0, 5))
        due = insert_due(session.engine, 1, "log", None, CAMPAIGN, first=sample)
        deadline = time.monotonic() + timeout
        while True:
            session.daemon.check_alive()
            with session.engine.connect() as conn:
                row = conn.execute(
                    sa.select(t.c.status, t.c.finished_at, t.c.attempts).order_by(t.c.id.desc()).limit(1)
                ).one()
            if row.status in ("SUCCEEDED", "FAILED"):
                break
            if time.monotonic() > deadline:
                notes.append(f"sample {sample + 1}: not finished after {timeout:.0f} s (status {row.status})")
                return latencies, notes
            time.sleep(0.1)
        if row.status != "SUCCEEDED" or row.attempts != 1:
            notes.append(f"sample {sample + 1}: {row.status} after {row.attempts} attempt(s)")
        if row.finished_at is not None:
            latencies.append((row.finished_at - due).total_seconds())
    notes.append(_tick_gap_note(session.instance))
    run_statuses = _wait_runs_ended(session.instance, session.daemon, DRAIN_TIMEOUT_S)
    if set(run_statuses) - {"SUCCESS"}:
        notes.append(f"Dagster runs of {JOB}: {dict(run_statuses)}")
        notes += _run_failures(session.instance)
    return latencies, notes


def request_offline_analyses(engine: sa.Engine, n: int) -> list[int]:
    """``n`` measurement_analyst runs on the offline model, requested by "bench" (added with the grants they need)."""
    from marketing_pipelines.agents import users
    from marketing_pipelines.agents.queue import request_agent_run

    settings = load_settings()
    with engine.begin() as conn:
        if users.get_user(conn, "bench") is None:
            users.add_user(conn, "bench")
            users.grant(conn, "bench", "campaign:read")
            users.grant(conn, "bench", "measurement:read")
        return [
            request_agent_run(
                conn,
                agent="measurement_analyst",
                campaign_id=CAMPAIGN,
                requested_by="bench",
                provider="offline",
                settings=settings,
            )
            for _ in range(n)
        ]


def measure_agent(session: Session, samples: int, timeout: float) -> tuple[list[float], list[float], list[str]]:
    """Seconds from ``requested_at`` to RUNNING and to the first transcript step, ``samples`` times."""
    from marketing_pipelines.db.schema import agent_run, agent_run_step

    claimed: list[float] = []
    working: list[float] = []
    notes: list[str] = []
    for sample in range(samples):
        if sample:
            _wait_runs_ended(session.instance, session.daemon, DRAIN_TIMEOUT_S, job=None)
            time.sleep(random.uniform(0, 5))
        [run_id] = request_offline_analyses(session.engine, 1)
        deadline = time.monotonic() + timeout
        while True:
            session.daemon.check_alive()
            with session.engine.connect() as conn:
                row = conn.execute(
                    sa.select(agent_run.c.status, agent_run.c.requested_at, agent_run.c.started_at).where(
                        agent_run.c.id == run_id
                    )
                ).one()
                first_step = conn.execute(
                    sa.select(sa.func.min(agent_run_step.c.created_at)).where(agent_run_step.c.agent_run_id == run_id)
                ).scalar_one()
            if first_step is not None and row.status in ("SUCCEEDED", "FAILED"):
                break
            if time.monotonic() > deadline:
                notes.append(f"agent sample {sample + 1}: {row.status} after {timeout:.0f} s")
                return claimed, working, notes
            time.sleep(0.1)
        if row.status != "SUCCEEDED":
            notes.append(f"agent sample {sample + 1}: {row.status}")
        claimed.append((row.started_at - row.requested_at).total_seconds())
        working.append((first_step - row.requested_at).total_seconds())
    run_statuses = _wait_runs_ended(session.instance, session.daemon, DRAIN_TIMEOUT_S, job="agent_run_job")
    if set(run_statuses) - {"SUCCESS"}:
        notes.append(f"Dagster runs of agent_run_job: {dict(run_statuses)}")
    return claimed, working, notes


def _throughput_shape(
    shape: str, overrides: Mapping[str, str], args: argparse.Namespace, log_dir: Path
) -> tuple[Result, tuple[float, ...]]:
    """One shape on its own daemon and databases; returns its result and the wall time of each part."""
    per_run = overrides.get("MARKETING_EXECUTIONS_PER_RUN", "default")
    began = time.monotonic()
    print(f"[{shape}] starting dagster-daemon (MARKETING_EXECUTIONS_PER_RUN={per_run}) ...", flush=True)
    receiving = webhook_receiver(args.receiver_delay_ms / 1000) if args.action == "webhook" else _nothing()
    with receiving as receiver, daemon_session(shape, overrides, log_dir) as session:
        print(f"[{shape}] first sensor tick after {session.boot_s:.1f} s; {args.executions} due now", flush=True)
        result = measure_throughput(session, shape, per_run, args, receiver)
        teardown_began = time.monotonic()
    teardown_s = time.monotonic() - teardown_began
    print(f"[{shape}] done: {result.finished}/{result.n} in {result.total_s:.1f} s", flush=True)
    p = result.phases
    return result, (p["boot"], p["measure"], p["drain"], teardown_s, time.monotonic() - began)


# --- main --------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=["batched", "one"],
        default=["batched", "one"],
        help="batched: MARKETING_EXECUTIONS_PER_RUN at its default (or --per-run); one: MARKETING_EXECUTIONS_PER_RUN=1",
    )
    parser.add_argument("--per-run", type=int, default=None, help="MARKETING_EXECUTIONS_PER_RUN of the batched shape")
    parser.add_argument(
        "--webhook-concurrency", type=int, default=None, help="MARKETING_WEBHOOK_CONCURRENCY of every shape (1 to 64)"
    )
    parser.add_argument(
        "--executions", type=int, default=1000, help="executions made due at once per shape (0: skip throughput)"
    )
    parser.add_argument("--action", choices=["log", "webhook"], default="log", help="what each execution does")
    parser.add_argument(
        "--receiver-delay-ms", type=float, default=200.0, help="webhook receiver's delay before answering 200"
    )
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per shape from the due time")
    parser.add_argument(
        "--single",
        type=int,
        default=0,
        help="also measure a lone execution due now this many times in sequence, default settings (0: off)",
    )
    parser.add_argument(
        "--agent",
        type=int,
        default=0,
        help="also measure an agent run requested while a slot is free, this many times in sequence (0: off)",
    )
    parser.add_argument(
        "--peer",
        choices=["procrastinate"],
        default=None,
        help="also drain the same number of no-op jobs with this PostgreSQL job queue on the same server, worker "
        "concurrency 1 and 4, the better counted (needs the [bench] extra)",
    )
    parser.add_argument("--poll", type=float, default=0.5, help="seconds between polls of the application database")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep the daemon logs here (default: a temp dir)")
    args = parser.parse_args()
    if args.executions < 0 or args.single < 0 or args.agent < 0:
        parser.error("--executions, --single and --agent must be >= 0")
    if args.per_run is not None and not 1 <= args.per_run <= 1000:
        parser.error("--per-run must be between 1 and 1000")
    if args.webhook_concurrency is not None and not 1 <= args.webhook_concurrency <= 64:
        parser.error("--webhook-concurrency must be between 1 and 64")

    keep_logs = args.log_dir is not None
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="mp-bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    single: tuple[list[float], list[str]] | None = None
    agent: tuple[list[float], list[float], list[str]] | None = None
    completed = False
    failures: list[str] = []
    phase_rows: list[tuple[Any, ...]] = []
    log_notes: list[tuple[str, list[str]]] = []
    peer_rows: list[tuple[Any, ...]] = []
    try:
        if args.executions:
            # The daemon's environment is built from these alone: MARKETING_* variables of this shell are not passed.
            concurrency = args.webhook_concurrency
            common = {"MARKETING_WEBHOOK_CONCURRENCY": str(concurrency)} if concurrency else {}
            shapes = {
                "batched": {**common, **({"MARKETING_EXECUTIONS_PER_RUN": str(args.per_run)} if args.per_run else {})},
                "one": {**common, "MARKETING_EXECUTIONS_PER_RUN": "1"},
            }
            for shape in args.shapes:
                try:
                    result, phases = _throughput_shape(shape, shapes[shape], args, log_dir)
                except Exception:
                    # The daemon is stopped and the databases dropped by now; measure the other shapes.
                    failures.append(shape)
                    print(f"[{shape}] FAILED:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
                    continue
                finally:
                    log_notes.append((shape, log_findings(log_dir / f"daemon-{shape}.log")))
                results.append(result)
                phase_rows.append((shape, *phases))

        if args.single or args.agent:
            began = time.monotonic()
            print(
                f"[single] starting dagster-daemon (default settings) for {args.single} execution and "
                f"{args.agent} agent-run samples ...",
                flush=True,
            )
            with daemon_session("single", {}, log_dir) as session:
                boot_s = session.boot_s
                measure_began = time.monotonic()
                if args.single:
                    single = measure_single(session, args.single, args.timeout)
                if args.agent:
                    agent = measure_agent(session, args.agent, args.timeout)
                measure_s = time.monotonic() - measure_began
                teardown_began = time.monotonic()
            phase_rows.append(
                ("single", boot_s, measure_s, 0.0, time.monotonic() - teardown_began, time.monotonic() - began)
            )
            log_notes.append(("single", log_findings(log_dir / "daemon-single.log")))
        if args.peer and args.executions:
            peer_rows = _peer_rows(args, results)
        completed = True
    finally:
        # Keep the daemon logs when asked, or when something went wrong and they tell why.
        serious = any(SERIOUS.search(line) for _, findings in log_notes for line in findings)
        wrong = any(r.exactly_once != "yes" for r in results) or (
            single is not None and any(not note.startswith(SENSOR) for note in single[1])
        )
        if keep_logs or not completed or failures or serious or wrong:
            print(f"\ndaemon logs kept in {log_dir}")
        else:
            shutil.rmtree(log_dir, ignore_errors=True)

    if results:
        print_table(
            f"end to end through dagster-daemon: {args.executions} executions due at once ({args.action})",
            [
                "shape",
                "executions/run",
                "action",
                "N",
                "runs",
                "total s",
                "executions/min",
                "median latency s",
                "p95 latency s",
                "exactly-once",
            ],
            [
                (
                    r.shape,
                    r.per_run,
                    r.action,
                    r.n if not r.timed_out else f"{r.finished}/{r.n}",
                    r.runs,
                    r.total_s,
                    r.per_minute,
                    r.median_s,
                    r.p95_s,
                    r.exactly_once,
                )
                for r in results
            ],
        )
        by_shape = {r.shape.split()[0]: r for r in results}
        if "batched" in by_shape and "one" in by_shape and by_shape["one"].per_minute:
            ratio = by_shape["batched"].per_minute / by_shape["one"].per_minute
            print(f"\nbatched / one, executions per minute: {ratio:.1f}x")
        for r in results:
            for note in r.notes:
                print(f"  [{r.shape}] {note}")
    if single is not None:
        latencies, notes = single
        print_table(
            "single execution due now, default settings (finished_at - due_at)",
            ["samples", "median s", "min s", "max s"],
            [
                (
                    len(latencies),
                    *((statistics.median(latencies), min(latencies), max(latencies)) if latencies else ("-",) * 3),
                )
            ],
        )
        for note in notes:
            print(f"  [single] {note}")
    if agent is not None:
        claimed, working, notes = agent
        print_table(
            "agent run requested while a pool slot is free, default settings (seconds after requested_at)",
            ["samples", "RUNNING median", "RUNNING max", "first step median", "first step max"],
            [
                (
                    len(working),
                    *(
                        (statistics.median(claimed), max(claimed), statistics.median(working), max(working))
                        if working
                        else ("-",) * 4
                    ),
                )
            ],
        )
        for note in notes:
            print(f"  [agent] {note}")
    if peer_rows:
        print_table(
            f"against {args.peer}: {args.executions} due at once, seconds from due to done",
            ["executions", "this project (batched)", f"{args.peer} c=1", f"{args.peer} c=4", "project / best peer"],
            peer_rows,
        )
    if phase_rows:
        print_table(
            "wall time of each part (s)",
            ["part", "daemon boot", "measure", "drain runs", "teardown", "total"],
            phase_rows,
        )
    flagged = [(shape, findings) for shape, findings in log_notes if findings]
    if flagged:
        print("\ndaemon log lines with errors or warnings:")
        for shape, findings in flagged:
            for line in findings:
                print(f"  [{shape}] {line}")
    if failures:
        sys.exit(f"\nshape(s) failed: {', '.join(failures)} (tracebacks above)")


def _peer_rows(args: argparse.Namespace, results: Sequence[Result]) -> list[tuple[Any, ...]]:
    """The peer's drain time for the same count, measured now, next to the batched shape's."""
    from _procrastinate_peer import drain_seconds

    ours = next((r for r in results if r.shape == "batched"), None)
    peer = {c: drain_seconds(args.executions, c) for c in (1, 4)}
    for c, seconds in peer.items():
        print(f"[{args.peer}] concurrency {c}: {args.executions} jobs in {seconds:.1f} s", flush=True)
    best = min(peer.values())
    ratio = ours.total_s / best if ours is not None and not ours.timed_out else float("nan")
    return [(args.executions, ours.total_s if ours else "-", peer[1], peer[4], ratio)]


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
