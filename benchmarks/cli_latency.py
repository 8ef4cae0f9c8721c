"""Wall time of the read commands (and ``executions schedule``) of ``marketing-pipelines`` on SQLite.

Each command runs as a user runs it: a new process of the installed ``marketing-pipelines`` script
(next to this interpreter), against a migrated SQLite database in a temp folder holding a campaign,
a user, a few executions and an agent run (made with the CLI itself). Each latency is the median of
``--runs`` runs after one warm-up, printed with its ratio to the 0.5 s ceiling the CLI aims at, next to
``python -c pass``, the interpreter's own floor on this machine.

When the environment sets PYTHONDONTWRITEBYTECODE, this package's modules would be compiled from
source on every run, which a user's install never does; the children write their bytecode under a
temp PYTHONPYCACHEPREFIX instead (the warm-up fills it).

    python benchmarks/cli_latency.py --runs 7

With ``--baseline DIR`` (a checkout of another commit, e.g. ``git worktree add /tmp/base 68b5d47``), each
command also runs from that code (DIR first on PYTHONPATH, the same script and database), alternating
run by run, and the ratio new / baseline is printed: the load of the machine then weighs on both alike.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import print_table

CEILING_S = 0.5
SCRIPT = Path(sys.executable).parent / "marketing-pipelines"

COMMANDS: list[list[str]] = [
    ["--help"],
    ["db", "current"],
    ["executions", "list"],
    ["executions", "show", "1"],
    ["agents", "list"],
    ["agents", "show", "1"],
    ["users", "list"],
    ["limits", "show"],
    ["campaigns", "list"],
    ["report", "--campaign", "spring-launch"],
    ["status"],
    ["status", "--json"],
    ["executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "log", "--due", "now"],
]


def run(argv: list[str], env: dict[str, str], check: bool = True) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if check and done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{done.stderr}")
    return elapsed


def cli(env: dict[str, str], *args: str) -> None:
    run([str(SCRIPT), *args], env)


def seed(env: dict[str, str]) -> None:
    cli(env, "db", "upgrade")
    cli(env, "campaigns", "add", "spring-launch", "--name", "Spring launch", "--owner", "ana")
    cli(env, "users", "add", "ana")
    cli(env, "users", "grant", "ana", "campaign:read")
    for due in ("now", "2030-01-01T09:00:00+00:00", "2030-01-02T09:00:00+00:00"):
        cli(
            env,
            "executions",
            "schedule",
            "--campaign",
            "spring-launch",
            "--stage",
            "launch",
            "--action",
            "log",
            "--due",
            due,
        )
    cli(env, "agents", "request", "--agent", "campaign_brief", "--campaign", "spring-launch", "--as", "ana",
        "--input", '{"stage": "launch"}')  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", type=Path, default=None, help="a checkout of the code to compare with")
    args = parser.parse_args()
    if not SCRIPT.exists():
        raise SystemExit(f"no {SCRIPT}: install the package (pip install -e .) into this interpreter's environment")
    folder = Path(tempfile.mkdtemp(prefix="mp-cli-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_HOME"))}
    env["MARKETING_DATABASE_URL"] = f"sqlite:///{folder / 'cli.db'}"
    if env.pop("PYTHONDONTWRITEBYTECODE", None):
        env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    start_load = os.getloadavg()[0]
    try:
        seed(env)
        rows = []
        floor = [run([sys.executable, "-c", "pass"], env) for _ in range(args.runs)]
        rows.append(["python -c pass", statistics.median(floor) * 1000, statistics.median(floor) / CEILING_S])
        base_env = None if args.baseline is None else {**env, "PYTHONPATH": str(args.baseline.resolve())}
        for command in COMMANDS:
            argv = [str(SCRIPT), *command]
            times, base_times = [], []
            run(argv, env, check=False)  # warm-up (bytecode, page cache)
            if base_env is not None:
                run(argv, base_env, check=False)
            for _ in range(args.runs):
                times.append(run(argv, env))
                if base_env is not None:
                    # Not checked: an older command may fail where this one works; its start-up still counts.
                    base_times.append(run(argv, base_env, check=False))
            median = statistics.median(times)
            row = [" ".join(command[:3]), median * 1000, median / CEILING_S]
            if base_times:
                row += [statistics.median(base_times) * 1000, median / statistics.median(base_times)]
            rows.append(row)
        if base_env is not None:
            rows[0] += [rows[0][1], 1.0]
        # Other processes on the machine slow every start-up alike (it is all CPU): the load says how quiet it was.
        load = f"load average {start_load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        columns = ["command", "median ms", "x of 0.5 s"]
        print_table(
            f"marketing-pipelines (the installed script) on SQLite, median of {args.runs} runs; {load}",
            columns if base_env is None else [*columns, "baseline ms", "new / baseline"],
            rows,
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
