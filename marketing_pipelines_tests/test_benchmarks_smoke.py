"""Every benchmark runs at tiny sizes, so the scripts cannot rot. Their numbers decide nothing here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

TINY = {
    "claim_throughput.py": ["--rows", "300", "--workers", "1", "2", "--batches", "10", "--seconds", "0.5"],
    "token_bucket.py": ["--processes", "1", "2", "--seconds", "0.5"],
    "sensor_to_runs.py": ["--executions", "40", "--batch", "20", "--per-run", "5", "--repeat", "1"],
    "rollup_build.py": ["--events", "2000", "--repeat", "1", "--database", "sqlite", "postgres"],
    "report_latency.py": ["--events", "2000", "--days", "7", "--repeat", "1", "--raw-repeat", "1"],
    "range_uniques.py": ["--actors", "200", "2000", "--campaigns", "2", "--days", "7", "30"],
    "e2e_executions.py": ["--executions", "20", "--shapes", "batched", "--timeout", "120"],
    "events_load.py": ["--events", "2000", "--rounds", "1"],
    "status_latency.py": ["--rows", "2000", "--agent-runs", "100", "--repeat", "3", "--command-repeat", "1"],
    "cli_latency.py": ["--runs", "1"],
    "demo.py": ["--rounds", "1", "--days", "1"],
    "signed_webhooks.py": ["--executions", "5", "--rounds", "1", "--database", "sqlite"],
    # A daemon, a webserver and the backfill daemon's 30 s iterations: about two minutes even this small.
    "backfill.py": ["--events", "2000", "--days", "3", "--per-day-sample", "0", "--timeout", "240"],
    "pool_overshoot_sqlite.py": ["--trials", "1", "--runs", "2", "--limit", "1", "--model-delay", "0.2"],
    "agent_drain.py": ["--runs", "4", "--limits", "2", "--timeout", "240"],
    "per_execution.py": ["--executions", "20", "--repeat", "1"],
    "pool_claim_race.py": ["--rounds", "3", "--processes", "3"],
    "alert_tick.py": ["--runs", "2", "--repeat", "1"],
    "table_growth.py": ["--executions", "1000", "--agent-runs", "2", "--tick-copies", "20"],
    "model_limits.py": ["--workers", "2", "--seconds", "20", "--input-limit", "5000", "--lowered", "2500"],
    "prompt_caching.py": ["--runs", "1", "--database", "sqlite"],
    "rollup_automation.py": ["--days", "2", "--revised", "1", "--timeout", "240"],
    "source_quota.py": [
        *("--source", "site_analytics", "--source", "ga4"),
        *("--days", "4", "--days-per-run", "2", "--quota", "2", "--period", "10", "--skip-unplanned"),
    ],
}


# Run at test size by a test of their own (run_container.py needs the image that test builds).
ELSEWHERE = {"soak.py": "test_soak.py", "run_container.py": "test_docker_stack.py"}


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.name for p in BENCHMARKS.glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(TINY) | set(ELSEWHERE)
    here = Path(__file__).parent
    assert all((here / test).is_file() and script in (here / test).read_text() for script, test in ELSEWHERE.items())


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(TINY))
def test_benchmark_runs_at_tiny_size(script: str, pg_database: str) -> None:
    # pg_database only proves PostgreSQL is reachable (or skips/fails like every PostgreSQL test);
    # the script makes and drops its own throwaway database.
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *TINY[script]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip(), "a benchmark prints its table"
    help_text = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"], capture_output=True, text=True, timeout=120
    )
    assert help_text.returncode == 0 and "usage" in help_text.stdout
