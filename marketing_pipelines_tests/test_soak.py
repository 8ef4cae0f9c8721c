"""The soak at test size: one fault of each kind, about 200 executions, through the deployment of deploy/.

``benchmarks/soak.py`` starts the whole topology (PostgreSQL for both databases, two code-server
replicas behind HAProxy, the real daemon and webserver), loads it with webhook executions against a
receiver that fails and stalls some deliveries, agent runs, a measurement backfill and an events
file, and while that runs kills a run worker in an agent run and one in a batch, kills and restarts
the daemon and a code server, restarts PostgreSQL and takes the receiver away for 30 s. It then
waits, touching nothing, for everything to drain and checks that nothing was lost, stranded or done
twice unexplained (its docstring lists the checks). Leases are 30 s here instead of 300 so the work
of a killed run worker comes back within the test's time.

It restarts the machine's PostgreSQL server, so it needs root and ``pg_ctlcluster``, and HAProxy
(it skips without them); it runs under the ``slow`` marker.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marketing_pipelines_tests.machine import require_or_skip

SOAK = Path(__file__).resolve().parents[1] / "benchmarks" / "soak.py"
ARGS = [
    *("--executions", "200", "--per-run", "50", "--spread", "60"),
    *("--agent-runs", "10", "--users", "2", "--backfill-days", "10", "--events", "2000"),
    # The default backoff (15 s): an execution's third attempt comes after the receiver's 30 s away.
    *("--faults", "daemon,run,code,postgres,receiver", "--lease", "30"),
    *("--no-calm", "--timeout", "300"),
]
FAULTS = (
    r"SIGKILL the run worker of agent_run_job run \w+ while it ran",
    r"SIGKILL the daemon, started again",
    r"SIGKILL the run worker of marketing_execution_job run \w+ while it ran",
    r"SIGKILL code server \d, started again",
    r"PostgreSQL restarted",
    r"receiver away for 30 s",
)


@pytest.fixture
def can_restart_postgres(pg_database: str) -> None:
    # Skipped where the machine lacks a part, like test_replica_failover.py; under CI=true that fails instead
    # (.ci/run installs them).
    if shutil.which("haproxy") is None:
        require_or_skip("haproxy is not installed (Debian: apt-get install haproxy)")
    if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None:
        require_or_skip("the soak restarts PostgreSQL with pg_ctlcluster, which needs root")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_one_fault_of_each_kind_loses_and_strands_nothing(can_restart_postgres: None, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SOAK), *ARGS, "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=SOAK.parents[1],
    )
    out = done.stdout
    # Every fault happened: a kill that found nothing to kill would prove nothing.
    missing = [fault for fault in FAULTS if not re.search(fault, out)]
    assert not missing, f"faults not injected: {missing}\n{out[-4000:]}"
    failed_checks = [line for line in out.splitlines() if "check failed:" in line]
    assert done.returncode == 0 and not failed_checks, f"{failed_checks}\n{out[-6000:]}\n{done.stderr[-3000:]}"
    # The checks the issue names were all made (a renamed check would otherwise pass unseen).
    for check in (
        "every execution terminal",
        "every idempotency key delivered at least once",
        "distinct effects (keys answered 200) = executions that SUCCEEDED",
        "every agent run terminal",
        "no Dagster run left in progress",
        "no agent_runs pool slot held by a finished run",
        "the token bucket never over-admitting",
        "every backfilled day rolled up and equal to a recount of its events",
        "every failed run alerted once",
        "no code server restarted by load alone",
    ):
        assert re.search(rf"{re.escape(check)}.*\s+yes\s", out), f"{check!r} not reported as holding\n{out}"


OVERLOAD_ARGS = [
    *("--executions", "150", "--per-run", "25", "--spread", "60"),
    *("--agent-runs", "4", "--users", "2", "--backfill-days", "5", "--events", "1000"),
    # A receiver that fails nothing: any FAILED execution is overload turned into failure.
    *("--fail-rate", "0", "--stall-rate", "0", "--faults", "daemon,run"),
    *("--overload", "--stacks", "2", "--cpu-burners", "12", "--no-calm", "--timeout", "600"),
]


@pytest.mark.slow
@pytest.mark.overload
@pytest.mark.timeout(1200)
def test_overload_is_slowness_not_failure(can_restart_postgres: None, tmp_path: Path) -> None:
    """Two stacks on one PostgreSQL server, CPU-bound processes, a disk writer syncing and every free
    PostgreSQL connection taken 8 s of every 20, with a daemon kill and a run-worker kill: every
    execution of both stacks SUCCEEDED."""
    done = subprocess.run(
        [sys.executable, str(SOAK), *OVERLOAD_ARGS, "--log-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1140,
        cwd=SOAK.parents[1],
    )
    out = done.stdout
    assert re.search(r"overload: 12 CPU-bound processes; [1-9]\d* MB written", out), out[-4000:]
    assert re.search(r"every PostgreSQL connection taken 8 s of every 20 s \([1-9]\d* times", out), out[-4000:]
    failed_checks = [line for line in out.splitlines() if "check failed:" in line]
    assert done.returncode == 0 and not failed_checks, f"{failed_checks}\n{out[-6000:]}\n{done.stderr[-3000:]}"
    # Each stack's table has the check, holding (a renamed check would otherwise pass unseen).
    held = re.findall(r"every execution SUCCEEDED \(the receiver failed none, so nothing may fail\)\s+yes\s", out)
    assert len(held) == 2, out[-6000:]
    for stack in ("overload/1", "overload/2"):
        assert re.search(rf"round {re.escape(stack)}: \d+ executions per minute; due to SUCCEEDED median", out), out
