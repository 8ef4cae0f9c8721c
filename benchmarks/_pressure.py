"""Pressure on this machine while a benchmark runs: CPU, disk and PostgreSQL connections, together.

``soak.py --overload`` runs its load under this: what an overloaded host does to a deployment that
shares it (other stacks, image builds, a backup writing its dump), without killing anything. Each
part is a real process or connection, never a sleep injected into the project's code:

- CPU: ``cpu_burners`` processes spinning at the same priority as the stack's;
- disk: a thread writing ``disk_file_mb`` files and syncing each to disk, over and over;
- connections: every ``every_s`` seconds, another client opens PostgreSQL connections until the
  server refuses one (``too many clients``), holds them for ``hold_s`` and closes them: for those
  seconds every new connection of the stack is refused. It takes them only between
  ``connections_on`` and ``connections_off``: a benchmark's own set-up and checks need the server.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

import psycopg2

SPIN = "while True: pass"


@dataclass
class Pressure:
    """CPU, disk and connection pressure from ``__enter__`` to ``__exit__``; ``summary`` says what it did."""

    folder: Path
    pg_dsn: str = "host=127.0.0.1 port=5432 user=postgres dbname=postgres connect_timeout=5"
    cpu_burners: int = 16
    disk_file_mb: int = 256
    hold_s: float = 8.0
    every_s: float = 20.0
    written_mb: int = 0
    windows: int = 0
    most_held: int = 0
    _burners: list[subprocess.Popen[bytes]] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _connections: threading.Event = field(default_factory=threading.Event)

    def connections_on(self) -> None:
        """Start taking every free connection, ``hold_s`` of every ``every_s``."""
        self._connections.set()

    def connections_off(self) -> None:
        """Stop taking connections (the window under way ends at its ``hold_s``)."""
        self._connections.clear()

    def __enter__(self) -> Pressure:
        self.folder.mkdir(parents=True, exist_ok=True)
        self._burners = [
            subprocess.Popen([sys.executable, "-c", SPIN], stdin=subprocess.DEVNULL) for _ in range(self.cpu_burners)
        ]
        for target in (self._write_disk, self._take_connections):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._connections.set()  # wakes the connection thread so it sees the stop
        for burner in self._burners:
            burner.kill()
            burner.wait(10)
        for thread in self._threads:
            thread.join(30)

    def _write_disk(self) -> None:
        block = os.urandom(1 << 20)
        path = self.folder / "pressure.bin"
        while not self._stop.is_set():
            with path.open("wb") as out:
                for _ in range(self.disk_file_mb):
                    if self._stop.is_set():
                        break
                    out.write(block)
                out.flush()
                os.fsync(out.fileno())
            self.written_mb += self.disk_file_mb
            path.unlink(missing_ok=True)
        path.unlink(missing_ok=True)

    def _take_connections(self) -> None:
        while not self._stop.wait(self.every_s - self.hold_s):
            self._connections.wait()
            if self._stop.is_set():
                return
            held: list[psycopg2.extensions.connection] = []
            try:
                while len(held) < 10_000:
                    try:
                        held.append(psycopg2.connect(self.pg_dsn))
                    except psycopg2.OperationalError:
                        break  # the server refuses: every slot is taken
                self.windows += 1
                self.most_held = max(self.most_held, len(held))
                self._stop.wait(self.hold_s)
            finally:
                for conn in held:
                    with contextlib.suppress(psycopg2.Error):
                        conn.close()

    def summary(self) -> str:
        return (
            f"{self.cpu_burners} CPU-bound processes; {self.written_mb} MB written and synced in "
            f"{self.disk_file_mb} MB files; every PostgreSQL connection taken {self.hold_s:g} s of every "
            f"{self.every_s:g} s ({self.windows} times, up to {self.most_held} connections held)"
        )
