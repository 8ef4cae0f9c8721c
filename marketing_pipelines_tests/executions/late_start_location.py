"""The project's code location, whose run workers start late while a gate file exists (test_overload_faults.py).

A run worker of the default run launcher is a process the code server spawns; it loads the definitions after
Dagster's own check that its run is still starting. While the file named by ``LATE_START_GATE`` exists, each
run worker waits in that load (the code server, which loads them too, never waits): run monitoring's start
timeout fails the run meanwhile, as it fails a run whose worker is starved on an overloaded machine. Once the
file is gone the workers go on, past Dagster's check, into a run Dagster already failed.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import dagster as dg

from marketing_pipelines.definitions import build_defs
from marketing_pipelines.settings import current_settings

LATE_START_GATE = "MARKETING_TEST_LATE_START_GATE"
MAX_WAIT_SECONDS = 600


@dg.definitions
def defs() -> dg.Definitions:
    """``marketing_pipelines.definitions.defs``, after the gate in a run worker."""
    gate = os.environ.get(LATE_START_GATE)
    # A run worker is a spawned child of the code server; the code server itself has no parent process of
    # multiprocessing's.
    if gate and multiprocessing.parent_process() is not None:
        deadline = time.monotonic() + MAX_WAIT_SECONDS
        while Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    return build_defs(current_settings())
