"""`marketing-pipelines ui` stops, with every process it started, on SIGTERM or SIGINT to its own pid.

An operator's `kill PID`, systemd's stop and `docker stop` signal that one process; the webserver,
daemon, code servers and their children must go with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import suppress
from pathlib import Path

import pytest

from marketing_pipelines_tests.processes import child_env, free_port

# What "stops" means here (a correctness bound, not a benchmark): dagster dev's own shutdown of its
# webserver and daemon takes a few seconds; a process that ignores the signal never goes.
STOP_BOUND_S = 10.0


def _as_a_background_job() -> None:
    # What a non-interactive shell gives a job it starts with `&` (a script's `marketing-pipelines ui &`):
    # SIGINT and SIGQUIT ignored, which an exec keeps.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), or None once it is gone or a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] == "Z" else fields[19]


def _descendants(root: int) -> dict[int, str]:
    """Every live descendant of ``root``, each with its start time (so a reused pid is not mistaken for it)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found: dict[int, str] = {}
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        started = _start_time(pid)
        if started is not None:
            found[pid] = started
            todo += children.get(pid, [])
    return found


def _serving(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def _alive(processes: dict[int, str]) -> dict[int, str]:
    return {pid: started for pid, started in processes.items() if _start_time(pid) == started}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_ui_stops_with_every_child_on_a_signal_to_its_pid(tmp_path: Path, sig: signal.Signals) -> None:
    port = free_port()
    log_path = tmp_path / "ui.log"
    with log_path.open("wb") as log:
        ui = subprocess.Popen(
            [str(Path(sys.executable).parent / "marketing-pipelines"), "ui", "--port", str(port)],
            cwd=tmp_path,  # the embedded database and Dagster home under tmp_path/.marketing
            env=child_env(),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # Its own session only so that the clean-up below can end whatever the test fails to stop.
            start_new_session=True,
            preexec_fn=_as_a_background_job,
        )
    started: dict[int, str] = {}
    try:
        deadline = time.monotonic() + 120
        while not _serving(port):
            assert ui.poll() is None, log_path.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, log_path.read_text(errors="replace")[-3000:]
            time.sleep(0.5)
        started = {ui.pid: str(_start_time(ui.pid)), **_descendants(ui.pid)}
        # dagster dev, its code server, webserver and daemon at least.
        assert len(started) >= 4, started
        os.kill(ui.pid, sig)
        deadline = time.monotonic() + STOP_BOUND_S
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in _alive(started)}
        assert not left, f"still running {STOP_BOUND_S:.0f} s after {sig.name}: {left}"
        assert ui.wait(timeout=5) is not None
    finally:
        for pid in [ui.pid, *_descendants(ui.pid), *_alive(started)]:
            if _start_time(pid) is not None:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        ui.wait(timeout=10)
