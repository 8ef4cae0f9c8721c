"""A second `webhooks rotate` within the overlap would drop the secret receivers may still check: refused, or said."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import webhook_endpoint
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.endpoints import add_endpoint, rotate_endpoint
from marketing_pipelines.sealing import SecretBox, new_key

KEY = new_key()
DAY = timedelta(hours=24)
PUBLIC_ONLY = EgressPolicy(parse_networks([]))


def _secrets(engine: sa.Engine) -> tuple[str, str | None]:
    """The endpoint's current and previous secret, opened."""
    box = SecretBox(KEY)
    with engine.connect() as conn:
        row = conn.execute(sa.select(webhook_endpoint).where(webhook_endpoint.c.name == "crm")).one()
    return box.open(row.secret_sealed), box.open(row.previous_secret_sealed) if row.previous_secret_sealed else None


def _add(engine: sa.Engine) -> str:
    with engine.begin() as conn:
        return add_endpoint(
            conn, SecretBox(KEY), "crm", "https://crm.example.com/hooks", EgressPolicy(parse_networks([]))
        )


def test_a_second_rotation_within_the_overlap_is_refused_and_changes_nothing(engine: sa.Engine) -> None:
    original = _add(engine)
    start = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    with engine.begin() as conn:
        first = rotate_endpoint(conn, SecretBox(KEY), "crm", DAY, start)
    with pytest.raises(InvalidInput) as refused, engine.begin() as conn:
        rotate_endpoint(conn, SecretBox(KEY), "crm", DAY, start + timedelta(hours=1))
    assert str(refused.value) == (
        "webhook endpoint 'crm': the secret before its last rotation still signs until 2026-12-08 09:00 UTC, and "
        "rotating again would stop it now, before receivers still checking it switch; rotate after then, or pass "
        "--void-previous to stop it now; nothing was changed"
    )
    assert _secrets(engine) == (first, original)  # the original still signs beside the first rotation's

    with engine.begin() as conn:  # after the overlap, a rotation needs no leave
        second = rotate_endpoint(conn, SecretBox(KEY), "crm", DAY, start + DAY + timedelta(seconds=1))
    assert _secrets(engine) == (second, first)


def test_void_previous_rotates_within_the_overlap(engine: sa.Engine) -> None:
    _add(engine)
    with engine.begin() as conn:
        first = rotate_endpoint(conn, SecretBox(KEY), "crm", DAY)
    with engine.begin() as conn:
        second = rotate_endpoint(conn, SecretBox(KEY), "crm", DAY, void_previous=True)
    assert _secrets(engine) == (second, first)


def test_the_cli_refuses_in_one_line_and_says_what_void_previous_stopped(db_url: str, engine: sa.Engine) -> None:
    original = _add(engine)
    env = {"MARKETING_DATABASE_URL": db_url, "MARKETING_SECRETS_KEY": KEY}
    runner = CliRunner()
    first = runner.invoke(main, ["webhooks", "rotate", "crm"], env=env)
    assert first.exit_code == 0, first.output
    assert "no longer signs" not in first.stderr

    again = runner.invoke(main, ["webhooks", "rotate", "crm"], env=env)
    assert again.exit_code != 0 and again.stdout == ""
    [line] = again.stderr.strip().splitlines()
    assert "still signs until" in line and "--void-previous" in line and "nothing was changed" in line
    assert _secrets(engine) == (first.stdout.strip(), original)

    forced = runner.invoke(main, ["webhooks", "rotate", "crm", "--void-previous"], env=env)
    assert forced.exit_code == 0, forced.output
    assert "endpoint crm: the secret before its last rotation no longer signs (it was to sign until " in forced.stderr
    assert _secrets(engine) == (forced.stdout.strip(), first.stdout.strip())
