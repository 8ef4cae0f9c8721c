"""No wait of an agent run outlives its deadline, a worker whose run was failed stops, and answers are bounded.

A provider's ``Retry-After: 3600`` once left run workers asleep long after run monitoring had failed their runs
(``dagster/max_runtime``), and a provider's answer was read whole however long it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import STATUS_CHECK_S, OutOfTime, RunClock, RunEnded
from marketing_pipelines.agents.providers.base import MAX_ANSWER_BYTES, AnswerRefused
from marketing_pipelines.agents.queue import get_agent_run
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db import token_bucket
from marketing_pipelines_tests.agents.fake_models import (
    ANTHROPIC_TEXT,
    Script,
    anthropic_models,
    complete_once,
    scripted_anthropic,
    text_turn,
)
from marketing_pipelines_tests.agents.runs import output_metadata, run_one
from marketing_pipelines_tests.factories import add_campaign, request_brief

HOUR_HINT = httpx.Response(429, headers={"retry-after": "3600"}, json={"error": {"message": "slow down"}})
# Far below the 3600 s hint: a run that returns within it did not sleep the hint (the old code slept it all).
BOUND_S = 300.0


@pytest.fixture
def ana(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, "spring-launch")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
    return engine


def _request(engine: sa.Engine, max_run_seconds: int = 120) -> int:
    with engine.begin() as conn:
        return request_brief(conn, max_run_seconds=max_run_seconds)


def _row(engine: sa.Engine, agent_run_id: int) -> sa.RowMapping:
    with engine.connect() as conn:
        row = get_agent_run(conn, agent_run_id)
    assert row is not None
    return row


def _within(seconds: float, run: Callable[[], dg.ExecuteInProcessResult]) -> dg.ExecuteInProcessResult:
    """``run()``'s result, or a failure when it has not returned after ``seconds`` (it is asleep: left behind)."""
    results: list[dg.ExecuteInProcessResult] = []
    worker = threading.Thread(target=lambda: results.append(run()), daemon=True)
    worker.start()
    worker.join(seconds)
    assert results, f"the run had not returned after {seconds:.0f}s: its worker sleeps through the provider's hint"
    return results[0]


def test_a_retry_after_past_the_deadline_hands_the_agent_run_back_at_once(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    agent_run_id = _request(ana)
    calls: list[int] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        calls.append(call)
        return HOUR_HINT

    result = _within(BOUND_S, lambda: run_one(db_url, instance, anthropic_models(answer)))
    assert result.success and output_metadata(result)["outcome"] == "handed back"
    assert calls == [1]  # the hint is past the deadline: never slept, never asked again in this run
    row = _row(ana, agent_run_id)
    # Back in the queue, the attempt not spent: a throttle is no failure of the work.
    assert (row["status"], row["attempts"], row["max_attempts"], row["lost_attempts"]) == ("QUEUED", 1, 3, 1)
    assert "rate limited; retry in 3600s" in row["error"] and "handed back, attempt not spent" in row["error"]


def test_a_token_wait_ends_at_the_deadline(ana: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> None:
    # One call a minute, the one token already spent: the next comes in 60 s, past this run's 6 s.
    agent_run_id = _request(ana, max_run_seconds=6)
    with ana.begin() as conn:
        token_bucket.configure_bucket(conn, "anthropic", 1)
        assert token_bucket.try_acquire(conn, "anthropic")
    settings = AgentSettings(max_model_calls_per_minute=1)
    calls: list[int] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        calls.append(call)
        return text_turn("done")

    result = _within(BOUND_S, lambda: run_one(db_url, instance, anthropic_models(answer), settings))
    assert result.success and output_metadata(result)["outcome"] == "handed back"
    assert calls == []
    row = _row(ana, agent_run_id)
    assert (row["status"], row["lost_attempts"]) == ("QUEUED", 1)
    assert "model calls to anthropic are rate limited" in row["error"]


def test_a_worker_whose_run_was_failed_stops_instead_of_waiting(
    ana: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    agent_run_id = _request(ana)
    calls: list[int] = []

    def answer(call: int, body: dict[str, Any]) -> httpx.Response:
        calls.append(call)
        if call == 1:
            # What run monitoring does to a run past dagster/max_runtime, while its worker is mid-call.
            [run] = instance.get_runs(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
            instance.report_run_failed(run, "Canceling due to exceeding maximum runtime of 150 seconds.")
            return httpx.Response(429, headers={"retry-after": "2"}, json={"error": {"message": "slow down"}})
        return text_turn("done")

    result = _within(BOUND_S, lambda: run_one(db_url, instance, anthropic_models(answer)))
    assert not result.success
    failure = result.failure_data_for_node("run_agent")
    assert failure is not None and failure.user_failure_data is not None
    assert "the Dagster run is FAILURE, no longer STARTED; this worker stops" in (
        failure.user_failure_data.description or ""
    )
    assert calls == [1]  # it did not wait out the hint and ask again
    # Untouched: the run-failure sensor hands it back (the attempt lost, not spent), as for any failed run.
    assert _row(ana, agent_run_id)["status"] == "RUNNING"


def test_a_wait_reads_the_runs_status_between_slices_and_never_outlives_the_deadline(
    instance: dg.DagsterInstance,
) -> None:
    run = instance.add_run(dg.DagsterRun(job_name="agent_run_job", status=dg.DagsterRunStatus.STARTED))
    now, slept = [0.0], []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds
        if len(slept) == 2:  # run monitoring fails the run mid-wait
            instance.report_run_failed(run, "Canceling due to exceeding maximum runtime of 150 seconds.")

    clock = RunClock(instance, run.run_id, deadline=100.0, sleep=sleep, clock=lambda: now[0])
    with pytest.raises(OutOfTime):
        clock.wait(3600)  # a hint past the deadline is not slept at all
    assert slept == []
    with pytest.raises(RunEnded, match="FAILURE"):
        clock.wait(60)
    assert slept == [STATUS_CHECK_S, STATUS_CHECK_S]  # stopped at the first check after the failure
    with pytest.raises(RunEnded):
        clock.wait(0.1)  # and no later wait starts


def _streamed(total: int, sent: list[int]) -> Iterator[bytes]:
    chunk = b" " * 65536
    while sent[0] < total:
        sent[0] += len(chunk)
        yield chunk


@pytest.mark.parametrize("status", [200, 429])
def test_an_answer_longer_than_the_bound_is_refused_unread(status: int) -> None:
    sent = [0]
    # 40 MB without a length, as a chunked answer arrives; the provider stops reading it at the bound.
    script = Script(httpx.Response(status, stream=_Iterated(_streamed(40 << 20, sent))))
    with pytest.raises(AnswerRefused, match="answer longer than"):
        complete_once(scripted_anthropic(script))
    assert sent[0] <= MAX_ANSWER_BYTES + 65536


def test_an_answer_declaring_a_length_past_the_bound_is_refused_before_reading() -> None:
    big = httpx.Response(200, headers={"content-length": str(40 << 20)}, stream=_Iterated(iter([b"{}"])))
    with pytest.raises(AnswerRefused, match="refused unread"):
        complete_once(scripted_anthropic(Script(big)))


def test_a_compressed_answer_is_refused_as_its_decoded_size_is_unbounded() -> None:
    gzipped = httpx.Response(200, headers={"content-encoding": "gzip"}, stream=_Iterated(iter([b"\x1f\x8b"])))
    with pytest.raises(AnswerRefused, match="Content-Encoding 'gzip', asked for identity"):
        complete_once(scripted_anthropic(Script(gzipped)))


def test_answers_within_the_bound_read_as_before() -> None:
    script = Script(httpx.Response(200, json=ANTHROPIC_TEXT))
    assert complete_once(scripted_anthropic(script)).text == "Campaign 7 got 42 signups."
    assert script.requests[0].headers["accept-encoding"] == "identity"  # a compressed answer is not bounded


class _Iterated(httpx.SyncByteStream):
    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self._chunks
