"""How often Dagster's per-step pool claim (``granularity: op``) lets more agent ops run at once than
the limit, on SQLite instance storage.

The shipped dagster.yaml files use ``granularity: run`` instead, because of what this measures:
Dagster's step slot claim selects a free slot row and then updates it without checking it is still
free, in autocommit, so two run workers can both take the last slot (``FOR UPDATE SKIP LOCKED``
compiles to nothing on SQLite, and on PostgreSQL the lock ends with the SELECT; CI once saw 3 ops
against a limit of 2 there). ``marketing_pipelines_tests/agents/test_pool.py`` proves the shipped
bound through the real run queue. Each trial here uses a fresh SQLite DAGSTER_HOME at
``granularity: op`` and a SQLite application database: ``--runs`` agent runs are
claimed in one sensor tick, the pool is set to ``--limit``, one run-worker process per run starts
at once, and the STEP_START..STEP_SUCCESS windows of ``run_agent`` in the event log give the most
agent ops that ran at once. Model calls go to a local fake OpenAI-compatible server.

    python benchmarks/pool_overshoot_sqlite.py --trials 5 --runs 5 --limit 2

Not part of the test run: the outcome is a race and varies with machine load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import dagster as dg
from _common import print_table, throwaway_database

# The process harness lives with the tests it serves; run from a checkout, the repository root
# is importable (spawned workers inherit this sys.path).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines_tests.agents.agent_processes import (
    FakeOpenAI,
    agent_env,
    pool_trial,
    seed_requester,
    write_dagster_home,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=5, help="independent trials (default 5)")
    parser.add_argument("--runs", type=int, default=5, help="agent runs launched at once per trial (default 5)")
    parser.add_argument("--limit", type=int, default=2, help="agent_runs pool limit (default 2)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds one trial's workers may take (default 180)")
    parser.add_argument("--model-delay", type=float, default=1.0, help="seconds the fake model takes to answer")
    args = parser.parse_args()
    if args.runs <= args.limit:
        parser.error("--runs must exceed --limit, or the pool is never contended")

    rows = []
    with FakeOpenAI(final_delay_s=args.model_delay).running() as fake:
        fake.release.set()
        for trial_no in range(1, args.trials + 1):
            started = time.monotonic()
            with throwaway_database("sqlite") as app_url, tempfile.TemporaryDirectory(prefix="mp-pool-") as tmp:
                home = write_dagster_home(Path(tmp) / "dagster_home", granularity="op")
                env = agent_env(fake, app_url, home, MARKETING_MAX_CONCURRENT_AGENT_RUNS=str(args.runs))
                os.environ.update(env)
                engine = get_engine(app_url)
                seed_requester(engine)
                with dg.DagsterInstance.get() as instance:
                    trial = pool_trial(
                        instance,
                        engine,
                        app_url,
                        env,
                        args.runs,
                        args.limit,
                        timeout_s=args.timeout,
                    )
                    info = instance.event_log_storage.get_concurrency_info("agent_runs")
                ok = sum(w.outcome == "STEP_SUCCESS" for w in trial.windows)
                rows.append((trial_no, trial.overlap, trial.overlap > args.limit, ok, len(info.claimed_slots)))
                print(
                    f"trial {trial_no}: max overlap {trial.overlap} (limit {args.limit}), "
                    f"{ok}/{args.runs} succeeded, {time.monotonic() - started:.0f}s",
                    flush=True,
                )
    print_table(
        f"agent_runs pool on SQLite storage: {args.runs} runs at once, limit {args.limit}",
        ["trial", "max overlap", "overshot", "succeeded", "slots left claimed"],
        rows,
    )
    overshot = sum(1 for r in rows if r[2])
    print(
        f"\novershot the limit in {overshot} of {len(rows)} trials; "
        f"max overlap seen {max(r[1] for r in rows)} (limit {args.limit})"
    )


if __name__ == "__main__":
    main()
