"""deploy/README.md's runbook, followed on a real PostgreSQL server with real processes.

``deploy/provision.sh`` creates a migration role and an application role per database (run by an
administrator that is not a superuser, as on a managed service), ``deploy/migrate.sh`` creates both
schemas as the migration roles, and then everything that runs day to day runs as the application
roles: the ``marketing-pipelines`` CLI, a code server (``dagster api grpc``), the daemon and the
webserver, with Dagster's storage configured by a copy of ``deploy/dagster.yaml``. Those roles can
read and write every table and create or drop none. ``deploy/backup.sh`` and ``pg_restore`` bring
both databases back into fresh ones. The health checks (code server, daemon, webserver) and the drain of
a code server on SIGTERM behave as the runbook tells an operator.

Every role and database gets a random suffix and is dropped at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg2.errors
import pytest
import sqlalchemy as sa

from marketing_pipelines_tests.processes import (
    REPO_ROOT,
    Child,
    child_env,
    dagster_bin,
    free_port,
    running,
    start,
    stop,
    wait_for,
)
from marketing_pipelines_tests.webserver import Received, webhook_server

# Real PostgreSQL roles and real Dagster processes: end to end, left out of the quick loop.
pytestmark = pytest.mark.slow

DEPLOY = REPO_ROOT / "deploy"
LOCATION = "marketing_pipelines"  # deploy/workspace.yaml's one location
# The exact line Dagster prints (inside a traceback) when deploy/dagster.yaml's password variable is unset.
UNSET_PASSWORD_LINE = (
    'dagster._config.errors.PostProcessingError: You have attempted to fetch the environment variable "DAGSTER_PG_'
    'PASSWORD" which is not set. In order for this execution to succeed it must be set in this environment.'
)
LAUNCH = '{"stage": "launch"}'
# The runbook's restore command; -U and -d follow. One transaction: a failed restore leaves the database empty.
RESTORE = ["pg_restore", "--exit-on-error", "--single-transaction"]
POOL_LIMIT = 3  # not the default (2): the limit in Dagster's database comes from this run's code server
WEBHOOK_SECONDS = 6  # how long the slow receiver holds the request the drain must wait for (< the 10 s timeout)


@dataclass(frozen=True)
class Database:
    """One of the two databases with its pair of roles (names end in the run's suffix)."""

    name: str
    migrator: str
    migrator_password: str
    app_user: str
    app_password: str


@dataclass
class Deployment:
    """The provisioned and migrated deployment, and how to reach it as each role."""

    admin_url: sa.URL
    admin_role: str
    admin_password: str
    marketing: Database
    dagster: Database
    databases: list[str] = field(default_factory=list)  # everything to drop at the end

    def script_env(self, as_superuser: bool = False, **names: str) -> dict[str, str]:
        """The environment provision.sh, migrate.sh and backup.sh read; ``names`` override database names."""
        admin_user = (self.admin_url.username or "postgres") if as_superuser else self.admin_role
        admin_password = (self.admin_url.password or "") if as_superuser else self.admin_password
        env = child_env(
            PGHOST=self.admin_url.host or "127.0.0.1",
            PGPORT=str(self.admin_url.port or 5432),
            PGADMIN_USER=admin_user,
            PGADMIN_DB=self.admin_url.database or "postgres",
            PGPASSWORD=admin_password,
            MARKETING_DB=self.marketing.name,
            MARKETING_MIGRATOR=self.marketing.migrator,
            MARKETING_MIGRATOR_PASSWORD=self.marketing.migrator_password,
            MARKETING_APP_USER=self.marketing.app_user,
            MARKETING_APP_PASSWORD=self.marketing.app_password,
            DAGSTER_DB=self.dagster.name,
            DAGSTER_MIGRATOR=self.dagster.migrator,
            DAGSTER_MIGRATOR_PASSWORD=self.dagster.migrator_password,
            DAGSTER_APP_USER=self.dagster.app_user,
            DAGSTER_APP_PASSWORD=self.dagster.app_password,
        )
        return {**env, **names}

    def url(self, user: str, password: str, database: str) -> str:
        return (
            f"postgresql://{quote(user, safe='')}:{quote(password, safe='')}@"
            f"{self.admin_url.host or '127.0.0.1'}:{self.admin_url.port or 5432}/{quote(database, safe='')}"
        )

    def app_url(self, database: str | None = None) -> str:
        """MARKETING_DATABASE_URL of the application role."""
        m = self.marketing
        return self.url(m.app_user, m.app_password, database or m.name)

    def dagster_app_url(self) -> str:
        d = self.dagster
        return self.url(d.app_user, d.app_password, d.name)

    def dagster_env(self, home: Path, database: str | None = None) -> dict[str, str]:
        """The DAGSTER_* variables of every runtime process: deploy/dagster.yaml as the Dagster app role."""
        return {
            "DAGSTER_HOME": str(home),
            "DAGSTER_PG_HOST": self.admin_url.host or "127.0.0.1",
            "DAGSTER_PG_PORT": str(self.admin_url.port or 5432),
            "DAGSTER_PG_DB": database or self.dagster.name,
            "DAGSTER_PG_USER": self.dagster.app_user,
            "DAGSTER_PG_PASSWORD": self.dagster.app_password,
        }

    def admin(self, database: str) -> sa.Engine:
        """The server's superuser on ``database``: to look, never to act as the deployment does."""
        url = self.admin_url.set(drivername="postgresql+psycopg2", database=database)
        return sa.create_engine(url, poolclass=sa.pool.NullPool)


def run(argv: list[str], env: Mapping[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=dict(env), cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


def ok(argv: list[str], env: Mapping[str, str], timeout: float = 120) -> str:
    """Runs ``argv``; its stdout, or a failure showing what it printed."""
    done = run(argv, env, timeout)
    assert done.returncode == 0, f"{argv[0]} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def script(name: str) -> list[str]:
    return ["bash", str(DEPLOY / name)]


def dagster_home(path: Path) -> Path:
    """A DAGSTER_HOME holding deploy/dagster.yaml as it is: no change is needed for the application role."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(DEPLOY / "dagster.yaml", path / "dagster.yaml")
    return path


def _require_tools(admin_url: sa.URL) -> sa.Engine:
    """The administrator's engine, once PostgreSQL's clients are known to be on PATH.

    The server itself is proven reachable (or the test skipped, or failed under CI) by conftest's
    ``pg_database``, whose URL is the administrator's with a throwaway database.
    """
    missing = [tool for tool in ("psql", "pg_dump", "pg_restore") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not on PATH: the deploy scripts and the restore need PostgreSQL's clients")
    return sa.create_engine(
        admin_url.set(drivername="postgresql+psycopg2"), isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool
    )


def _database(suffix: str, kind: str) -> Database:
    # A quote and a space in one password: the scripts must pass it through untouched.
    return Database(
        name=f"rb_{suffix}_{kind}",
        migrator=f"rb_{suffix}_{kind}_migrator",
        migrator_password=f"mig'r {uuid.uuid4().hex[:12]}",
        app_user=f"rb_{suffix}_{kind}_app",
        app_password=uuid.uuid4().hex,
    )


def _drop_everything(server: sa.Engine, deployment: Deployment) -> None:
    with server.connect() as conn:
        for name in deployment.databases:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        for db in (deployment.marketing, deployment.dagster):
            for role in (db.app_user, db.migrator):
                conn.execute(sa.text(f'DROP ROLE IF EXISTS "{role}"'))
        conn.execute(sa.text(f'DROP ROLE IF EXISTS "{deployment.admin_role}"'))


@pytest.fixture(scope="module")
def deployment(pg_database: str) -> Iterator[Deployment]:
    """provision.sh by an administrator with CREATEROLE and CREATEDB (no superuser), then migrate.sh."""
    admin_url = sa.engine.make_url(pg_database)
    server = _require_tools(admin_url)
    suffix = uuid.uuid4().hex[:8]
    found = Deployment(
        admin_url=admin_url,
        admin_role=f"rb_{suffix}_admin",
        admin_password=uuid.uuid4().hex,
        marketing=_database(suffix, "marketing"),
        dagster=_database(suffix, "dagster"),
    )
    found.databases += [found.marketing.name, found.dagster.name]
    try:
        with server.connect() as conn:
            conn.execute(
                sa.text(f'CREATE ROLE "{found.admin_role}" LOGIN CREATEROLE CREATEDB PASSWORD :password'),
                {"password": found.admin_password},
            )
        ok(script("provision.sh"), found.script_env())
        ok(script("migrate.sh"), found.script_env())
        yield found
    finally:
        _drop_everything(server, found)
        server.dispose()


def test_provision_refuses_an_empty_password() -> None:
    env = child_env(MARKETING_MIGRATOR_PASSWORD="a", MARKETING_APP_PASSWORD="b", DAGSTER_MIGRATOR_PASSWORD="c")
    for given in ({"DAGSTER_APP_PASSWORD": ""}, {}):  # empty, then unset
        done = run(script("provision.sh"), {**env, **given})
        assert done.returncode == 2
        assert done.stderr.splitlines() == [
            "provision.sh: DAGSTER_APP_PASSWORD is empty or unset: every role needs a password "
            "(see the top of this script)"
        ]


@dataclass(frozen=True)
class Privileges:
    """Who owns the tables of a database and what its application role may do to each table."""

    owners: frozenset[str]
    app: dict[str, frozenset[str]]  # table: privileges


def _privileges(deployment: Deployment, db: Database) -> Privileges:
    engine = deployment.admin(db.name)
    with engine.connect() as conn:
        tables = conn.execute(sa.text("SELECT tablename, tableowner FROM pg_tables WHERE schemaname = 'public'")).all()
        grants = conn.execute(
            sa.text(
                "SELECT table_name, privilege_type FROM information_schema.role_table_grants "
                "WHERE table_schema = 'public' AND grantee = :app"
            ),
            {"app": db.app_user},
        ).all()
    engine.dispose()
    app = {table: frozenset(p for t, p in grants if t == table) for table, _ in tables}
    return Privileges(frozenset(owner for _, owner in tables), app)


def test_provision_and_migrate_are_idempotent(deployment: Deployment) -> None:
    databases = (deployment.marketing, deployment.dagster)
    before = {db.name: _privileges(deployment, db) for db in databases}
    # Tables the default privileges did not cover (e.g. created before provision.sh ran): migrate.sh grants them.
    for db, table in ((deployment.marketing, "campaign"), (deployment.dagster, "runs")):
        with deployment.admin(db.name).begin() as conn:
            conn.execute(sa.text(f'REVOKE ALL ON "{table}" FROM "{db.app_user}"'))
    # Again, by the server's superuser this time: the other way an operator may run it.
    ok(script("provision.sh"), deployment.script_env(as_superuser=True))
    migrated = ok(script("migrate.sh"), deployment.script_env())

    assert {db.name: _privileges(deployment, db) for db in databases} == before
    for db in databases:
        # Every table belongs to the migration role; the app role may read and write each one, no more.
        assert before[db.name].owners == {db.migrator}
        assert len(before[db.name].app) > 10
        assert set(before[db.name].app.values()) == {frozenset({"SELECT", "INSERT", "UPDATE", "DELETE"})}
    # `db upgrade` reports "(was <revision>)" only when it changed something.
    [app_line] = [line for line in migrated.splitlines() if ": schema at " in line]
    assert "(was" not in app_line
    assert "Skipping already applied data migration" in migrated


def _error_of(url: str, statement: str) -> Exception | None:
    engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg2://", 1), poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(statement))
    except sa.exc.DBAPIError as exc:
        return exc.orig
    finally:
        engine.dispose()
    return None


def test_application_roles_cannot_create_or_drop_tables(deployment: Deployment) -> None:
    m, d = deployment.marketing, deployment.dagster
    marketing_app, dagster_app = deployment.app_url(), deployment.dagster_app_url()
    denied, refused = psycopg2.errors.InsufficientPrivilege, psycopg2.OperationalError
    cases = [
        # (role's URL, statement, the error class and the PostgreSQL message it must meet)
        (marketing_app, "CREATE TABLE intruder (id int)", denied, "permission denied for schema public"),
        (marketing_app, "DROP TABLE marketing_execution", denied, "must be owner of table marketing_execution"),
        (marketing_app, "ALTER TABLE campaign ADD COLUMN x int", denied, "must be owner of table campaign"),
        (dagster_app, "CREATE TABLE intruder (id int)", denied, "permission denied for schema public"),
        (dagster_app, "DROP TABLE runs", denied, "must be owner of table runs"),
        (dagster_app, "TRUNCATE event_logs", denied, "permission denied for table event_logs"),
        # Each application role reaches its own database only: "permission denied for database" on connecting.
        (deployment.url(m.app_user, m.app_password, d.name), "SELECT 1", refused, f'database "{d.name}"'),
        (deployment.url(d.app_user, d.app_password, m.name), "SELECT 1", refused, f'database "{m.name}"'),
    ]
    for url, statement, kind, message in cases:
        error = _error_of(url, statement)
        assert isinstance(error, kind), (statement, error)
        assert message in str(error), (statement, str(error))
    # What they may do: write rows, and (the app) stage rows in a temporary table, as `events load` does.
    assert _error_of(deployment.app_url(), "CREATE TEMP TABLE staging (id int)") is None
    assert _error_of(deployment.app_url(), "DELETE FROM campaign WHERE id = 'none'") is None


def test_dagster_pg_password_must_be_set_and_may_be_empty(deployment: Deployment, tmp_path: Path) -> None:
    dagster_env = deployment.dagster_env(dagster_home(tmp_path / "home"))
    del dagster_env["DAGSTER_PG_PASSWORD"]
    unset = run([dagster_bin("dagster"), "instance", "info"], child_env(**dagster_env))
    assert unset.returncode == 1
    assert UNSET_PASSWORD_LINE in unset.stderr.splitlines()
    assert unset.stderr.splitlines()[-1] != UNSET_PASSWORD_LINE  # the line is inside the traceback, not last

    # Set but empty: Dagster leaves the password out of its URL, and libpq then takes PGPASSWORD or ~/.pgpass
    # (a server that trusts local connections, as a test server may, checks no password at all).
    empty = child_env(**dagster_env, DAGSTER_PG_PASSWORD="", PGPASSWORD=deployment.dagster.app_password)
    info = ok([dagster_bin("dagster"), "instance", "info"], empty)
    assert "run_storage: PostgresRunStorage" in info
    assert "current: null" not in info  # the schema migrate.sh created, read as the app role


def _cli(env: Mapping[str, str], command: str, *args: str) -> str:
    """``marketing-pipelines`` with the words of ``command``, then ``args`` (values with spaces)."""
    return ok([dagster_bin("marketing-pipelines"), *command.split(), *args], env)


def _rows(env: Mapping[str, str], what: str) -> list[dict[str, object]]:
    return json.loads(_cli(env, f"{what} list --json"))


def _workspace(path: Path, port: int) -> Path:
    path.write_text(f"load_from:\n  - grpc_server: {{host: 127.0.0.1, port: {port}, location_name: {LOCATION}}}\n")
    return path


def _health_check(port: int) -> subprocess.CompletedProcess[str]:
    return run([dagster_bin("dagster"), "api", "grpc-health-check", "-p", str(port)], child_env(), timeout=30)


def _liveness(dagster_env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return run([dagster_bin("dagster-daemon"), "liveness-check"], child_env(**dagster_env), timeout=60)


def _dagster_runs(deployment: Deployment) -> dict[str, str]:
    engine = deployment.admin(deployment.dagster.name)
    with engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT run_id, pipeline_name, status FROM runs")).all()
    engine.dispose()
    return {run_id: f"{job} {status}" for run_id, job, status in rows}


def _seed_through_the_cli(app: Mapping[str, str], tmp_path: Path) -> None:
    """What people and scripts do as the application role: every call writes the app database."""
    _cli(app, "campaigns add spring-launch --owner ana", "--name", "Spring launch")
    _cli(app, "executions schedule --campaign spring-launch --stage launch --action log --due now")
    _cli(app, "users add ana")
    _cli(app, "users grant ana campaign:read")
    _cli(app, "agents request --agent campaign_brief --campaign spring-launch --as ana", "--input", LAUNCH)
    events = tmp_path / "events.jsonl"
    events.write_text(
        '{"event_id": "e1", "campaign_id": "spring-launch", "stage": "launch", "event_type": "pageview", '
        '"occurred_at": "2026-11-26T10:00:00+00:00", "source": "site"}\n'
    )
    # COPY into a temporary table: needs the TEMPORARY privilege provision.sh grants.
    assert _cli(app, "events load", str(events)).startswith("loaded 1,")


def _all_succeeded(app: Mapping[str, str]) -> bool:
    rows = _rows(app, "executions") + _rows(app, "agents")
    return bool(rows) and all(r["status"] == "SUCCEEDED" for r in rows)


def test_runtime_processes_work_as_the_application_roles(deployment: Deployment, tmp_path: Path) -> None:
    home = dagster_home(tmp_path / "dagster_home")
    dagster_env = deployment.dagster_env(home)
    app = child_env(
        MARKETING_DATABASE_URL=deployment.app_url(),
        MARKETING_SENSOR_INTERVAL_SECONDS="2",
        MARKETING_MODEL_PROVIDER="offline",
        MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32",
        MARKETING_MAX_CONCURRENT_AGENT_RUNS=str(POOL_LIMIT),
    )
    code_port, web_port = free_port(), free_port()
    workspace = _workspace(tmp_path / "workspace.yaml", code_port)
    _seed_through_the_cli(app, tmp_path)

    # No daemon has written a heartbeat to this database yet.
    dead = _liveness(dagster_env)
    assert (dead.returncode, dead.stdout.strip()) == (1, "Daemon(s) not running")

    with running([]) as children:
        grpc = f"api grpc -m marketing_pipelines.definitions -h 127.0.0.1 -p {code_port} --location-name {LOCATION}"
        code_server = start("code-server", [dagster_bin("dagster"), *grpc.split()], {**app, **dagster_env}, tmp_path)
        children.append(code_server)
        wait_for("the code server's health check", lambda: _health_check(code_port).returncode == 0, 90, children)
        # The daemon and the webserver never import the project: Dagster's variables are all they get.
        daemon = start(
            "daemon", [dagster_bin("dagster-daemon"), "run", "-w", str(workspace)], child_env(**dagster_env), tmp_path
        )
        children.append(daemon)
        children.append(
            start(
                "webserver",
                [dagster_bin("dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", str(web_port)],
                child_env(**dagster_env),
                tmp_path,
            )
        )
        wait_for(
            "the execution and the agent run to end SUCCEEDED",
            lambda: _all_succeeded(app),
            120,
            children,
            interval=1,
            detail=lambda: f"{_rows(app, 'executions')}\n{_rows(app, 'agents')}\nruns: {_dagster_runs(deployment)}",
        )
        wait_for("the daemon's liveness check", lambda: _liveness(dagster_env).returncode == 0, 60, children)
        server_info = wait_for("the webserver's /server_info", lambda: _server_info(web_port), 90, children)
        assert "dagster_webserver_version" in server_info

        # Runs, events and the agent_runs pool's limit were written by the Dagster app role.
        runs = set(_dagster_runs(deployment).values())
        assert {"marketing_execution_job SUCCESS", "agent_run_job SUCCESS"} <= runs, runs
        assert _pool_limit(deployment) == POOL_LIMIT  # set by queued_agent_runs_sensor from the setting

        _drain_on_sigterm(deployment, app, code_server, code_port)
        _liveness_after_the_daemon_stops(daemon, dagster_env)


def _liveness_after_the_daemon_stops(daemon: Child, dagster_env: Mapping[str, str]) -> None:
    """liveness-check reads the heartbeats in Dagster's database: by default a daemon that stopped
    still counts as live for 30 s (the heartbeat interval) plus 1800 s (DAGSTER_DAEMON_HEARTBEAT_TOLERANCE)."""
    stop(daemon)
    assert _liveness(dagster_env).returncode == 0
    tolerant = {**dagster_env, "DAGSTER_DAEMON_HEARTBEAT_TOLERANCE": "1"}

    def reported_dead() -> str | None:
        done = _liveness(tolerant)
        return done.stdout.strip() if done.returncode == 1 else None

    # The last heartbeat is at most 30 s old when the daemon stops: stale after at most 31 s.
    assert wait_for("liveness-check to report the stopped daemon", reported_dead, 60) == "Daemon(s) not running"


def _server_info(port: int) -> dict[str, object] | None:
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/server_info", timeout=5)
    except httpx.TransportError:
        return None
    return response.json() if response.status_code == 200 else None


def _pool_limit(deployment: Deployment) -> int | None:
    engine = deployment.admin(deployment.dagster.name)
    with engine.connect() as conn:
        limit = conn.execute(sa.text("SELECT \"limit\" FROM concurrency_limits WHERE concurrency_key = 'agent_runs'"))
        value = limit.scalar()
    engine.dispose()
    return value


def _drain_on_sigterm(deployment: Deployment, app: Mapping[str, str], code_server: Child, port: int) -> None:
    """SIGTERM to the code server's own process: its run in progress finishes, then the server exits."""
    arrived = threading.Event()

    def hold(_: Received) -> None:
        arrived.set()
        time.sleep(WEBHOOK_SECONDS)

    with webhook_server() as hook:
        hook.on_request = hold
        payload = json.dumps({"url": hook.url, "body": {"text": "launched"}})
        schedule = "executions schedule --campaign spring-launch --stage launch --action webhook --due now"
        execution_id = _cli(app, schedule, "--payload", payload).strip()
        assert arrived.wait(60), f"the webhook never arrived\n{code_server.log_tail()}"
        os.kill(code_server.process.pid, signal.SIGTERM)  # the process only, as `systemctl stop` with KillMode=mixed

        # Draining: the server still answers its health check while the run goes on.
        assert _health_check(port).returncode == 0
        code_server.process.wait(timeout=60 + WEBHOOK_SECONDS)

    [row] = [r for r in _rows(app, "executions") if str(r["id"]) == execution_id]
    assert row["status"] == "SUCCEEDED", row
    assert _dagster_runs(deployment)[str(row["run_id"])] == "marketing_execution_job SUCCESS"
    assert "Stopping server once all current RPC calls terminate" in code_server.log_path.read_text()
    stopped = _health_check(port)
    assert stopped.returncode != 0 and "Unable to connect to gRPC server" in stopped.stdout


def _table_counts(deployment: Deployment, database: str) -> dict[str, int]:
    engine = deployment.admin(database)
    with engine.connect() as conn:
        tables = conn.execute(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars().all()
        counts = {t: conn.execute(sa.text(f'SELECT count(*) FROM "{t}"')).scalar_one() for t in tables}
    engine.dispose()
    return counts


def test_backup_then_restore_into_fresh_databases(deployment: Deployment, tmp_path: Path) -> None:
    app = child_env(MARKETING_DATABASE_URL=deployment.app_url())
    _cli(app, "campaigns add backup-check --owner ops", "--name", "Backup check")
    _cli(app, "executions schedule --campaign backup-check --stage launch --action log --due 2030-01-01T00:00Z")
    folder = tmp_path / "backup"
    printed = ok(script("backup.sh"), deployment.script_env(BACKUP_DIR=str(folder), BACKUP_USER=deployment.admin_role))
    dumps = {
        deployment.marketing.name: folder / f"{deployment.marketing.name}.dump",
        deployment.dagster.name: folder / f"{deployment.dagster.name}.dump",
    }
    assert printed.split() == [str(p) for p in dumps.values()]
    assert all(oct(p.stat().st_mode & 0o777) == "0o600" for p in dumps.values())

    # The runbook's restore: provision.sh with the new names (same roles), then pg_restore into each.
    restored = {name: f"{name}_restored" for name in dumps}
    deployment.databases += restored.values()
    env = deployment.script_env(
        MARKETING_DB=restored[deployment.marketing.name], DAGSTER_DB=restored[deployment.dagster.name]
    )
    ok(script("provision.sh"), env)
    _unmigrated_storage_stops_dagster(deployment, restored[deployment.dagster.name], tmp_path)
    for name, dump in dumps.items():
        ok([*RESTORE, "-U", env["PGADMIN_USER"], "-d", restored[name], str(dump)], env)

    for name in dumps:
        assert _table_counts(deployment, restored[name]) == _table_counts(deployment, name)
    restored_app = child_env(MARKETING_DATABASE_URL=deployment.app_url(restored[deployment.marketing.name]))
    assert _rows(restored_app, "executions") == _rows(app, "executions")  # read back as the app role
    # Ownership and grants came back too: the app role writes the restored database and creates nothing.
    url = deployment.app_url(restored[deployment.marketing.name])
    assert _error_of(url, "UPDATE marketing_execution SET max_attempts = max_attempts") is None
    assert isinstance(_error_of(url, "CREATE TABLE t (id int)"), psycopg2.errors.InsufficientPrivilege)


def _unmigrated_storage_stops_dagster(deployment: Deployment, database: str, tmp_path: Path) -> None:
    """Before the restore (or a migration) the app role's Dagster process stops at once, saying why:
    deploy/dagster.yaml leaves table creation on, which the role may not do."""
    env = child_env(**deployment.dagster_env(dagster_home(tmp_path / "empty_home"), database))
    done = run([dagster_bin("dagster"), "instance", "info"], env)
    assert done.returncode == 1
    assert "psycopg2.errors.InsufficientPrivilege: permission denied for schema public" in done.stderr
