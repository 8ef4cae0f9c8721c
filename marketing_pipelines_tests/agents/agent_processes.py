"""Process-level harness for agent runs: a fake OpenAI-compatible server, a throwaway Dagster
instance home, and ``agent_run_job`` executed in separate OS processes.

Shared by ``test_pool.py``, ``test_restart.py`` and ``benchmarks/pool_overshoot_sqlite.py``. The
only fake is at the HTTP layer; databases, Dagster instances and processes are real.
"""

import json
import multiprocessing
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar
from unittest import mock

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.queue import request_agent_run, transcript
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines_tests.built import queued_agent_runs_sensor
from marketing_pipelines_tests.factories import add_campaign, settings_from

T = TypeVar("T")
SPAWN = multiprocessing.get_context("spawn")
API_KEY = "test"
CAMPAIGN = "spring-launch"
REQUESTER = "ana"
AGENT_OP = "run_agent"


# --- the fake model server ---------------------------------------------------------------------


@dataclass
class FakeOpenAI:
    """Answers ``POST /chat/completions`` like the Chat Completions API.

    A conversation without a tool result gets a ``read_campaign`` tool call at once; one with a
    tool result gets the final answer after ``final_delay_s``, and only once ``release`` is set
    (a test holds it to keep a run mid-way).
    """

    final_delay_s: float = 1.0
    release: threading.Event = field(default_factory=threading.Event)
    requests: list[tuple[float, str]] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def finals_requested(self) -> int:
        return sum(1 for _, kind in self.requests if kind == "final")

    @contextmanager
    def running(self) -> Iterator["FakeOpenAI"]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                if self.path != "/chat/completions":
                    self._send(404, {"error": {"message": f"no route {self.path}"}})
                    return
                if self.headers.get("authorization") != f"Bearer {API_KEY}":
                    self._send(401, {"error": {"message": "bad key"}})
                    return
                final = any(m.get("role") == "tool" for m in body["messages"])
                fake.requests.append((time.time(), "final" if final else "tool_call"))
                if final:
                    if not fake.release.wait(timeout=120):
                        self._send(503, {"error": {"message": "test never released the final answer"}})
                        return
                    time.sleep(fake.final_delay_s)
                    message: dict[str, Any] = {"role": "assistant", "content": "Spring launch is on track."}
                    reason = "stop"
                else:
                    call = {
                        "id": f"call_{uuid.uuid4().hex[:8]}",
                        "type": "function",
                        "function": {"name": "read_campaign", "arguments": json.dumps({"campaign_id": CAMPAIGN})},
                    }
                    message, reason = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
                self._send(
                    200,
                    {
                        "id": f"chatcmpl-{uuid.uuid4().hex[:8]}",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "gpt-4o-mini"),
                        "choices": [{"index": 0, "message": message, "finish_reason": reason}],
                        "usage": {"prompt_tokens": 50, "completion_tokens": 10, "total_tokens": 60},
                    },
                )

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client was killed mid-request, as the restart test intends

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        thread = threading.Thread(target=self._server.serve_forever, name="fake-openai", daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.release.set()
            self._server.shutdown()
            self._server.server_close()
            thread.join(timeout=5)


def agent_env(fake: FakeOpenAI, app_url: str, dagster_home: Path, **extra: str) -> dict[str, str]:
    """The environment variables an agent-run process needs (children inherit them)."""
    return {
        "OPENAI_API_KEY": API_KEY,
        "OPENAI_BASE_URL": fake.base_url,
        "MARKETING_DATABASE_URL": app_url,
        "DAGSTER_HOME": str(dagster_home),
        "NO_PROXY": "127.0.0.1,localhost",
        **extra,
    }


# --- Dagster instance homes --------------------------------------------------------------------


def write_dagster_home(
    home: Path,
    storage_url: str | None = None,
    extra_yaml: str = "",
    granularity: str = "run",
    max_concurrent_runs: int | None = None,
) -> Path:
    """A DAGSTER_HOME with a dagster.yaml: PostgreSQL storage when ``storage_url`` is given, else SQLite.

    Pools at ``granularity`` ``run`` as the shipped dagster.yaml files; ``op`` for the measurement
    of Dagster's per-step slot claim (benchmarks/pool_overshoot_sqlite.py).
    """
    home.mkdir(parents=True, exist_ok=True)
    lines = ["telemetry:", "  enabled: false", "concurrency:", "  pools:", f"    granularity: {granularity}"]
    if max_concurrent_runs is not None:
        lines += ["  runs:", f"    max_concurrent_runs: {max_concurrent_runs}"]
    if storage_url is not None:
        lines += ["storage:", "  postgres:", f"    postgres_url: {json.dumps(storage_url)}"]
    (home / "dagster.yaml").write_text("\n".join(lines) + "\n" + extra_yaml)
    return home


@contextmanager
def throwaway_postgres_database(admin_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database (dropped afterwards), as a ``postgresql+psycopg2`` URL."""
    admin = sa.create_engine(
        admin_url.replace("postgresql://", "postgresql+psycopg2://", 1), isolation_level="AUTOCOMMIT"
    )
    name = f"mp_dagster_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        url = sa.engine.make_url(admin.url).set(database=name)
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


# --- the application data ----------------------------------------------------------------------


def seed_requester(engine: sa.Engine) -> None:
    add_campaign(engine, CAMPAIGN)
    with engine.begin() as conn:
        users.add_user(conn, REQUESTER)
        users.grant(conn, REQUESTER, "campaign:read")


def request_openai_runs(engine: sa.Engine, n: int, max_run_seconds: int = 120) -> list[int]:
    ids = []
    for _ in range(n):
        with engine.begin() as conn:
            ids.append(
                request_agent_run(
                    conn,
                    agent="measurement_analyst",
                    campaign_id=CAMPAIGN,
                    requested_by=REQUESTER,
                    provider="openai",
                    max_run_seconds=max_run_seconds,
                    settings=settings_from({"OPENAI_API_KEY": API_KEY}),
                )
            )
    return ids


def sensor_agent_requests(
    instance: dg.DagsterInstance, app_url: str, settings: AgentSettings | None = None
) -> list[dg.RunRequest]:
    """One queued_agent_runs_sensor evaluation; the agent-run RunRequests it returned."""
    context = dg.build_sensor_context(
        instance=instance,
        resources={"app_db": AppDatabase(url=app_url), "agent_settings": settings or AgentSettings()},
    )
    result = queued_agent_runs_sensor(context)
    if isinstance(result, dg.SkipReason):
        return []
    return [r for r in result.run_requests or [] if r.job_name == "agent_run_job"]


def transcript_kinds(engine: sa.Engine, agent_run_id: int) -> list[tuple[int, str]]:
    with engine.connect() as conn:
        return [(s["attempt"], s["kind"]) for s in transcript(conn, agent_run_id)]


# --- running agent_run_job in other processes --------------------------------------------------


def agent_run_job_def() -> dg.JobDefinition:
    """Module-level so ``dg.reconstructable`` can rebuild the job in any process."""
    from marketing_pipelines.definitions import defs

    return defs().resolve_job_def("agent_run_job")


def execute_run_request(run_config: Mapping[str, Any], tags: Mapping[str, str], env: Mapping[str, str]) -> bool:
    """Entry point of a run-worker process: executes one RunRequest on the DAGSTER_HOME instance.

    The job's in-process executor runs the op in this process, as a launched run does, so killing
    the process kills the agent.
    """
    os.environ.update(env)
    with dg.DagsterInstance.get() as instance:
        result = dg.execute_job(
            dg.reconstructable(agent_run_job_def), instance=instance, run_config=dict(run_config), tags=tags
        )
        return result.success


def start_run_worker(request: dg.RunRequest, env: Mapping[str, str], resources: Mapping[str, Any] | None = None) -> Any:
    """A run-worker process for ``request``, started with ``env`` in its environment as a launched run
    worker is (the project's settings are read when the child imports it); ``resources`` is run config
    for its resources, as the launchpad gives it."""
    run_config = {**request.run_config, **({"resources": dict(resources)} if resources else {})}
    process = SPAWN.Process(
        target=execute_run_request,
        args=(run_config, dict(request.tags), dict(env)),
        name=f"run-worker-{request.run_key}",
    )
    with mock.patch.dict(os.environ, env):  # the spawned child copies this process's environment
        process.start()
    return process


def join_all(processes: Sequence[Any], timeout_s: float) -> None:
    """Wait for every process; kill the stragglers and fail naming them."""
    deadline = time.monotonic() + timeout_s
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    stuck = [p.name for p in processes if p.is_alive()]
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(5)
    assert not stuck, f"run workers still running after {timeout_s:.0f}s: {stuck}"


def in_new_process(fn: Callable[..., T], *args: Any) -> T:
    """Call ``fn(*args)`` in a fresh spawned interpreter and return its result."""
    with ProcessPoolExecutor(max_workers=1, mp_context=SPAWN) as pool:
        return pool.submit(fn, *args).result(timeout=120)


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)


# --- reading what happened from the event log ---------------------------------------------------


def dagster_run_id(instance: dg.DagsterInstance, request: dg.RunRequest) -> str:
    """The Dagster run that executed ``request`` (found by its agent run id and attempt tags)."""
    tags = {k: request.tags[k] for k in ("marketing/agent_run_id", "marketing/attempt")}
    records = instance.get_run_records(dg.RunsFilter(tags=tags))
    assert len(records) == 1, f"expected one Dagster run tagged {tags}, found {len(records)}"
    return records[0].dagster_run.run_id


@dataclass(frozen=True)
class StepWindow:
    run_id: str
    start: float
    end: float
    outcome: str


def agent_step_windows(instance: dg.DagsterInstance, run_ids: Sequence[str]) -> list[StepWindow]:
    """When each run's ``run_agent`` step ran: STEP_START to STEP_SUCCESS/FAILURE, from the event log.

    The executor claims the pool slot before STEP_START and frees it after the step's last
    event, so each window lies inside the time the step held its slot.
    """
    windows = []
    types = {dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE}
    for run_id in run_ids:
        events = [e for e in instance.all_logs(run_id, of_type=types) if e.step_key == AGENT_OP]
        starts = [e.timestamp for e in events if e.dagster_event_type == dg.DagsterEventType.STEP_START]
        ends = [e for e in events if e.dagster_event_type != dg.DagsterEventType.STEP_START]
        assert len(starts) == 1 and len(ends) == 1, f"run {run_id}: expected one start and one end, got {events}"
        windows.append(StepWindow(run_id, starts[0], ends[0].timestamp, ends[0].dagster_event_type.value))
    return windows


def max_overlap(windows: Sequence[StepWindow]) -> int:
    """The most windows open at one instant (an end at the same instant as a start does not overlap)."""
    points = sorted([(w.start, 1) for w in windows] + [(w.end, -1) for w in windows], key=lambda p: (p[0], p[1]))
    current = peak = 0
    for _, delta in points:
        current += delta
        peak = max(peak, current)
    return peak


# --- the pool experiment at granularity op (benchmarks/pool_overshoot_sqlite.py) -----------------


@dataclass(frozen=True)
class PoolTrial:
    agent_run_ids: list[int]
    run_ids: list[str]
    windows: list[StepWindow]
    worker_results: list[int | None]

    @property
    def overlap(self) -> int:
        return max_overlap(self.windows)


def pool_trial(
    instance: dg.DagsterInstance,
    app_engine: sa.Engine,
    app_url: str,
    env: Mapping[str, str],
    runs: int,
    limit: int,
    timeout_s: float = 90,
) -> PoolTrial:
    """Queue ``runs`` agent runs, claim them all in one sensor tick, cap the pool at ``limit``,
    then start one run-worker process per RunRequest at once and wait for all of them.

    The sensor evaluates with a pool limit of ``runs`` so it hands out every run; lowering the pool
    afterwards leaves Dagster's pool as the only bound.
    """
    agent_run_ids = request_openai_runs(app_engine, runs)
    requests = sensor_agent_requests(instance, app_url, AgentSettings(max_concurrent_agent_runs=runs))
    assert len(requests) == runs, f"the sensor claimed {len(requests)} of {runs} agent runs"
    instance.event_log_storage.set_concurrency_slots("agent_runs", limit)
    workers = [start_run_worker(r, env) for r in requests]
    try:
        join_all(workers, timeout_s)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
    run_ids = []
    for request in requests:
        run_ids.append(dagster_run_id(instance, request))
    return PoolTrial(agent_run_ids, run_ids, agent_step_windows(instance, run_ids), [w.exitcode for w in workers])
