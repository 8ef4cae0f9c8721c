"""What model calls cost: prices by model, exact nano-dollar costs, each run's totals, the daily cost asset, and the
costs `agents show` and `agents list --json` print."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.assets import build_model_cost_asset
from marketing_pipelines.agents.costs import (
    FREE,
    Price,
    cost_metadata,
    cost_summary,
    max_call_cost_nano_usd,
    price_of,
    record_turn,
    turn_cost_nano_usd,
    usd_text,
)
from marketing_pipelines.agents.providers.types import usage_of
from marketing_pipelines.agents.queue import Transcript, transcript
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import (
    agent_model_cost_daily,
    agent_run,
    agent_run_step,
    measurement_daily_rollup,
)
from marketing_pipelines.settings import DEFAULT_MODEL_PRICES, PRICES_READ_ON, SettingsError, load_settings
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.factories import add_campaign, request_brief, settings_from

PRICES = DEFAULT_MODEL_PRICES
SONNET = "claude-sonnet-4-5-20250929"


def turn(
    engine: sa.Engine, run_id: int, usage: dict[str, int], model: str, provider: str, attempt: int = 1
) -> int | None:
    """One answered model turn recorded as the gate records it: its cost, the run's totals and the transcript row
    in one transaction. Returns the cost it recorded (None: no price)."""
    price = price_of(provider, model, PRICES)
    cost = turn_cost_nano_usd(usage, price) if price is not None else None
    steps = Transcript(engine, run_id, attempt)
    with engine.begin() as conn:
        record_turn(conn, run_id, usage, cost)
        steps.add(
            "model_turn", None, {"text": "answer", "usage": usage, "model": model, "cost_nano_usd": cost}, conn=conn
        )
    return cost


@pytest.fixture
def runs(engine: sa.Engine) -> dict[str, int]:
    add_campaign(engine, "spring-launch")
    add_campaign(engine, "autumn-sale")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")
        ids = {provider: request_brief(conn, provider) for provider in ("anthropic", "openai", "offline")}
        ids["autumn"] = request_brief(conn, "anthropic")
        conn.execute(sa.update(agent_run).where(agent_run.c.id == ids["autumn"]).values(campaign_id="autumn-sale"))
    return ids


# (provider, model as the answer names it, the price table's model it is priced as; None: no price)
MATCHES = [
    ("anthropic", "claude-sonnet-4-5", "claude-sonnet-4-5"),  # exact
    ("anthropic", SONNET, "claude-sonnet-4-5"),  # a dated snapshot of a priced model
    ("anthropic", "claude-haiku-4-5-20251001", "claude-haiku-4-5"),
    ("openai", "gpt-4o-mini-2024-07-18", "gpt-4o-mini"),  # never gpt-4o's price, though it starts with it
    ("openai", "gpt-4o-2024-08-06", "gpt-4o"),
    ("openai", "gpt-4.1-nano", "gpt-4.1-nano"),
    ("openai", "gpt-4o-mini-extra", None),  # a longer name is another model, not a snapshot
    ("anthropic", "claude-sonnet-4-5-preview", None),
    ("anthropic", "claude-haiku-5-5", None),  # priced by prompt length: no one price per token
    ("openai", "my-local-llama", None),  # an OpenAI-compatible server's model: unknown, never 0
]


@pytest.mark.parametrize(("provider", "model", "priced_as"), MATCHES)
def test_a_model_is_priced_by_its_name_or_as_the_model_it_is_a_snapshot_of(
    provider: str, model: str, priced_as: str | None
) -> None:
    price = price_of(provider, model, PRICES)
    assert (price.model if price else None) == priced_as


def test_offline_costs_nothing_and_a_paid_model_without_a_price_has_no_cost() -> None:
    assert price_of("offline", "offline-analyst", PRICES) == FREE
    assert turn_cost_nano_usd(usage_of(input_tokens=10**6, output_tokens=10**6), FREE) == 0
    assert price_of("anthropic", "offline-analyst", PRICES) is None


def test_a_turn_is_priced_exactly_with_cached_tokens_at_the_cache_prices() -> None:
    price = price_of("anthropic", SONNET, PRICES)
    assert price == Price("claude-sonnet-4-5", 3_000_000, 15_000_000, 300_000, 3_750_000)
    usage = usage_of(
        input_tokens=1000, output_tokens=500, cache_read_input_tokens=10_000, cache_creation_input_tokens=2000
    )
    # $3, $15, $0.30 and $3.75 per million tokens: 0.003 + 0.0075 + 0.003 + 0.0075 USD.
    assert turn_cost_nano_usd(usage, price) == 21_000_000
    # The same 13,000 prompt tokens all at the full input price would cost more than read from the cache.
    uncached = usage_of(input_tokens=13_000, output_tokens=500)
    assert turn_cost_nano_usd(uncached, price) == 46_500_000
    # A price of fractions of a nano-dollar per token ($0.0004 per million: 0.4 nano-dollars a token) is summed
    # exactly, then rounded once, half up.
    tiny = Price("tiny", input=400, output=500, cache_read=0, cache_write=0)
    assert turn_cost_nano_usd(usage_of(input_tokens=1), tiny) == 0
    assert turn_cost_nano_usd(usage_of(input_tokens=3), tiny) == 1
    assert turn_cost_nano_usd(usage_of(output_tokens=1), tiny) == 1
    assert turn_cost_nano_usd(usage_of(input_tokens=1, output_tokens=1), tiny) == 1
    assert usd_text(21_000_000) == "0.021000" and usd_text(500) == "0.000001" and usd_text(499) == "0.000000"


def test_the_worst_case_of_a_call_is_never_below_what_it_costs() -> None:
    price = price_of("anthropic", "claude-sonnet-4-5", PRICES)
    estimate = {"requests": 1, "input_tokens": 12_001, "output_tokens": 1024, "tokens": 13_025}
    worst = max_call_cost_nano_usd(estimate, price)
    # Anthropic's cache write (1.25x input) is the dearest way to pay for an input token.
    assert worst == 12_001 * 3750 + 1024 * 15_000
    for cached in (0, 5000, 12_001):
        for written in (0, 12_001 - cached):
            usage = usage_of(
                input_tokens=12_001 - cached - written,
                cache_read_input_tokens=cached,
                cache_creation_input_tokens=written,
                output_tokens=1024,
            )
            assert turn_cost_nano_usd(usage, price) <= worst
    assert max_call_cost_nano_usd(estimate, None) == 0


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": -1},  # negative
        {"output_tokens": float("nan")},  # not an integer
        {"output_tokens": "12"},
        {"input_tokens": True},
        {"cache_read_input_tokens": 10**12},  # beyond any context window
    ],
)
def test_a_usage_that_is_not_bounded_integers_is_refused_before_anything_is_recorded(
    engine: sa.Engine, runs: dict[str, int], usage: dict[str, Any]
) -> None:
    with pytest.raises(ValueError, match="must be an integer"):
        turn_cost_nano_usd(usage, FREE)
    with pytest.raises(ValueError, match="must be an integer"), engine.begin() as conn:
        record_turn(conn, runs["anthropic"], usage, 0)
    with engine.connect() as conn:
        assert cost_summary(conn, runs["anthropic"])["model_turns"] == 0


def test_the_cost_of_a_run_is_the_sum_of_its_turns_at_the_price_table(engine: sa.Engine, runs: dict[str, int]) -> None:
    run_id = runs["anthropic"]
    usages = [
        usage_of(input_tokens=4000, output_tokens=700, cache_creation_input_tokens=3500),
        usage_of(input_tokens=350, output_tokens=420, cache_read_input_tokens=3500),
        usage_of(input_tokens=812, output_tokens=1999, cache_read_input_tokens=3500),
    ]
    costs = [
        turn(engine, run_id, usage, SONNET, "anthropic", attempt)
        for attempt, usage in zip((1, 1, 2), usages, strict=True)
    ]
    price = price_of("anthropic", SONNET, PRICES)
    assert costs == [turn_cost_nano_usd(usage, price) for usage in usages]
    with engine.connect() as conn:
        summary = cost_summary(conn, run_id)
        metadata = cost_metadata(conn, run_id)
    # input at $3, output at $15, cache writes at $3.75 and cache reads at $0.30 per million tokens
    assert costs == [
        12_000_000 + 10_500_000 + 13_125_000,
        1_050_000 + 6_300_000 + 1_050_000,
        2_436_000 + 29_985_000 + 1_050_000,
    ]
    assert summary["cost_nano_usd"] == sum(costs)
    assert summary["cost_usd"] == usd_text(sum(costs)) == "0.077496"
    assert (summary["model_turns"], summary["cost_complete"], summary["unknown_cost_turns"]) == (3, True, 0)
    assert summary["input_tokens"] == 4000 + 350 + 812
    assert summary["output_tokens"] == 700 + 420 + 1999
    assert (summary["cache_read_tokens"], summary["cache_write_tokens"]) == (7000, 3500)
    assert metadata["cost_nano_usd"] == dg.MetadataValue.int(sum(costs))
    assert metadata["cost_usd"] == dg.MetadataValue.float(sum(costs) / 1e9)
    assert metadata["input_tokens"] == dg.MetadataValue.int(5162)
    assert metadata["prices_read_on"] == dg.MetadataValue.text(PRICES_READ_ON)

    # A turn of a model without a price: its tokens count, its cost is unknown, and the total says so.
    assert turn(engine, run_id, usage_of(input_tokens=10, output_tokens=10), "claude-unpriced-9", "anthropic") is None
    with engine.connect() as conn:
        summary = cost_summary(conn, run_id)
    assert (summary["model_turns"], summary["cost_nano_usd"], summary["cost_complete"]) == (4, sum(costs), False)
    assert summary["unknown_cost_turns"] == 1


def recount(engine: sa.Engine, run_ids: list[int], day: date) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The day's cost rows counted again from the transcripts as `agents show` reads them, one run at a time."""
    with engine.connect() as conn:
        query = sa.select(agent_run.c.id, agent_run.c.campaign_id, agent_run.c.model_provider)
        runs = {row[0]: tuple(row[1:]) for row in conn.execute(query.where(agent_run.c.id.in_(run_ids)))}
        rows: dict[tuple[str, str, str], dict[str, Any]] = defaultdict(lambda: defaultdict(int, runs=set()))
        for run_id in run_ids:
            for step in transcript(conn, run_id):
                if step["kind"] != "model_turn" or step["created_at"].date() != day:
                    continue
                content = step["content"]
                row = rows[(*runs[run_id], content["model"])]
                row["runs"].add(run_id)
                row["model_turns"] += 1
                usage = content["usage"]
                if not all(isinstance(usage.get(k, 0), int) for k in usage):
                    row["unknown_cost_turns"] += 1
                    continue
                row["input_tokens"] += usage["input_tokens"]
                row["output_tokens"] += usage["output_tokens"]
                row["cache_read_tokens"] += usage["cache_read_input_tokens"]
                row["cache_write_tokens"] += usage["cache_creation_input_tokens"]
                if content["cost_nano_usd"] is None:
                    row["unknown_cost_turns"] += 1
                else:
                    row["cost_nano_usd"] += content["cost_nano_usd"]
    return {
        key: {"agent_runs": len(row["runs"])} | {k: v for k, v in row.items() if k != "runs"}
        for key, row in rows.items()
    }


def materialize_costs(db_url: str, day: date) -> dg.ExecuteInProcessResult:
    return dg.materialize(
        [build_model_cost_asset(settings_from({}))],
        partition_key=day.isoformat(),
        resources={"app_db": AppDatabase(url=db_url)},
        instance=dg.DagsterInstance.ephemeral(),
    )


def stored_rows(engine: sa.Engine, day: date) -> dict[tuple[str, str, str], dict[str, Any]]:
    t = agent_model_cost_daily
    with engine.connect() as conn:
        found = conn.execute(sa.select(t).where(t.c.day == day)).mappings().all()
    drop = {"day", "campaign_id", "provider", "model", "computed_at"}
    return {
        (r["campaign_id"], r["provider"], r["model"]): {k: v for k, v in r.items() if k not in drop and v}
        for r in found
    }


def test_the_daily_cost_asset_agrees_with_a_recount_of_the_transcripts(
    engine: sa.Engine, db_url: str, runs: dict[str, int]
) -> None:
    today = datetime.now(UTC).date()
    yesterday = today - timedelta(days=1)
    cached = usage_of(input_tokens=900, output_tokens=300, cache_read_input_tokens=4000)
    for _ in range(3):
        turn(engine, runs["anthropic"], cached, SONNET, "anthropic")
    turn(engine, runs["anthropic"], usage_of(input_tokens=50, output_tokens=5), "claude-haiku-4-5", "anthropic")
    turn(engine, runs["autumn"], usage_of(input_tokens=7000, cache_creation_input_tokens=4000), SONNET, "anthropic")
    turn(
        engine,
        runs["openai"],
        usage_of(input_tokens=1200, output_tokens=80, cache_read_input_tokens=1024),
        "gpt-4o-mini-2024-07-18",
        "openai",
    )
    turn(engine, runs["openai"], usage_of(input_tokens=10, output_tokens=10), "gpt-unpriced", "openai")
    turn(engine, runs["offline"], usage_of(input_tokens=120, output_tokens=40), "offline-analyst", "offline")
    # A turn stored by a provider that reported nonsense: it costs only itself (tokens not counted, cost unknown).
    Transcript(engine, runs["openai"], 1).add(
        "model_turn", None, {"usage": {"input_tokens": float("nan")}, "model": "gpt-4o", "cost_nano_usd": 5}
    )
    # Two of the autumn-sale run's turns were yesterday's.
    turn(engine, runs["autumn"], usage_of(input_tokens=10, output_tokens=2000), SONNET, "anthropic")
    turn(engine, runs["autumn"], usage_of(input_tokens=20, output_tokens=1000), SONNET, "anthropic")
    with engine.begin() as conn:
        last_two = sa.select(agent_run_step.c.id).where(agent_run_step.c.agent_run_id == runs["autumn"])
        last_two = last_two.order_by(agent_run_step.c.id.desc()).limit(2)
        ids = [row[0] for row in conn.execute(last_two)]
        conn.execute(
            sa.update(agent_run_step)
            .where(agent_run_step.c.id.in_(ids))
            .values(created_at=datetime.now(UTC) - timedelta(days=1))
        )

    run_ids = list(runs.values())
    for day in (today, yesterday):
        result = materialize_costs(db_url, day)
        assert result.success
        expected = recount(engine, run_ids, day)
        assert stored_rows(engine, day) == {k: {c: v for c, v in row.items() if v} for k, row in expected.items()}
        [materialization] = result.asset_materializations_for_node("agent_model_cost_daily")
        assert materialization.metadata["model_turns"] == dg.MetadataValue.int(
            sum(row["model_turns"] for row in expected.values())
        )
        assert materialization.metadata["cost_nano_usd"] == dg.MetadataValue.int(
            sum(row.get("cost_nano_usd", 0) for row in expected.values())
        )
    assert stored_rows(engine, today)[("spring-launch", "openai", "gpt-4o")]["unknown_cost_turns"] == 1
    assert stored_rows(engine, today)[("spring-launch", "openai", "gpt-unpriced")]["unknown_cost_turns"] == 1
    assert stored_rows(engine, today)[("spring-launch", "offline", "offline-analyst")]["model_turns"] == 1
    assert len(stored_rows(engine, yesterday)) == 1

    # Every run's recorded cost is its turns' over both days (the hostile row was never recorded on the run).
    with engine.connect() as conn:
        run_total = sum(cost_summary(conn, r)["cost_nano_usd"] for r in run_ids)
    day_total = sum(
        row.get("cost_nano_usd", 0) for day in (today, yesterday) for row in stored_rows(engine, day).values()
    )
    # The hostile row's stored cost of 5 is not counted: its usage is unreadable, so its cost is unknown.
    assert day_total == run_total

    # Re-running a day replaces it: the same rows, not twice as many.
    before = stored_rows(engine, today)
    assert materialize_costs(db_url, today).success
    assert stored_rows(engine, today) == before

    # An analyst puts the cost beside the campaign's outcomes on (day, campaign_id).
    r, c = measurement_daily_rollup, agent_model_cost_daily
    beside = (
        sa.select(c.c.campaign_id, sa.func.sum(c.c.cost_nano_usd), sa.func.sum(r.c.raw_count))
        .select_from(c.outerjoin(r, sa.and_(r.c.day == c.c.day, r.c.campaign_id == c.c.campaign_id)))
        .where(c.c.day == yesterday)
        .group_by(c.c.campaign_id)
    )
    autumn_cost = stored_rows(engine, yesterday)[("autumn-sale", "anthropic", SONNET)]["cost_nano_usd"]
    with engine.connect() as conn:
        assert [tuple(row) for row in conn.execute(beside)] == [("autumn-sale", autumn_cost, None)]


HOSTILE = [
    ('{"x": {"input": -1, "output": 1}}', "'input' must be from 0 to 10000"),  # negative
    ('{"x": {"input": NaN, "output": 1}}', "NaN is not a price"),  # non-finite
    ('{"x": {"input": 1, "output": Infinity}}', "Infinity is not a price"),
    ('{"x": {"input": 1, "output": 1e400}}', "'output' must be from 0 to 10000"),  # overflows to infinity
    ('{"x": {"input": 10001, "output": 1}}', "'input' must be from 0 to 10000"),  # absurd
    ('{"x": {"input": 1, "output": 1, "batch": 0.5}}', "unknown key 'batch'"),
    ('{"x": {"input": "3", "output": 1}}', "'input' must be a number"),
    ('{"x": {"input": true, "output": 1}}', "'input' must be a number"),
    ('{"x": {"output": 1}}', "'input' is missing"),
    ('{"x": {"input": 0.0000001, "output": 1}}', "more than 6 decimals"),
    ('{"x y": {"input": 1, "output": 1}}', "a model name must be"),
    ('{"x": 3}', "its price must be an object"),
    ('[["x", 1]]', "must be a JSON object"),
    ('{"x": {', "is not a JSON object of model prices"),
]


@pytest.mark.parametrize(("value", "problem"), HOSTILE)
def test_a_hostile_price_table_is_refused_in_one_line(value: str, problem: str) -> None:
    # As the environment gives it: the JSON text (a child process given it in its env: test_settings.py).
    with pytest.raises(SettingsError) as raised:
        load_settings(model_prices=value)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("MARKETING_MODEL_PRICES=") and problem in message, message


# Dagster's Float config turns a boolean into 1.0 or 0.0 before the resource sees it: that case is the
# environment's only (test_a_hostile_price_table_is_refused_in_one_line).
@pytest.mark.parametrize(
    ("value", "problem"), [(v, p) for v, p in HOSTILE if v.startswith('{"x": {"') and "true" not in v]
)
def test_a_hostile_price_table_given_as_run_config_fails_the_resource_at_launch(value: str, problem: str) -> None:
    # The launchpad's resource config bypasses Settings: the resource checks it the same way, at its init.
    import json

    import dagster as dg

    from marketing_pipelines.agents.resources import AgentSettings

    prices = json.loads(value, parse_constant=float)
    with (
        pytest.raises(Exception) as raised,
        dg.build_resources(
            {"agent_settings": AgentSettings.configure_at_launch()},
            resource_config={"agent_settings": {"config": {"model_prices": prices}}},
        ),
    ):
        pass
    # Dagster's own config check refuses a value of another type (text) before the resource is built; the
    # resource's names the model and what is wrong (a NaN or infinity that YAML gives as a float is out of range).
    said = f"{raised.value} {raised.value.__cause__}"
    if not isinstance(raised.value, dg.DagsterInvalidConfigError):
        assert "model 'x'" in said and (problem in said or "must be" in said), said


def test_run_config_prices_keep_the_defaults_under_what_they_give() -> None:
    from marketing_pipelines.agents.resources import AgentSettings

    prices = AgentSettings(model_prices={"gpt-4o": {"input": 2, "output": 8}}).model_prices
    assert price_of("openai", "gpt-4o", prices) == Price("gpt-4o", 2_000_000, 8_000_000, 2_000_000, 2_000_000)
    assert price_of("anthropic", SONNET, prices) == price_of("anthropic", SONNET, PRICES)


def test_a_price_setting_adds_models_and_replaces_defaults() -> None:
    prices = load_settings(
        model_prices='{"claude-haiku-5-5": {"input": 0.5, "output": 2.5, "cache_read": 0.05, "cache_write": 0.625}, '
        '"gpt-4o": {"input": 2, "output": 8}}'
    ).model_prices
    assert price_of("anthropic", "claude-haiku-5-5", prices) == Price(
        "claude-haiku-5-5", 500_000, 2_500_000, 50_000, 625_000
    )
    # Cache prices not given are the input price.
    assert price_of("openai", "gpt-4o-2024-08-06", prices) == Price(
        "gpt-4o", 2_000_000, 8_000_000, 2_000_000, 2_000_000
    )
    assert price_of("anthropic", SONNET, prices) == price_of("anthropic", SONNET, PRICES)


def test_agents_show_and_list_print_the_cost(engine: sa.Engine, db_url: str, runs: dict[str, int]) -> None:
    run_id = runs["anthropic"]
    costs = [
        turn(
            engine,
            run_id,
            usage_of(input_tokens=1000, output_tokens=500, cache_read_input_tokens=2000),
            SONNET,
            "anthropic",
        ),
        turn(
            engine,
            run_id,
            usage_of(input_tokens=333, output_tokens=77, cache_creation_input_tokens=2000),
            SONNET,
            "anthropic",
        ),
    ]
    turn(engine, runs["openai"], usage_of(input_tokens=5, output_tokens=5), "gpt-unpriced", "openai")
    cli = cli_for(db_url)

    shown = json.loads(cli("agents", "show", str(run_id), "--json").output)
    assert shown["cost"]["cost_nano_usd"] == shown["run"]["cost_nano_usd"] == sum(costs)
    assert shown["cost"]["cost_usd"] == usd_text(sum(costs))
    assert (shown["cost"]["input_tokens"], shown["cost"]["output_tokens"]) == (1333, 577)
    assert (shown["cost"]["cache_read_tokens"], shown["cost"]["cache_write_tokens"]) == (2000, 2000)
    assert shown["cost"]["cost_complete"] is True

    text = cli("agents", "show", str(run_id)).output
    assert f"cost: {usd_text(sum(costs))} USD" in text
    assert "tokens: 1333 in, 577 out, 2000 cache read, 2000 cache write (2 model turns)" in text

    listed = {row["id"]: row for row in json.loads(cli("agents", "list", "--json").output)}
    assert (listed[run_id]["cost_nano_usd"], listed[run_id]["cost_usd"]) == (sum(costs), usd_text(sum(costs)))
    assert listed[run_id]["input_tokens"] == 1333
    assert (listed[runs["openai"]]["cost_usd"], listed[runs["openai"]]["cost_complete"]) == ("0.000000", False)
    assert (listed[runs["offline"]]["cost_usd"], listed[runs["offline"]]["model_turns"]) == ("0.000000", 0)
    table = cli("agents", "list").output.splitlines()
    assert "cost_usd" in table[0]
    assert any(line.startswith(f"{runs['openai']} ") and "0.000000+?" in line for line in table)
