"""The real ``dagster-daemon`` and ``dagster-webserver`` for end-to-end benchmarks, on throwaway PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from _common import empty_postgres_database, throwaway_database

REPO_ROOT = Path(__file__).resolve().parent.parent
INSTANCE_CONFIG = REPO_ROOT / "deploy" / "dagster.yaml"
WORKSPACE = REPO_ROOT / "workspace.yaml"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4} - ")


# --- the daemon process ------------------------------------------------------------------------


def dagster_bin(name: str) -> str:
    path = Path(sys.executable).parent / name
    if not path.exists():
        sys.exit(f"{name} is not installed next to {sys.executable}")
    return str(path)


def _reset_sigint() -> None:
    # A child of a non-interactive shell inherits an ignored SIGINT, and Dagster copies that
    # handler onto SIGTERM: reset it so the process group can be stopped.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    log_path: Path

    @classmethod
    def start(cls, env: Mapping[str, str], log_path: Path, argv: Sequence[str] | None = None) -> Daemon:
        """``dagster-daemon run`` on the repository's workspace, or ``argv`` (e.g. dagster-webserver)."""
        argv = list(argv or [dagster_bin("dagster-daemon"), "run", "-w", str(WORKSPACE)])
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv,
                cwd=REPO_ROOT,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_reset_sigint,
            )
        return cls(process, log_path)

    def check_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            raise RuntimeError(f"dagster-daemon exited with code {code}; last log lines:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout: float = 15.0) -> None:
        """SIGINT to the whole process group (code server, run workers too), SIGKILL to what is left."""
        pgid = self.process.pid  # the session leader's pid is its group id
        try:
            os.killpg(pgid, signal.SIGINT)
        except ProcessLookupError:
            return
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=timeout)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.wait(timeout=5)


def daemon_env(app_url: str, home: Path, pg: Mapping[str, str], overrides: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_"))}
    env.update(pg)
    # The local webhook receiver is on 127.0.0.1, which webhooks reach only when an operator allows it.
    env.update(
        {
            "MARKETING_DATABASE_URL": app_url,
            "DAGSTER_HOME": str(home),
            "MARKETING_WEBHOOK_ALLOW_NETWORKS": "127.0.0.1/32",
            **overrides,
        }
    )
    return env


def log_findings(log_path: Path, limit: int = 12) -> list[str]:
    """Distinct error, warning and traceback lines of the daemon's log, each with how often it occurred.

    Lines after the daemon was told to stop are left out: sensor ticks still in their threads then
    fail with "Location ... does not exist in workspace" as the workspace is torn down around them.
    """
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    found: Counter[str] = Counter()
    for line in lines:
        line = ANSI.sub("", line)
        if "Received interrupt, shutting down daemon threads" in line:
            break
        if re.search(r"ERROR|WARNING|Traceback|Exception|CRITICAL", line):
            found[TIMESTAMP.sub("", line).strip()] += 1
    return [f"{n}x {line}" for line, n in found.most_common(limit)]


# --- databases ---------------------------------------------------------------------------------


@contextlib.contextmanager
def dagster_storage_database() -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL database for Dagster's own storage, as the DAGSTER_PG_* variables."""
    with empty_postgres_database("mp_bench_dagster") as url:
        yield {
            "DAGSTER_PG_HOST": url.host or "127.0.0.1",
            "DAGSTER_PG_PORT": str(url.port or 5432),
            "DAGSTER_PG_USER": url.username or "postgres",
            "DAGSTER_PG_PASSWORD": url.password or "",
            "DAGSTER_PG_DB": url.database or "",
        }


@contextlib.contextmanager
def environ(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` in this process's environment for the block (the in-process instance reads them)."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- a whole deployment ------------------------------------------------------------------------


@dataclass(frozen=True)
class Deployment:
    """A throwaway deployment: the application database, Dagster's storage on PostgreSQL and a DAGSTER_HOME
    holding deploy/dagster.yaml, as the shipped configuration runs it."""

    app_url: str
    home: Path
    pg: Mapping[str, str]

    def env(self, overrides: Mapping[str, str]) -> dict[str, str]:
        """The daemon's and webserver's environment: this deployment's, then ``overrides``."""
        return daemon_env(self.app_url, self.home, self.pg, overrides)


@contextlib.contextmanager
def deployment() -> Iterator[Deployment]:
    """A ``Deployment`` for the block; its Dagster variables are in this process's environment too, so an
    in-process ``DagsterInstance.from_config(home)`` reads the same storage."""
    with (
        throwaway_database("postgres") as app_url,
        dagster_storage_database() as pg,
        environ(pg),
        tempfile.TemporaryDirectory(prefix="mp-bench-home-") as home_dir,
    ):
        home = Path(home_dir)
        (home / "dagster.yaml").write_text(INSTANCE_CONFIG.read_text())
        yield Deployment(app_url, home, pg)
