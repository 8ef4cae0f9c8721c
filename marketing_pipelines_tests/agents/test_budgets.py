"""Daily spend budgets per campaign and requester: strict across processes, both or neither, refused at request."""

from __future__ import annotations

import json
import multiprocessing as mp
import time
from datetime import date, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from click.testing import Result

from marketing_pipelines.agents import users
from marketing_pipelines.agents.budget_reads import DaySpend, admission_refusal, day_spend, usd_text, utc_today
from marketing_pipelines.agents.budgets import (
    MAX_CALL_NANO_USD,
    MAX_DAILY_NANO_USD,
    MAX_DAILY_TOKENS,
    BudgetExhausted,
    reserve,
    set_budget,
    settle,
)
from marketing_pipelines.agents.queue import AgentRunRefused, get_agent_run, request_agent_run, retry_agent_run
from marketing_pipelines.agents.runner import AgentStopped
from marketing_pipelines.cli import budgets as budgets_cli
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import agent_run, spend_budget
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.factories import add_campaign, settings_from

CENT = 10_000_000  # nano-dollars
DAY = date(2026, 12, 7)
CAMPAIGN = "spring-launch"


@pytest.fixture
def people(engine: sa.Engine) -> sa.Engine:
    add_campaign(engine, CAMPAIGN)
    with engine.begin() as conn:
        for user in ("ana", "ben"):
            users.add_user(conn, user)
            users.grant(conn, user, "campaign:read")
    return engine


def _budget(engine: sa.Engine, scope: str, scope_id: str, usd: int | None = None, tokens: int | None = None) -> None:
    with engine.begin() as conn:
        set_budget(conn, scope, scope_id, daily_nano_usd=usd, daily_tokens=tokens)


def _reserve(engine: sa.Engine, user: str = "ana", nano_usd: int = 2 * CENT, tokens: int = 0, day: date = DAY) -> Any:
    with engine.begin() as conn:
        return reserve(conn, campaign_id=CAMPAIGN, requested_by=user, day=day, nano_usd=nano_usd, tokens=tokens)


def _settle(engine: sa.Engine, user: str, reserved: tuple[int, int], spent: tuple[int, int]) -> None:
    with engine.begin() as conn:
        settle(
            conn,
            campaign_id=CAMPAIGN,
            requested_by=user,
            day=DAY,
            reserved_nano_usd=reserved[0],
            reserved_tokens=reserved[1],
            spent_nano_usd=spent[0],
            spent_tokens=spent[1],
        )


def _spend(engine: sa.Engine, scope: str, scope_id: str, day: date = DAY) -> DaySpend:
    with engine.connect() as conn:
        return day_spend(conn, scope, scope_id, day)


def test_reserve_takes_until_the_budget_is_full_and_settle_records_the_truth(people: sa.Engine) -> None:
    _budget(people, "campaign", CAMPAIGN, usd=5 * CENT)
    assert [_reserve(people), _reserve(people)] == [None, None]
    refused = _reserve(people)
    assert refused == (
        f"campaign {CAMPAIGN}'s daily budget of $0.05 for 2026-12-07 (UTC) is spent: $0.00 spent, $0.04 reserved; "
        "this call needs up to $0.02"
    )
    assert _spend(people, "campaign", CAMPAIGN) == DaySpend(reserved_nano_usd=4 * CENT)
    # An answer that used more than its estimate: spent holds what it cost, the reservation is given back whole.
    _settle(people, "ana", reserved=(2 * CENT, 0), spent=(3 * CENT, 0))
    assert _spend(people, "campaign", CAMPAIGN) == DaySpend(reserved_nano_usd=2 * CENT, spent_nano_usd=3 * CENT)
    assert _reserve(people) is not None  # 3 + 2 + 2 cents > 5
    assert _reserve(people, nano_usd=0) is None  # a call that costs nothing (no price) still fits
    # Another day has its own account; the requester's is kept though no budget is set for it.
    assert _reserve(people, day=DAY + timedelta(days=1)) is None
    assert _spend(people, "requester", "ana") == DaySpend(reserved_nano_usd=2 * CENT, spent_nano_usd=3 * CENT)


def test_token_budgets_refuse_in_tokens(people: sa.Engine) -> None:
    _budget(people, "requester", "ben", tokens=1_000)
    assert _reserve(people, "ben", nano_usd=0, tokens=600) is None
    refused = _reserve(people, "ben", nano_usd=0, tokens=600)
    assert refused is not None
    assert "requester ben's daily budget of 1,000 tokens" in refused and "needs up to 600 tokens" in refused
    _settle(people, "ben", reserved=(0, 600), spent=(0, 1_000))
    with people.connect() as conn:
        reason = admission_refusal(conn, campaign_id=CAMPAIGN, requested_by="ben", day=DAY)
    assert reason is not None and "1,000 tokens spent, 0 tokens reserved" in reason
    assert "budgets set --requester ben --daily-tokens N" in reason


def test_campaign_and_requester_budgets_are_taken_both_or_neither(people: sa.Engine) -> None:
    _budget(people, "campaign", CAMPAIGN, usd=100 * CENT)
    _budget(people, "requester", "ana", usd=3 * CENT)
    assert _reserve(people, "ana") is None
    # The requester's budget refuses after the campaign's row took the amount: that take is undone.
    refused = _reserve(people, "ana")
    assert refused is not None and refused.startswith("requester ana's daily budget of $0.03")
    assert _spend(people, "campaign", CAMPAIGN).reserved_nano_usd == 2 * CENT
    assert _spend(people, "requester", "ana").reserved_nano_usd == 2 * CENT
    # The campaign's refusal leaves the requester's row as it was.
    _budget(people, "campaign", CAMPAIGN, usd=3 * CENT)
    refused = _reserve(people, "ben")
    assert refused is not None and refused.startswith(f"campaign {CAMPAIGN}'s")
    assert _spend(people, "requester", "ben") == DaySpend()
    assert _spend(people, "campaign", CAMPAIGN).reserved_nano_usd == 2 * CENT


@pytest.mark.parametrize(
    ("amount", "error"),
    [
        (float("nan"), TypeError),  # never a float: amounts are exact integers
        (1.0, TypeError),
        (True, TypeError),
        ("5", TypeError),
        (-1, ValueError),
    ],
)
def test_amounts_that_are_not_non_negative_integers_are_refused(
    people: sa.Engine, amount: Any, error: type[Exception]
) -> None:
    with pytest.raises(error):
        _reserve(people, nano_usd=amount)
    with pytest.raises(error):
        _settle(people, "ana", reserved=(0, 0), spent=(amount, 0))
    assert _spend(people, "campaign", CAMPAIGN) == DaySpend()


def test_a_huge_reported_cost_is_bounded_per_call(people: sa.Engine) -> None:
    _settle(people, "ana", reserved=(0, 0), spent=(2**70, 2**70))
    spend = _spend(people, "campaign", CAMPAIGN)
    assert spend.spent_nano_usd == MAX_CALL_NANO_USD and spend.spent_tokens > 0
    # A second settle of the same reservation (a bug) does not fail the caller's transaction on the >= 0 check.
    _settle(people, "ana", reserved=(5 * CENT, 5), spent=(0, 0))
    assert _spend(people, "campaign", CAMPAIGN).reserved_nano_usd == 0


def _refused_request(engine: sa.Engine, user: str) -> AgentRunRefused:
    with engine.begin() as conn:  # committed: the REFUSED row is kept, as the command line keeps it
        try:
            request_agent_run(
                conn,
                agent="campaign_brief",
                campaign_id=CAMPAIGN,
                requested_by=user,
                input={"stage": "launch"},
                settings=settings_from({}),
            )
        except AgentRunRefused as exc:
            return exc
    raise AssertionError("the request was admitted")


def _request(engine: sa.Engine, user: str) -> int:
    with engine.begin() as conn:
        return request_agent_run(
            conn,
            agent="campaign_brief",
            campaign_id=CAMPAIGN,
            requested_by=user,
            input={"stage": "launch"},
            settings=settings_from({}),
        )


def test_a_run_requested_when_a_budget_is_used_up_is_refused_and_recorded(people: sa.Engine) -> None:
    today = utc_today()  # request_agent_run reads today's account
    _budget(people, "campaign", CAMPAIGN, usd=2 * CENT)
    assert _request(people, "ana") > 0  # room left: queued
    assert _reserve(people, "ana", day=today) is None  # spent + reserved reach the limit
    refused = _refused_request(people, "ben")
    with people.connect() as conn:
        row = get_agent_run(conn, refused.agent_run_id)
    assert row is not None and row["status"] == "REFUSED"
    assert row["error"].startswith(f"campaign {CAMPAIGN}'s daily budget of $0.02") and "is used up" in row["error"]
    # A requester's budget of zero refuses that requester only.
    _budget(people, "campaign", CAMPAIGN, usd=10 * CENT)
    _budget(people, "requester", "ben", usd=0)
    assert "requester ben's daily budget of $0.00" in _refused_request(people, "ben").reason
    assert _request(people, "ana") > 0


def test_a_retry_when_a_budget_is_used_up_is_refused_and_the_run_left_as_it_was(people: sa.Engine) -> None:
    today = utc_today()
    _budget(people, "campaign", CAMPAIGN, usd=2 * CENT)
    run_id = _request(people, "ana")
    with people.begin() as conn:
        conn.execute(sa.update(agent_run).where(agent_run.c.id == run_id).values(status="FAILED", attempts=1))
    assert _reserve(people, "ana", day=today) is None  # the day's budget is now used up
    with people.begin() as conn, pytest.raises(InvalidInput) as refused:
        retry_agent_run(conn, run_id)
    assert str(refused.value).startswith(f"agent run {run_id} not retried: campaign {CAMPAIGN}'s daily budget")
    assert "is used up" in str(refused.value) and "\n" not in str(refused.value)
    with people.connect() as conn:
        assert get_agent_run(conn, run_id)["status"] == "FAILED"  # type: ignore[index]
    # With room again, the same retry queues it.
    _budget(people, "campaign", CAMPAIGN, usd=10 * CENT)
    with people.begin() as conn:
        assert retry_agent_run(conn, run_id).previous_status == "FAILED"


def test_budget_exhausted_ends_a_run_as_stopped() -> None:
    stopped = BudgetExhausted("campaign x's daily budget ...")
    assert isinstance(stopped, AgentStopped) and stopped.reason == str(stopped)


# --- eight processes race one campaign budget -------------------------------------------------

PROCESSES = 8
CALL = 2 * CENT
CAMPAIGN_BUDGET = 100 * CENT  # 50 calls
ANA_BUDGET = 20 * CENT  # 10 of them for ana, who asks for half; ben's are limited by the campaign's alone


def _race(db_url: str, user: str, start: Any, out: Any) -> None:
    engine = get_engine(db_url)
    with engine.connect():
        pass  # connect before the race starts
    calls = 0
    start.wait()
    while True:
        with engine.begin() as conn:
            refused = reserve(conn, campaign_id=CAMPAIGN, requested_by=user, day=DAY, nano_usd=CALL, tokens=10)
        if refused is not None:
            break
        time.sleep(0.002)  # the model call, during which other processes reserve
        with engine.begin() as conn:
            settle(
                conn,
                campaign_id=CAMPAIGN,
                requested_by=user,
                day=DAY,
                reserved_nano_usd=CALL,
                reserved_tokens=10,
                spent_nano_usd=CALL,  # the worst case, as reserved: the budget is used exactly
                spent_tokens=10,
            )
        calls += 1
    out.put((user, calls))


@pytest.mark.slow
@pytest.mark.parametrize("database", ["sqlite", "postgres"])
def test_eight_processes_never_spend_beyond_the_budgets(database: str, request: pytest.FixtureRequest) -> None:
    db_url = request.getfixturevalue("sqlite_url" if database == "sqlite" else "pg_url")
    engine = get_engine(db_url)
    add_campaign(engine, CAMPAIGN)
    with engine.begin() as conn:
        for user in ("ana", "ben"):
            users.add_user(conn, user)
    _budget(engine, "campaign", CAMPAIGN, usd=CAMPAIGN_BUDGET)
    _budget(engine, "requester", "ana", usd=ANA_BUDGET)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(PROCESSES + 1, timeout=120), ctx.Queue()
    # Half the processes run ana's calls, whose requester budget refuses after the campaign's row took them;
    # on PostgreSQL a lock taken out of order would end one of them in a deadlock error.
    who = ["ana", "ben"] * (PROCESSES // 2)
    procs = [ctx.Process(target=_race, args=(db_url, user, start, out)) for user in who]
    for p in procs:
        p.start()
    start.wait()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    calls = {user: sum(n for u, n in results if u == user) for user in ("ana", "ben")}
    campaign, ana, ben = (
        _spend(engine, "campaign", CAMPAIGN),
        _spend(engine, "requester", "ana"),
        _spend(engine, "requester", "ben"),
    )
    # Spend never passes a budget (reservations are the worst case), and each process stopped only when a budget
    # of its calls was full: not one call more or fewer than the budgets pay for. The campaign's always fills
    # (ben's calls go on until it does); ana's fills too unless ben's processes took the campaign's last calls
    # first (seen in CI: ana's processes started late and made 5 calls), so it is bounded, not reached.
    assert campaign.spent_nano_usd == CAMPAIGN_BUDGET == (calls["ana"] + calls["ben"]) * CALL
    assert ana.spent_nano_usd == calls["ana"] * CALL <= ANA_BUDGET
    assert ben.spent_nano_usd == calls["ben"] * CALL
    # Both or neither: every call the campaign paid for, one of its requesters paid for too.
    assert ana.spent_nano_usd + ben.spent_nano_usd == campaign.spent_nano_usd
    assert campaign.spent_tokens == 10 * (calls["ana"] + calls["ben"])
    # Every reservation was settled or undone.
    assert campaign.reserved_nano_usd == ana.reserved_nano_usd == ben.reserved_nano_usd == 0
    assert campaign.reserved_tokens == ana.reserved_tokens == ben.reserved_tokens == 0


# --- the command line -------------------------------------------------------------------------


def one_line_error(result: Result) -> str:
    lines = result.output.splitlines()
    assert result.exit_code != 0 and len(lines) == 1 and lines[0].startswith("Error: "), result.output
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--campaign", CAMPAIGN, "--daily-usd", "-1"], "from 0 to 1,000,000"),
        (["--campaign", CAMPAIGN, "--daily-usd", "nan"], "must be a finite amount"),
        (["--campaign", CAMPAIGN, "--daily-usd", "inf"], "must be a finite amount"),
        (["--campaign", CAMPAIGN, "--daily-usd", "1000000.01"], "from 0 to 1,000,000"),
        (["--campaign", CAMPAIGN, "--daily-usd", "1e999999"], "from 0 to 1,000,000"),
        (["--campaign", CAMPAIGN, "--daily-usd", "five"], "is not an amount of US dollars"),
        (["--campaign", CAMPAIGN, "--daily-usd", "0.0000000001"], "finer than a nano-dollar"),
        (["--campaign", CAMPAIGN, "--daily-tokens", "-5"], "is not in the range"),
        (["--campaign", CAMPAIGN, "--daily-tokens", "1e6"], "is not a valid integer"),
        (["--campaign", CAMPAIGN, "--daily-tokens", str(10**13)], "is not in the range"),
        (["--campaign", "nope", "--daily-usd", "1"], "unknown campaign 'nope'"),
        (["--requester", "zoe", "--daily-usd", "1"], "unknown user 'zoe'"),
        (["--campaign", CAMPAIGN], "give --daily-usd, --daily-tokens or both"),
        (["--daily-usd", "1"], "give one of --campaign ID or --requester USER"),
        (["--campaign", CAMPAIGN, "--requester", "ana", "--daily-usd", "1"], "give one of --campaign"),
    ],
)
def test_hostile_budget_values_are_refused_in_one_line(
    people: sa.Engine, db_url: str, args: list[str], expected: str
) -> None:
    result = cli_for(db_url)("budgets", "set", *args)
    assert expected in one_line_error(result)
    with people.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(spend_budget)).scalar_one() == 0


def test_budgets_set_show_and_clear(people: sa.Engine, db_url: str) -> None:
    cli = cli_for(db_url)
    assert cli("budgets", "set", "--campaign", CAMPAIGN, "--daily-usd", "0.1").exit_code == 0
    done = cli("budgets", "set", "--campaign", CAMPAIGN, "--daily-tokens", "5000")
    assert done.output == f"campaign {CAMPAIGN}: daily budget $0.10 and 5,000 tokens (UTC days)\n"
    assert cli("budgets", "set", "--requester", "ana", "--daily-usd", "0.000000001").exit_code == 0
    assert _reserve(people, "ben", nano_usd=3 * CENT, tokens=100, day=utc_today()) is None
    shown = cli("budgets", "show", "--json")
    assert shown.exit_code == 0, shown.output
    rows = {(r["scope"], r["id"]): r for r in json.loads(shown.output)}
    assert rows[("campaign", CAMPAIGN)] | {"updated_at": None} == {
        "scope": "campaign",
        "id": CAMPAIGN,
        "day": utc_today().isoformat(),
        "daily_usd": "$0.10",
        "spent_usd": "$0.00",
        "reserved_usd": "$0.03",
        "daily_tokens": 5000,
        "spent_tokens": 0,
        "reserved_tokens": 100,
        "daily_nano_usd": 10 * CENT,
        "spent_nano_usd": 0,
        "reserved_nano_usd": 3 * CENT,
        "updated_at": None,
    }
    assert rows[("requester", "ana")]["daily_usd"] == "$0.000000001"
    assert cli("budgets", "clear", "--requester", "ana").output == "requester ana: budget removed\n"
    assert cli("budgets", "clear", "--requester", "ana").output == "requester ana: had no budget\n"
    assert [line.split()[:2] for line in cli("budgets", "show").output.splitlines()[1:]] == [["campaign", CAMPAIGN]]


def test_the_command_lines_bounds_are_the_ledgers() -> None:
    assert budgets_cli.MAX_DAILY_USD * budgets_cli.NANO_PER_USD == MAX_DAILY_NANO_USD
    assert budgets_cli.MAX_DAILY_TOKENS == MAX_DAILY_TOKENS
    assert usd_text(4_998_000_000) == "$4.998" and usd_text(10**15) == "$1,000,000.00"
