"""The whole demo, twice in one folder: the second run adds no work and says what it reused."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run, marketing_execution
from marketing_pipelines.demo import run_demo


def _rows(engine: sa.Engine) -> tuple[list[tuple[int, str]], int]:
    with engine.connect() as conn:
        executions = conn.execute(
            sa.select(marketing_execution.c.id, marketing_execution.c.status).order_by(marketing_execution.c.id)
        ).all()
        runs = conn.execute(sa.select(sa.func.count()).select_from(agent_run)).scalar_one()
    return [tuple(r) for r in executions], runs


def test_a_second_demo_adds_no_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MARKETING_DATABASE_URL", raising=False)
    first_lines: list[str] = []
    run_demo(days=1, echo=first_lines.append)
    engine = get_engine(f"sqlite:///{tmp_path / '.marketing' / 'marketing.db'}")
    first = _rows(engine)
    # 5 scheduled executions, 3 agent runs, and the one follow-up an agent proposed (due tomorrow).
    assert len(first[0]) == 6 and first[1] == 3
    second_lines: list[str] = []
    run_demo(days=1, echo=second_lines.append)
    assert _rows(engine) == first
    assert any("schema current" in line for line in second_lines)
    assert any("scheduled executions []; reused [1, 2, 3, 4, 5]" in line for line in second_lines)
    assert any("queued agent runs []; reused [1, 2, 3]" in line for line in second_lines)
