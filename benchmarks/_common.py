"""Shared helpers of the benchmark scripts: throwaway databases and result tables.

Benchmarks print ratios measured side by side in one run: this machine is shared and noisy,
so absolute numbers drift between runs while a ratio taken within one run holds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import upgrade

DEFAULT_PG = os.environ.get("MARKETING_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def throwaway_database(kind: str) -> Iterator[str]:
    """A migrated application database that is dropped afterwards: 'postgres' or 'sqlite'."""
    if kind == "sqlite":
        folder = Path(tempfile.mkdtemp(prefix="mp-bench-"))
        url = f"sqlite:///{folder / 'bench.db'}"
        upgrade(get_engine(url))
        try:
            yield url
        finally:
            get_engine(url).dispose()
            shutil.rmtree(folder, ignore_errors=True)
        return
    admin = sa.create_engine(
        DEFAULT_PG.replace("postgresql://", "postgresql+psycopg2://", 1),
        isolation_level="AUTOCOMMIT",
        pool_pre_ping=True,
    )
    name = f"mp_bench_{uuid.uuid4().hex[:10]}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(DEFAULT_PG).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(get_engine(url))
        yield url
    finally:
        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    print(f"\n{title}")
    print("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.2f}" if value < 100 else f"{value:,.0f}"
    return str(value)
