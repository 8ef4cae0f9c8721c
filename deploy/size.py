"""Print deploy/dagster.yaml sized for the machines that run it.

    python deploy/size.py --cores 8 > /etc/dagster/dagster.yaml
    python deploy/size.py --table               # the numbers for 2, 8 and 32 cores

Four settings follow the cores, the rest of the file is printed as it is:

- ``concurrency.runs.max_concurrent_runs`` = 4 x cores, cores being those of the machines where run
  workers start (with Dagster's default run launcher, the code-server replicas'). A run worker is a
  Python process that spends about 1.8 CPU-seconds importing Dagster and the project before its
  first step (``/usr/bin/time python -c "import marketing_pipelines.definitions"``) and then mostly
  waits on webhooks and PostgreSQL. A full burst of 4 x cores starts costs about 7 s of every core,
  well inside the 90 s start timeout and short enough that a code server still answers its gRPC
  calls. The 25 shipped before could start at once, 45 CPU-seconds or 22 s of both cores of the
  2-core reference machine, where starts went from 3 s to 36 s (docs/OPERATIONS.md, "Faults
  survived"). PostgreSQL must hold them: every run worker holds up to ``CONNECTIONS_PER_RUN``
  connections and a fifth of ``max_connections`` stays for the daemon, webservers, code servers and
  operators. ``--pg-max-connections`` caps the runs to what a server holds; otherwise raise
  ``max_connections`` (or put PgBouncer in front) to what ``--table`` says.
- ``run_coordinator.config.dequeue_num_workers`` = cores (at least 2): a launch is a gRPC call that
  returns once the code server has spawned the worker, so more threads than cores only queue there.
- ``sensors.num_workers`` = 2 x cores, at most one per sensor (the daemon's threads wait on the
  code server, which evaluates the sensors).
- ``concurrency.runs.tag_concurrency_limits`` of ``dagster/backfill`` = cores, at most half the runs: a
  backfill's runs are the CPU-bound ones (a day's rollup), one per core keeps them from slowing each other,
  and the rest of the runs stay for executions and agent runs due meanwhile, which the run queue dequeues
  past the backfill runs the limit holds.

The shipped deploy/dagster.yaml is this script's output for 2 cores (the reference machine);
``marketing_pipelines_tests/test_deploy_files.py`` keeps them equal.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

INSTANCE = Path(__file__).resolve().parent / "dagster.yaml"
SENSORS = 10  # sensors the sensor daemon evaluates (not the automation sensor); test_deploy_files.py checks it
# A run worker's application pool holds up to 5 + 5 overflow connections (db/engine.py), which an
# execution run's webhook threads fill when they record outcomes, and Dagster's own storage one more
# while it writes (NullPool). The soak saw at most 11 held by one run worker.
CONNECTIONS_PER_RUN = 11
REFERENCE_CORES = 2


@dataclass(frozen=True)
class Sizing:
    cores: int
    max_concurrent_runs: int
    dequeue_num_workers: int
    sensor_workers: int
    backfill_runs: int


def sizing(cores: int, pg_max_connections: int | None = None) -> Sizing:
    """The numbers for ``cores``; with ``pg_max_connections``, run concurrency capped to what it holds."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    if pg_max_connections is not None and pg_max_connections < 20:
        raise ValueError(f"PostgreSQL max_connections must be at least 20, got {pg_max_connections}")
    by_connections = (
        4 * cores
        if pg_max_connections is None
        else (pg_max_connections - pg_max_connections // 5) // CONNECTIONS_PER_RUN
    )
    max_concurrent_runs = max(1, min(4 * cores, by_connections))
    return Sizing(
        cores=cores,
        max_concurrent_runs=max_concurrent_runs,
        dequeue_num_workers=max(2, cores),
        sensor_workers=min(2 * cores, SENSORS),
        backfill_runs=max(1, min(cores, max_concurrent_runs // 2)),
    )


def connections_needed(max_concurrent_runs: int) -> int:
    """The smallest ``max_connections`` under which ``sizing`` keeps that many runs."""
    needed = CONNECTIONS_PER_RUN * max_concurrent_runs
    return next(n for n in range(needed, 2 * needed + 20) if n - n // 5 >= needed and n >= 20)


# (pattern matching the setting's line in deploy/dagster.yaml, the Sizing field it takes)
SETTINGS = (
    (r"^(    max_concurrent_runs: )\d+$", "max_concurrent_runs"),
    (r"^(    dequeue_num_workers: )\d+$", "dequeue_num_workers"),
    (r"^(  num_workers: )\d+$", "sensor_workers"),
    (r"^(        limit: )\d+$", "backfill_runs"),
)


def render(size: Sizing, template: str | None = None) -> str:
    """deploy/dagster.yaml with the numbers of ``size``; every other line, comments too, as it is."""
    text = INSTANCE.read_text() if template is None else template
    for pattern, name in SETTINGS:
        text, found = re.subn(pattern, rf"\g<1>{getattr(size, name)}", text, flags=re.MULTILINE)
        if found != 1:
            raise ValueError(f"deploy/dagster.yaml: expected one line matching {pattern!r}, found {found}")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--cores", type=int, default=os.cpu_count() or 1, help="cores where run workers start (default: this machine's)"
    )
    parser.add_argument(
        "--pg-max-connections",
        type=int,
        default=None,
        help="PostgreSQL's max_connections: cap run concurrency to what it holds (default: no cap; "
        "the table says what each size needs)",
    )
    parser.add_argument("--table", action="store_true", help="print the numbers for 2, 8 and 32 cores instead")
    args = parser.parse_args(argv)
    try:
        if args.table:
            header = (
                "cores",
                "max_concurrent_runs",
                "dequeue_num_workers",
                "sensors.num_workers",
                "backfill runs",
                "max_connections at least",
            )
            print("| " + " | ".join(header) + " |")
            print("|---|---|---|---|---|---|")
            for cores in (2, 8, 32):
                s = sizing(cores)  # the numbers, and the PostgreSQL they need
                needs = connections_needed(s.max_concurrent_runs)
                print(
                    f"| {cores} | {s.max_concurrent_runs} | {s.dequeue_num_workers} | {s.sensor_workers} "
                    f"| {s.backfill_runs} | {needs} |"
                )
            return 0
        size = sizing(args.cores, args.pg_max_connections)
        sys.stdout.write(render(size))
        print(
            f"size.py: {size.max_concurrent_runs} runs need PostgreSQL max_connections >= "
            f"{connections_needed(size.max_concurrent_runs)}",
            file=sys.stderr,
        )
    except ValueError as exc:
        parser.exit(2, f"size.py: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
