"""The local Dagster instance that ``marketing-pipelines ui`` and ``demo`` share: its home, its environment, its daemon.

Both work on ``.marketing/dagster_home`` and the settings' database, and both load the code location
by module (``marketing_pipelines.definitions``, the name ``dagster dev -m`` gives it), so a run the demo's
daemon launched is a run of the UI's jobs, and a sensor tick it made is in that sensor's history.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING

from marketing_pipelines.settings import DEFAULT_DB_DIR, Settings

if TYPE_CHECKING:
    # Annotations only: `marketing-pipelines ui` reads this module and then execs dagster dev, which loads
    # Dagster itself; importing it here first would cost that command about a second for nothing.
    import dagster as dg

# `dagster dev -m MODULE` and a workspace's python_module entry without a location_name both name the
# location after its module: the demo's code server takes the same name, so its runs and ticks are the
# UI's jobs' and sensors'.
LOCATION_NAME = "marketing_pipelines.definitions"
# The demo's webhook receiver listens on an address of its own (Linux routes all of 127.0.0.0/8 to
# loopback), so allowing it as a /32 (the demo, `marketing-pipelines ui` for its daemon) lets webhooks
# reach this receiver and not the Dagster webserver or another service on 127.0.0.1.
DEMO_RECEIVER_ADDRESS = "127.0.0.2"

# The instance config of the demo's Dagster home, the one `marketing-pipelines ui` opens too: the
# repository's dagster.yaml settings (telemetry off, run monitoring, pools, the fast run queue) but for
# the daemon's worker threads. Dagster 1.13.27's daemon closes its workspace before it drains the thread
# pools of sensors, the run queue and backfills (dagster/_daemon/controller.py enters the daemons before
# the workspace, so they exit after it): a stop (Ctrl-C, `kill`) that lands while a pool holds a sensor
# tick stored that tick as FAILURE ("Location ... does not exist in workspace"), and would fail a run
# being dequeued or a backfill the same way. On the daemon's own thread the controller waits for the
# tick before the workspace goes; a tick the stop cuts is left STARTED, and the next start moves it
# to SKIPPED. Ten sensors one after another fit in the sensor loop's 5 s on a local machine.
DAGSTER_YAML = """\
# Written by marketing-pipelines for the demo and `marketing-pipelines ui`: the repository's dagster.yaml
# without the daemon's thread pools, so that stopping it stores no tick, run or backfill as failed.
# Storage: SQLite files in this folder.
run_coordinator:
  module: dagster.core.run_coordinator
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
    dequeue_use_threads: false
sensors:
  use_threads: false
backfills:
  use_threads: false
run_monitoring:
  enabled: true
  poll_interval_seconds: 5
  start_timeout_seconds: 180
  free_slots_after_run_end_seconds: 15
concurrency:
  pools:
    default_limit: 4
    granularity: run
  runs:
    max_concurrent_runs: 10
    # A backfill's runs take at most 2 of the 10: executions and agent runs due meanwhile start beside it
    # (docs/OPERATIONS.md, "Backfills").
    tag_concurrency_limits:
      - key: dagster/backfill
        limit: 2
telemetry:
  enabled: false
# Ticks purged by the daemon as the repository's dagster.yaml says why (docs/OPERATIONS.md, "Retention").
retention:
  schedule:
    purge_after_days: 90
  sensor:
    purge_after_days:
      skipped: 1
      success: 7
      failure: 30
      started: 30
"""
# SHA-256 of the DAGSTER_YAML texts earlier versions wrote (with the daemon's thread pools): such a file
# is replaced by the current one; a file someone edited is left as it is.
EARLIER_DAGSTER_YAMLS = frozenset(
    {
        "ddf7b5034e34714fc3009efe345b9b717bf6ce0075bfca064c1fc5c649db70b1",
        "3184e88eb8d151ef5fcf8a42f8a07393156bdddb912a5bcfb11251f66f106466",
        # without the backfills' tag limit
        "ab346bb98af5f5c4d3c5acd803a17a75643d8ada3e01a529525b9487055eff7c",
    }
)


def dagster_home(cwd: Path | None = None) -> Path:
    """``.marketing/dagster_home`` beside the embedded database, with its dagster.yaml (written once,
    and again over a version an earlier release wrote and nobody edited)."""
    home = (cwd or Path.cwd()) / DEFAULT_DB_DIR / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    config = home / "dagster.yaml"
    if not config.exists() or hashlib.sha256(config.read_bytes()).hexdigest() in EARLIER_DAGSTER_YAMLS:
        config.write_text(DAGSTER_YAML)
    return home


def daemon_running(instance: dg.DagsterInstance, within_s: float = 60.0) -> bool:
    """Whether a dagster-daemon (e.g. `marketing-pipelines ui`'s) is serving this instance right now."""
    beats = instance.get_daemon_heartbeats()
    sensor = beats.get("SENSOR")
    return sensor is not None and time.time() - sensor.timestamp < within_s


def local_environment(current: Settings, home: Path, ui_url: str | None = None) -> dict[str, str]:
    """The environment of the local instance's processes: its home, the settings' database, the receiver's network."""
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "MARKETING_DATABASE_URL": current.resolved_database_url,
        # A local instance's webhooks (and an agent proposing one) may reach the demo's receiver alone unless
        # networks were chosen: not the UI's GraphQL on 127.0.0.1, nor another service there.
        "MARKETING_WEBHOOK_ALLOW_NETWORKS": ",".join(current.webhook_allow_networks) or f"{DEMO_RECEIVER_ADDRESS}/32",
        # Links to runs (alerts sent from this instance) point at the UI.
        **({"MARKETING_DAGSTER_UI_URL": ui_url} if ui_url else {}),
        # MARKETING_MEASUREMENT_START_DATE passes through as it is, or is unset and its default holds: the
        # partitions are a setting, never derived from the data, so they are the same whichever of the demo,
        # `ui` and a CLI backfill started first (a start read from the first event day moved with the data).
    }


def database_problem(current: Settings) -> str | None:
    """Why the sensors would skip their ticks on the settings' database (no SQLite file, unreachable, schema
    not current), naming the command that fixes it; None when it is ready. Only reads: a missing file stays missing."""
    from marketing_pipelines.db.engine import DatabaseUnavailable, get_engine
    from marketing_pipelines.db.schema_version import SchemaNotReady, ensure_schema_current

    engine = get_engine(current.resolved_database_url)
    try:
        ensure_schema_current(engine)  # checks that a SQLite file is there before connecting to it
    except (DatabaseUnavailable, SchemaNotReady) as exc:
        return str(exc)
    finally:
        engine.dispose()
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _default_sigint() -> None:
    # A child of a non-interactive shell inherits an ignored SIGINT, and Dagster copies that handler
    # onto SIGTERM: with the default handler back, SIGINT stops the child and its group.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(argv: list[str], env: Mapping[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        # Its own process group: the run workers a code server starts are stopped with it.
        return subprocess.Popen(
            argv,
            env=dict(env),
            cwd=log.parent,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_sigint,
        )


def _stop(process: subprocess.Popen[bytes], timeout_s: float = 15.0) -> None:
    """SIGINT to the process group, SIGKILL to what is left after ``timeout_s``."""
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGINT)
    with suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout_s)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _wait_until(
    what: str, ready: Callable[[], bool], processes: list[subprocess.Popen[bytes]], log: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"{what}: a process exited with code {process.returncode}; see {log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not ready after {timeout_s:.0f} s; see {log}")
        time.sleep(0.2)


def _accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _bin(name: str) -> str:
    return str(Path(sys.executable).parent / name)


@contextmanager
def code_location(
    instance: dg.DagsterInstance, env: Mapping[str, str], start_daemon: bool, timeout_s: float = 120
) -> Iterator[Path]:
    """A code server of the definitions for the instance's home, and a dagster-daemon on it when ``start_daemon``.

    Yields the workspace file that points at the server (``dagster job launch -w`` takes it). The
    daemon's run launcher starts each run's worker from this server, as a deployment's would; on the
    way out both stop (SIGINT, then SIGKILL) with the run workers in their process groups, and the
    daemon's heartbeats are wiped so the next command does not wait for a daemon that is gone.
    """
    home = Path(env["DAGSTER_HOME"])
    log = home / "local-processes.log"
    port = _free_port()
    workspace = home / "workspace.yaml"
    workspace.write_text(
        "load_from:\n"
        f"  - grpc_server:\n      host: 127.0.0.1\n      port: {port}\n      location_name: {LOCATION_NAME}\n"
    )
    argv = [_bin("dagster"), "api", "grpc", "-m", LOCATION_NAME, "--host", "127.0.0.1", "--port", str(port)]
    started = [_start([*argv, "--location-name", LOCATION_NAME], env, log)]
    try:
        _wait_until("the code server", lambda: _accepts(port), started, log, timeout_s)
        if start_daemon:
            started.append(_start([_bin("dagster-daemon"), "run", "-w", str(workspace)], env, log))
            _wait_until("the dagster-daemon", lambda: daemon_running(instance, 10), started, log, timeout_s)
        yield workspace
    finally:
        for process in reversed(started):
            _stop(process)
        if start_daemon:
            instance.wipe_daemon_heartbeats()


# How long this waits for dagster dev's code server after dagster dev has exited: dagster dev asks it to stop
# last and does not wait for it. It exits once the runs it started have ended, a moment later when none
# runs; one that outlasts this finishes them in the background, as it did when `ui` exec'ed dagster dev.
GROUP_LINGER_S = 10.0


def _group_alive(pgid: int) -> bool:
    # Reaps first: as a container's PID 1 this process inherits the group's orphans, which stay zombies
    # (and the group alive) until their parent waits for them.
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def serve_in_own_group(argv: Sequence[str]) -> int:
    """Run ``argv`` (`marketing-pipelines ui`'s dagster dev) in a process group of its own, stop it with one
    SIGINT to it alone on SIGINT, SIGTERM or SIGHUP to this process (SIGKILL to its group on a second), and
    return its exit status once its group is gone or ``GROUP_LINGER_S`` after it exited.

    Ctrl-C signals a terminal's whole foreground group: with dagster dev in it, its code server went at the
    same moment as its daemon, and the sensor tick the daemon was evaluating on it was stored as FAILURE.
    Signalled alone, dagster dev stops its webserver and daemon, waits for them, and then its code server.
    """
    child: subprocess.Popen[bytes] | None = None
    received = 0
    interrupted = False

    def forward() -> None:
        nonlocal interrupted
        if child is None or received == 0:
            return
        if received == 1 and not interrupted:
            interrupted = True
            with suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGINT)
        elif received > 1:
            with suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)

    def on_signal(signum: int, frame: object) -> None:
        nonlocal received
        received += 1
        forward()

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signum == signal.SIGHUP and signal.getsignal(signum) is signal.SIG_IGN:
            continue  # `nohup marketing-pipelines ui`: a hangup stays ignored, here and in dagster dev
        signal.signal(signum, on_signal)
    # Started with the default handlers (this process's are Python's, which exec resets).
    child = subprocess.Popen(list(argv), start_new_session=True)
    forward()  # a signal that came while it was starting
    status = child.wait()
    deadline = time.monotonic() + GROUP_LINGER_S
    while _group_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(serve_in_own_group(sys.argv[1:]))
