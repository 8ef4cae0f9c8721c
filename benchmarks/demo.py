"""Wall time of ``marketing-pipelines demo`` as a user runs it, first and second time, against its 30 s ceiling.

Each round runs the installed script in a new empty folder (embedded SQLite, no variable set), twice:
the first demo migrates, seeds, starts a code server and a dagster-daemon and waits for their runs;
the second finds nothing to run and launches none. Printed: the median of ``--rounds`` rounds of each,
its ratio to the ceiling, and ``python -c "import dagster"`` beside them (the floor any Dagster
process pays on this machine; the first demo pays it in the code server, the daemon, ``dagster job
launch`` and every run worker).

    python benchmarks/demo.py --rounds 3
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

CEILING_S = 30.0
SCRIPT = Path(sys.executable).parent / "marketing-pipelines"


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{done.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="Demos in new folders (each run twice).")
    parser.add_argument("--days", type=int, default=7, help="The demo's --days.")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_"))}
    first, second, floor = [], [], []
    for _ in range(args.rounds):
        folder = Path(tempfile.mkdtemp(prefix="mp-demo-bench-"))
        try:
            argv = [str(SCRIPT), "demo", "--days", str(args.days)]
            first.append(timed(argv, folder, env))
            second.append(timed(argv, folder, env))
            floor.append(timed([sys.executable, "-c", "import dagster"], folder, env))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    rows = [
        ("first demo (runs through the daemon)", statistics.median(first), statistics.median(first) / CEILING_S),
        ("second demo (nothing to run)", statistics.median(second), statistics.median(second) / CEILING_S),
        ("python -c 'import dagster'", statistics.median(floor), statistics.median(floor) / CEILING_S),
    ]
    print_table(
        f"marketing-pipelines demo --days {args.days}, median of {args.rounds} round(s); ceiling {CEILING_S:.0f} s",
        ["command", "seconds", "of ceiling"],
        rows,
    )


if __name__ == "__main__":
    main()
