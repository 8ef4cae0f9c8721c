"""Agent runs in many processes against a fake Anthropic that enforces an input-token limit: 429s and throughput.

The fake (``marketing_pipelines_tests/agents/fake_anthropic_server.py``) enforces requests, input tokens and output
tokens per minute as Anthropic documents them (token buckets refilled continuously; input counted at arrival, cache
reads not counted; ``max_tokens`` of output reserved until the answer) and answers 429 ``rate_limit_error`` above
any of them. ``--workers`` run-worker processes (8: the issue's two code servers' worth of run workers; each an OS
process of its own, sharing only the databases and the fake) execute queued ``measurement_analyst`` runs one after
another through ``agent_run_job``, configured with the same limits the fake enforces
(``MARKETING_MAX_MODEL_{CALLS,INPUT_TOKENS,OUTPUT_TOKENS}_PER_MINUTE``).

Offered load: a calibration run first measures the input tokens of one model call (T); the fake then answers each
call after ``workers x T x 60 / (offer x limit)`` seconds, so that the workers, unthrottled, would send ``--offer``
times the input limit (2 by default), as slow real answers would.

Two phases of ``--seconds`` each, each with fresh databases and a fresh fake:

* ``constant``: the input limit stays at ``--input-limit`` (20,000 a minute);
* ``lowered``: at half time the fake lowers it to ``--lowered`` (10,000); only its answer headers say so.

Printed per phase (and per half of ``lowered``): model calls answered, 429 answers (the target is 0), and input
tokens the fake admitted per minute against the limit in force (the target is at least 0.8), over the whole window
and after its first minute (the buckets start full, so the first minute may take a limit more).

    python benchmarks/model_limits.py
    python benchmarks/model_limits.py --seconds 60 --workers 4 --database sqlite
"""

from __future__ import annotations

import argparse
import math
import threading
import time
from typing import Any

import sqlalchemy as sa
from _common import print_table
from _fake_anthropic_runs import queue_and_claim, stage, start_workers, stop_workers

from marketing_pipelines.db.schema import agent_run
from marketing_pipelines_tests.agents.fake_anthropic_server import FakeAnthropic, Limits

AGENT = "measurement_analyst"
CALLS_PER_RUN = 4  # the fake's script: read_campaign, read_measurement, list_executions, then the answer


def _client_limits(limits: Limits) -> dict[str, str]:
    """The deployment's limits, set to what the provider enforces (as an operator copies them from the console)."""
    return {
        "MARKETING_MAX_MODEL_CALLS_PER_MINUTE": str(limits.requests),
        "MARKETING_MAX_MODEL_INPUT_TOKENS_PER_MINUTE": str(limits.input_tokens),
        "MARKETING_MAX_MODEL_OUTPUT_TOKENS_PER_MINUTE": str(limits.output_tokens),
    }


def calibrate(database: str) -> tuple[float, int]:
    """(input tokens one model call counts on average, model calls per run): one run against an unlimited fake."""
    unlimited = Limits(requests=100_000, input_tokens=100_000_000, output_tokens=100_000_000)
    fake = FakeAnthropic(limits=unlimited)
    with stage(database) as stage_, fake.running():
        env = stage_.env(fake, **_client_limits(unlimited))
        processes, barrier, results = start_workers([queue_and_claim(stage_, env, AGENT, 1, 600)], env)
        barrier.wait()
        results.get(timeout=300)
        stop_workers(processes, 60)
    admitted = [tokens for _, tokens in fake.stats()["admitted"]]
    if not admitted:
        raise SystemExit(f"calibration: the fake answered no call ({fake.stats()['answers']})")
    return sum(admitted) / len(admitted), len(admitted)


def _admitted(stats: dict[str, Any], start: float, end: float) -> int:
    return sum(tokens for at, tokens in stats["admitted"] if start <= at < end)


def _ratio(tokens: int, seconds: float, limit: int) -> float | str:
    return tokens / (seconds / 60.0) / limit if seconds > 0 else "n/a"


def run_phase(
    name: str, args: argparse.Namespace, limits: Limits, latency_s: float, lowered: int | None
) -> tuple[list[list[Any]], int]:
    """One phase's rows and its 429 count."""
    fake = FakeAnthropic(limits=limits, latency_s=latency_s)
    per_worker = math.ceil(args.seconds / max(0.5, CALLS_PER_RUN * latency_s)) + 2
    with stage(args.database) as stage_, fake.running():
        env = stage_.env(fake, **_client_limits(limits))
        requests = queue_and_claim(stage_, env, AGENT, args.workers * per_worker, 3600)
        shares = [requests[i :: args.workers] for i in range(args.workers)]
        # Runs still going at the window's end are cut: the window is what is measured.
        processes, barrier, _ = start_workers(shares, env)
        barrier.wait()
        t0 = time.time()
        end, mid = t0 + args.seconds, t0 + args.seconds / 2
        timer = None
        if lowered is not None:
            timer = threading.Timer(args.seconds / 2, lambda: fake.set_limits(input_tokens=lowered))
            timer.start()
        print(f"[{name}] {args.workers} workers running for {args.seconds:.0f} s ...", flush=True)
        time.sleep(max(0.0, end - time.time()))
        stats = fake.stats()
        stop_workers(processes, 0)
        if timer is not None:
            timer.cancel()
        with stage_.engine.connect() as conn:
            statuses = dict(
                conn.execute(sa.select(agent_run.c.status, sa.func.count()).group_by(agent_run.c.status)).all()
            )
    in_window = [r for r in fake.records() if t0 <= r.at < end]
    answered = sum(1 for r in in_window if r.status == 200)
    refused = sum(1 for r in in_window if r.status == 429)
    segments = [("", t0, end, limits.input_tokens)]
    if lowered is not None:
        segments = [(" (before)", t0, mid, limits.input_tokens), (" (after)", mid, end, lowered)]
    rows = []
    for label, start, stop, limit in segments:
        tokens = _admitted(stats, start, stop)
        steady_from = max(start, t0 + 60)
        steady = _ratio(_admitted(stats, steady_from, stop), stop - steady_from, limit)
        seg = [r for r in in_window if start <= r.at < stop]
        rows.append(
            [
                name + label,
                limit,
                round(stop - start),
                sum(1 for r in seg if r.status == 200),
                sum(1 for r in seg if r.status == 429),
                tokens,
                _ratio(tokens, stop - start, limit),
                steady,
            ]
        )
    done = statuses.get("SUCCEEDED", 0)
    print(
        f"[{name}] {answered} calls answered, {refused} answered 429; agent runs: {done} SUCCEEDED, "
        f"{statuses.get('FAILED', 0)} FAILED, others cut at the window's end ({statuses})",
        flush=True,
    )
    return rows, refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=8, help="run-worker processes (default 8)")
    parser.add_argument("--seconds", type=float, default=180, help="length of each phase (default 180)")
    parser.add_argument("--input-limit", type=int, default=20_000, help="input tokens per minute (default 20,000)")
    parser.add_argument("--lowered", type=int, default=10_000, help="input limit after half time in phase lowered")
    # Tier 1's 50 requests a minute for Claude Sonnet; output high enough that max_tokens (1,024, reserved per call)
    # does not bind before the input tokens do.
    parser.add_argument("--requests-limit", type=int, default=50, help="requests per minute (default 50)")
    parser.add_argument("--output-limit", type=int, default=90_000, help="output tokens per minute (default 90,000)")
    parser.add_argument("--offer", type=float, default=2.0, help="offered input load / input limit (default 2)")
    parser.add_argument("--phases", nargs="+", choices=["constant", "lowered"], default=["constant", "lowered"])
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    args = parser.parse_args()
    if not 1 <= args.workers <= 32:
        parser.error("--workers must be between 1 and 32")
    if not 5 <= args.seconds <= 3600:
        parser.error("--seconds must be between 5 and 3600")
    if not 0 < args.lowered < args.input_limit:
        parser.error("--lowered must be positive and below --input-limit")
    if not 0 < args.offer <= 20:
        parser.error("--offer must be in (0, 20]")

    print("[calibration] one run against an unlimited fake ...", flush=True)
    per_call, calls = calibrate(args.database)
    latency = args.workers * per_call * 60.0 / (args.offer * args.input_limit)
    print(f"[calibration] {per_call:.0f} input tokens a call, {calls} calls a run: answers take {latency:.1f} s")
    limits = Limits(requests=args.requests_limit, input_tokens=args.input_limit, output_tokens=args.output_limit)
    rows, refused = [], 0
    for phase in args.phases:
        phase_rows, phase_refused = run_phase(
            phase, args, limits, latency, args.lowered if phase == "lowered" else None
        )
        rows += phase_rows
        refused += phase_refused
    print_table(
        f"{args.workers} run workers, offered {args.offer:g} x the input limit ({per_call:.0f} tokens a call, "
        f"answers in {latency:.1f} s), {args.database}",
        [
            "phase",
            "input limit/min",
            "seconds",
            "calls answered",
            "answered 429",
            "input admitted",
            "admitted/min / limit",
            "same after 1st minute",
        ],
        rows,
    )
    print(f"\n429 answers in all: {refused} (target 0); admitted/min / limit: target >= 0.8")


if __name__ == "__main__":
    main()
