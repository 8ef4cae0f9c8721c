"""``marketing-pipelines agents``: refused requests, errors shown whole and safe, ``agents retry``."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.db.schema import agent_run
from marketing_pipelines_tests.cli_runner import Cli, cli_for
from marketing_pipelines_tests.factories import add_campaign

REQUEST = ("agents", "request", "--agent", "campaign_brief", "--input", '{"stage": "launch"}')


@pytest.fixture
def cli(engine: sa.Engine, db_url: str) -> Cli:
    add_campaign(engine, "spring-launch")
    add_campaign(engine, "secret-project")
    with engine.begin() as conn:
        users.add_user(conn, "ben")
        users.grant(conn, "ben", "campaign:read", "spring-launch")
    return cli_for(db_url)


def test_a_refused_request_exits_with_one_line_and_is_listed(cli: Cli) -> None:
    result = cli(*REQUEST, "--campaign", "secret-project", "--as", "ben")
    assert result.exit_code == 1
    assert result.output.splitlines() == [
        "Error: user 'ben' holds no permission on campaign 'secret-project' that agent 'campaign_brief' uses "
        "(campaign:read, measurement:read); grant one with: marketing-pipelines users grant ben campaign:read "
        "--campaign secret-project (recorded as agent run 1, REFUSED)"
    ]
    listed = cli("agents", "list", "--status", "refused")
    assert listed.exit_code == 0
    [_, row] = listed.output.splitlines()
    assert row.split()[:5] == ["1", "campaign_brief", "secret-project", "ben", "REFUSED"]
    assert cli("agents", "list", "--status", "QUEUED").output.strip() == "(none)"


def test_show_prints_errors_and_output_whole_without_control_characters(cli: Cli, engine: sa.Engine) -> None:
    assert cli(*REQUEST, "--campaign", "spring-launch", "--as", "ben").output.strip() == "1"
    error = "model said: " + "x" * 200 + " \x1b[2J\x1b]0;owned\x07 see https://u:pw@api.example/v1?key=secret end"
    with engine.begin() as conn:
        conn.execute(
            sa.update(agent_run)
            .where(agent_run.c.id == 1)
            .values(status="FAILED", error=error, output={"text": "Line one\n\x1b[31mred\x1b[0m"})
        )
    shown = cli("agents", "show", "1").output
    assert "\x1b" not in shown and "\x07" not in shown
    expected = "model said: " + "x" * 200 + " \\x1b[2J\\x1b]0;owned\\x07 see https://api.example/*** end"
    assert f"        error: {expected}" in shown.splitlines()
    assert "    | Line one\n    | \\x1b[31mred\\x1b[0m" in shown
    assert "secret" not in shown and "pw" not in shown


def test_retry_requeues_once_and_refuses_what_it_cannot_retry(cli: Cli, engine: sa.Engine) -> None:
    cli(*REQUEST, "--campaign", "spring-launch", "--as", "ben")
    cli(*REQUEST, "--campaign", "secret-project", "--as", "ben")  # REFUSED as run 2
    assert cli("agents", "cancel", "1").exit_code == 0
    result = cli("agents", "retry", "1", "--max-attempts", "3")
    assert result.exit_code == 0
    assert result.output.strip() == "agent run 1 queued again (was CANCELLED): up to 3 more attempt(s)"
    again = cli("agents", "retry", "1")
    assert again.exit_code == 1
    assert again.output.strip() == "Error: agent run 1 is QUEUED; only FAILED or CANCELLED runs can be retried"
    refused = cli("agents", "retry", "2")
    assert refused.exit_code == 1 and "was REFUSED when requested and cannot be retried" in refused.output
