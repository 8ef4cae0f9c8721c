"""Real Dagster processes for end-to-end tests: start in their own session, wait bounded, stop the group.

A Dagster webserver or daemon started from a non-interactive shell inherits an ignored SIGINT, and
Dagster copies that handler onto SIGTERM, so neither signal would stop it. Each child therefore
starts in a new session with SIGINT reset to the default, and is stopped by signalling its whole
process group (which includes the code servers and run workers it spawned), with SIGKILL as the
fallback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
T = TypeVar("T")


def free_port() -> int:
    """A port the OS just handed out on 127.0.0.1 (free unless someone takes it in the next instant)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dagster_bin(name: str) -> str:
    """A console script of the interpreter running the tests (e.g. ``dagster-webserver``)."""
    path = BIN / name
    if not path.exists():
        pytest.skip(f"{name} is not installed next to {sys.executable}")
    return str(path)


def child_env(**overrides: str) -> dict[str, str]:
    """The test's environment without settings that would leak into the child, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MARKETING_", "DAGSTER_"))}
    env.update(overrides)
    return env


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def assert_alive(self) -> None:
        code = self.process.poll()
        if code is not None:
            pytest.fail(f"{self.name} exited with code {code}; last log lines:\n{self.log_tail()}")


def _reset_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(name: str, argv: Sequence[str], env: Mapping[str, str], log_dir: Path, cwd: Path = REPO_ROOT) -> Child:
    log_path = log_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_reset_sigint,
        )
    return Child(name, process, log_path)


def stop(child: Child, timeout: float = 15.0) -> None:
    """SIGINT to the child's process group, then SIGKILL to whatever is left after ``timeout``."""
    pgid = child.process.pid  # the session leader's pid is its group id
    try:
        os.killpg(pgid, signal.SIGINT)
    except ProcessLookupError:
        return
    with suppress(subprocess.TimeoutExpired):
        child.process.wait(timeout=timeout)
    # Grandchildren (code servers, run workers) may outlive the leader; end the group either way.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        with suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
    if child.process.poll() is None:
        child.process.wait(timeout=5)


@contextmanager
def running(children: list[Child]) -> Iterator[list[Child]]:
    """Stops every child in ``children`` (added to before or inside the block) on the way out."""
    try:
        yield children
    finally:
        for child in reversed(children):
            stop(child)


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    children: Sequence[Child] = (),
    interval: float = 0.5,
    detail: Callable[[], str] | None = None,
) -> T:
    """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        for child in children:
            child.assert_alive()
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {c.name} ---\n{c.log_tail()}" for c in children)
            extra = f"\n{detail()}" if detail else ""
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}{extra}\n{logs}")
        time.sleep(interval)
