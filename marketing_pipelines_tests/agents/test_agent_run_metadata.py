"""What an agent run's Dagster run shows and how it ends: output and transcript metadata, failures that fail it."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.display import code_block, transcript_markdown
from marketing_pipelines.agents.queue import AGENT_RUNS, cancel_agent_run, get_agent_run, request_agent_run
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import agent_run
from marketing_pipelines.leasing.lease import LOST_ATTEMPTS_ERROR, MAX_LOST_ATTEMPTS, recover_expired
from marketing_pipelines_tests.agents.fake_models import anthropic_models, text_turn, tool_turn, unconfigured_models
from marketing_pipelines_tests.agents.runs import output_metadata, run_one
from marketing_pipelines_tests.built import queued_agent_runs_sensor
from marketing_pipelines_tests.factories import add_campaign, settings_from

INJECTED = (
    "Headline: Spring!\n"
    "[claim your prize](https://evil.example/win?token=s3cr3t) ![pixel](https://evil.example/p.png)\n"
    '<img src="https://evil.example/x.png"> <a href="https://evil.example">x</a>\n'
    "``` closing the fence early\n"
    "\x1b]8;;https://evil.example\x07terminal link\x1b]8;;\x07 \u202eevil\n"
)


@pytest.fixture
def people(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, "spring-launch")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        for permission in ("campaign:read", "measurement:read"):
            users.grant(conn, "ana", permission)
    return engine


def _request(engine: sa.Engine, **kw: Any) -> int:
    args: dict[str, Any] = {
        "agent": "campaign_brief",
        "campaign_id": "spring-launch",
        "requested_by": "ana",
        "input": {"stage": "launch"},
        "provider": "anthropic",
        "settings": settings_from({"ANTHROPIC_API_KEY": "k"}),
    }
    args.update(kw)
    with engine.begin() as conn:
        return request_agent_run(conn, **args)


def _failure(result: dg.ExecuteInProcessResult) -> tuple[str, dict[str, Any]]:
    failure = result.failure_data_for_node("run_agent")
    assert failure is not None and failure.user_failure_data is not None
    data = failure.user_failure_data
    return data.description or "", {k: v.value for k, v in data.metadata.items()}


def _row(engine: sa.Engine, run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, run_id)
    assert row is not None
    return row


def _only_code(markdown: str) -> list[str]:
    """The text of ``markdown`` outside fenced code blocks (CommonMark: a block ends at a fence at least as long)."""
    outside: list[str] = []
    fence: str | None = None
    for line in markdown.split("\n"):
        match = re.match(r"^ {0,3}(`{3,})", line)
        if fence is None and match:
            fence = match.group(1)
        elif fence is not None and match and match.group(1).startswith(fence) and line.strip() == match.group(1):
            fence = None
        elif fence is None:
            outside.append(line)
    assert fence is None, "a code block was left open"
    return outside


def test_a_succeeded_run_shows_its_output_and_transcript_neutralised(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    run_id = _request(people)

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        if call == 1:
            return tool_turn(
                "Reading [the campaign](https://evil.example/?k=1).", "read_campaign", {"campaign_id": "spring-launch"}
            )
        return text_turn(INJECTED)

    result = run_one(db_url, instance, anthropic_models(answer))
    assert result.success and _row(people, run_id)["status"] == "SUCCEEDED"
    metadata = output_metadata(result)
    output, summary = metadata["output"], metadata["transcript"]
    for shown in (output, summary):
        # Whatever the model wrote is inside code blocks: nothing it wrote is rendered as a link,
        # an image or HTML, and no URL keeps its query nor any control character survives.
        assert all("evil" not in line and "http" not in line for line in _only_code(shown))
        assert "s3cr3t" not in shown and "k=1" not in shown
        assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "https://evil.example/***" in output and "\\x1b" in output
    assert summary.splitlines()[0] == "Attempt 1: 2 model turn(s), 1 tool call(s), 0 refused."
    assert 'tool call read_campaign {"campaign_id": "spring-launch"} -> ok' in summary
    assert (metadata["steps"], metadata["tool_calls"], metadata["denials"]) == (2, 1, 0)


def test_a_failed_run_carries_its_transcript_with_refusals_marked(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    run_id = _request(people)

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        # Never a final answer: only calls of a tool this agent does not have, until the step limit.
        return tool_turn(f"turn {call}", "send_email", {"to": "all"}, call_id=f"toolu_{call}")

    result = run_one(db_url, instance, anthropic_models(answer))
    assert not result.success
    row = _row(people, run_id)
    assert row["status"] == "FAILED" and "step limit" in row["error"]
    description, metadata = _failure(result)
    assert "step limit" in description
    lines = _only_code(metadata["transcript"])
    assert lines[0] == "Attempt 1: 8 model turn(s), 8 tool call(s), 8 refused."
    assert metadata["transcript"].count("refused: tool call send_email") == 8
    assert "output" not in metadata


def test_a_provider_not_configured_where_the_run_executes_fails_once_naming_the_fix(
    people: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    # Configured where the request was made, not in the code location: unconfigured_models() hold no key.
    run_id = _request(people, max_attempts=3)
    result = run_one(db_url, instance, unconfigured_models())
    assert not result.success
    row = _row(people, run_id)
    assert (row["status"], row["attempts"], row["max_attempts"]) == ("FAILED", 1, 3)
    assert "set ANTHROPIC_API_KEY" in row["error"] and "reload the code location" in row["error"]
    assert f"agents retry {run_id}" in row["error"]
    description, _ = _failure(result)
    assert "not retried" in description
    # Nothing is left to claim: the run is not retried though attempts remain.
    context = dg.build_sensor_context(
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), "agent_settings": AgentSettings()},
    )
    assert isinstance(queued_agent_runs_sensor(context), dg.SkipReason)


def _wait_for_lost_lease(instance: dg.DagsterInstance, timeout_s: float = 60.0) -> None:
    """Until the run's lease keeper has logged the loss (its next renewal), so the loop sees it at its next step."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        [run] = instance.get_runs(limit=1)
        if any("lease lost" in (entry.user_message or "") for entry in instance.all_logs(run.run_id)):
            return
        time.sleep(0.1)
    raise AssertionError("the lease keeper never noticed the lost lease")


def _expire_and_recover(engine: sa.Engine, run_id: int) -> None:
    # The lease ran out (a stalled worker) once too often: a sensor's recovery gave up on the row.
    with engine.begin() as conn:
        past = datetime.now(UTC) - timedelta(minutes=1)
        lost = MAX_LOST_ATTEMPTS - 1
        conn.execute(
            sa.update(agent_run).where(agent_run.c.id == run_id).values(lease_expires_at=past, lost_attempts=lost)
        )
        assert recover_expired(conn, AGENT_RUNS).failed == (run_id,)


def _cancel(engine: sa.Engine, run_id: int) -> None:
    with engine.begin() as conn:
        cancel_agent_run(conn, run_id, "cancelled by a test")


@pytest.mark.parametrize(
    ("take_row", "status", "success"),
    [
        # Its lease expired once too often and recovery failed it: the Dagster run fails too.
        (_expire_and_recover, "FAILED", False),
        # An operator cancelled it: this run recorded nothing and stays green, saying why.
        (_cancel, "CANCELLED", True),
    ],
)
def test_a_run_that_loses_its_lease_fails_when_its_agent_run_ended_failed(
    people: sa.Engine,
    db_url: str,
    instance: dg.DagsterInstance,
    take_row: Callable[[sa.Engine, int], None],
    status: str,
    success: bool,
) -> None:
    run_id = _request(people, max_attempts=1)

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        take_row(people, run_id)
        _wait_for_lost_lease(instance)
        return tool_turn("Reading the campaign.", "read_campaign", {"campaign_id": "spring-launch"})

    # The shortest lease: the keeper renews (and finds the loss) every 5/3 seconds.
    result = run_one(db_url, instance, anthropic_models(answer), AgentSettings(lease_grace_seconds=5))
    assert _row(people, run_id)["status"] == status
    assert result.success is success
    said = f"it is {status} now and this run recorded nothing"
    if success:
        assert any(said in (entry.user_message or "") for entry in instance.all_logs(result.run_id))
    else:
        description, metadata = _failure(result)
        assert said in description and LOST_ATTEMPTS_ERROR in description
        assert metadata["transcript"].startswith("Attempt 1: 1 model turn(s)")


def test_transcript_markdown_cuts_long_transcripts_and_lines() -> None:
    steps = [
        {"kind": "model_turn", "name": "anthropic", "content": {"text": "x" * 10_000, "tool_calls": []}}
        for _ in range(150)
    ]
    shown = transcript_markdown(steps, 7, 1)
    assert "50 more line(s); the whole transcript: `marketing-pipelines agents show 7`." in shown
    assert max(len(line) for line in shown.splitlines()) <= 480


@pytest.mark.parametrize(
    "text",
    [
        "plain",
        "```",  # a fence of its own
        "a ```` b ````` c",  # runs longer than the default fence
    ],
)
def test_code_block_cannot_be_closed_by_its_text(text: str) -> None:
    block = code_block(text)
    fence = block.split("\n", 1)[0]
    assert block == f"{fence}\n{text}\n{fence}"
    assert _only_code(block) == []
    assert max((len(r) for r in re.findall("`+", text)), default=0) < len(fence)
