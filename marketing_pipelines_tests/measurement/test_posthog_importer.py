"""The PostHog importer: its contract, the HogQL request it sends, the answers it accepts and refuses, and its
asset and rollup rows on real databases, PostHog faked at the HTTP layer from a recorded answer's shape."""

from __future__ import annotations

import base64
import copy
import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import measurement_daily_rollup, source_daily_metric
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.assets import checked_metric_rows, left_out_importers
from marketing_pipelines.measurement.importers.base import MetricImporter, QuotaExhausted, RequestGate, hooks
from marketing_pipelines.measurement.importers.posthog import (
    COLUMNS,
    HOGQL,
    MAX_PAGES,
    PAGE_SIZE,
    QUERY_NAME,
    PostHogClient,
    shape_problems,
)
from marketing_pipelines.measurement.quota import request_gate
from marketing_pipelines.measurement.rollup.daily import replace_rollup_days
from marketing_pipelines.measurement.sources import POSTHOG, Quota, source_named
from marketing_pipelines.settings import SettingsError, load_settings
from marketing_pipelines_tests.factories import add_campaign, settings_from
from marketing_pipelines_tests.measurement.fake_services import Api, Event, FakePostHog, body
from marketing_pipelines_tests.measurement.fake_services import posthog_answer as answer
from marketing_pipelines_tests.measurement.runs import materialize_measurement
from marketing_pipelines_tests.measurement.test_importer_echoes import _failed_run, leaked

RECORDED = json.loads((Path(__file__).parent / "recorded" / "posthog" / "query_hogql.json").read_text())
API_KEY = "phx_Q8mZr2Lk5Vt7Yp1Wn4Hc6Jd9Fs3Gb0Xa"
PROJECT = "4242"
POSTHOG_KEY = dg.AssetKey(POSTHOG.asset)
FIRST, LAST = date(2026, 12, 5), date(2026, 12, 6)


def mocked_posthog(api: Api, sleeps: list[float] | None = None, **fields: Any) -> PostHogClient:
    class MockedPostHog(PostHogClient):
        def _client(self, gate: RequestGate | None = None) -> httpx.Client:
            return httpx.Client(
                base_url=self.host, timeout=self.timeout_s, event_hooks=hooks(gate), transport=api.transport()
            )

        def _sleep(self, seconds: float) -> None:
            if sleeps is not None:
                sleeps.append(seconds)

    return MockedPostHog(**{"api_key": API_KEY, "project_id": PROJECT, **fields})


# --- the contract --------------------------------------------------------------------------------------------


def test_the_importer_declares_posthogs_contract() -> None:
    assert isinstance(PostHogClient(), MetricImporter)
    assert PostHogClient.contract is POSTHOG.contract and source_named("posthog") is POSTHOG
    contract = POSTHOG.contract
    # Events are kept as long as the project's plan keeps them: no lookback the API states, nothing lost by waiting.
    assert (contract.lookback_days, contract.retention_days) == (None, None)
    # Late-ingested events land on the day they happened: yesterday is imported once more.
    assert contract.revision_days == 1
    # docs/api/queries: 2,400/h on the current limits, 120/h on the legacy ones: the lower, 3 queries at once.
    assert contract.quota == Quota(120, 3600.0, concurrency=3)
    assert [(c.metric, c.stage, c.event_type) for c in contract.counted] == [("events", "product", "posthog_event")]
    assert contract.range_only == ("persons",) and contract.match == "utm_campaign"
    assert (POSTHOG.asset, POSTHOG.resource_key, POSTHOG.settings) == (
        "posthog_daily",
        "posthog",
        ("posthog_api_key", "posthog_project_id"),
    )


# --- the request ---------------------------------------------------------------------------------------------


def test_the_recorded_answer_becomes_events_and_persons_per_day_and_campaign() -> None:
    api = Api(lambda request: httpx.Response(200, json=RECORDED))
    asked: list[httpx.Request] = []
    by_day = mocked_posthog(api).daily_metrics(FIRST, LAST, ["beta26", "alpha26"], gate=asked.append)
    assert {day: [(r.key, r.metric, r.value) for r in rows] for day, rows in by_day.items()} == {
        FIRST: [
            ("alpha26", "events", 412),
            ("alpha26", "persons", 97),
            ("beta26", "events", 38),
            ("beta26", "persons", 21),
        ],
        LAST: [("alpha26", "events", 355), ("alpha26", "persons", 88)],
    }
    [request] = api.requests
    assert asked == [request]  # the shared quota was asked before the request went
    assert (request.method, str(request.url)) == ("POST", f"https://us.posthog.com/api/projects/{PROJECT}/query/")
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    assert body(request) == {
        "query": {
            "kind": "HogQLQuery",
            "query": HOGQL % (PAGE_SIZE, 0),
            # The range is the partitions' UTC days, the end exclusive.
            "values": {
                "start": "2026-12-05 00:00:00",
                "end": "2026-12-07 00:00:00",
                "campaigns": ["alpha26", "beta26"],
            },
        },
        "refresh": "force_blocking",
        "name": QUERY_NAME,
    }


def test_days_are_utc_days_whatever_the_projects_time_zone() -> None:
    # HogQL shows timestamp in the project's time zone; the day and the bounds are asked in UTC explicitly.
    assert "toDate(toTimeZone(timestamp, 'UTC')) AS day" in HOGQL
    assert "toDateTime({start}, 'UTC')" in HOGQL and "toDateTime({end}, 'UTC')" in HOGQL


HOSTILE_KEYS = [
    "x') OR 1=1 --",
    "{start}",
    "a' UNION SELECT properties.email, 1, 1, 1 FROM persons --",
    '=HYPERLINK("https://evil.example")',
    "line\nbreak\x1b[31m",
    "多言語 🦔",
]


def test_hostile_utm_values_travel_as_values_never_in_the_query_text() -> None:
    events = [(datetime(2026, 12, 5, 10, tzinfo=UTC), key, f"p{i}") for i, key in enumerate(HOSTILE_KEYS)]
    api = Api(FakePostHog(events))
    by_day = mocked_posthog(api).daily_metrics(FIRST, LAST, HOSTILE_KEYS)
    query = body(api.requests[0])["query"]
    # The text is the same whatever the campaigns are; they are the values' list, verbatim.
    assert query["query"] == HOGQL % (PAGE_SIZE, 0)
    assert query["values"]["campaigns"] == sorted(HOSTILE_KEYS)
    # What comes back is stored as the text it is (shown neutralised where shown), one campaign key each.
    assert sorted(r.key for r in by_day[FIRST] if r.metric == "events") == sorted(HOSTILE_KEYS)


def test_a_row_for_a_campaign_not_asked_for_is_refused_before_it_is_stored() -> None:
    api = Api(lambda request: httpx.Response(200, json=answer([["2026-12-05", "stray'; DROP TABLE x", 5, 1]])))
    by_day = mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])
    with pytest.raises(ServiceError, match="a key not asked for"):
        checked_metric_rows(POSTHOG, by_day, [FIRST, LAST], ["alpha26"])


def test_pages_follow_has_more_and_each_request_asks_the_gate() -> None:
    events = [(datetime(2026, 12, 5, 1, tzinfo=UTC) + timedelta(hours=h), f"c{h % 5}", f"p{h % 3}") for h in range(40)]
    api = Api(FakePostHog(events))
    asked: list[httpx.Request] = []
    by_day = mocked_posthog(api, page_size=3).daily_metrics(FIRST, LAST, [f"c{n}" for n in range(5)], gate=asked.append)
    # 2 days x 5 campaigns = 10 rows: pages of 3 at offsets 0, 3, 6, 9.
    assert [re.search(r"OFFSET (\d+)$", body(r)["query"]["query"]).group(1) for r in api.requests] == [
        "0",
        "3",
        "6",
        "9",
    ]  # type: ignore[union-attr]
    assert asked == api.requests
    assert sum(r.value for rows in by_day.values() for r in rows if r.metric == "events") == 40


def test_an_answer_that_never_stops_saying_has_more_is_refused() -> None:
    api = Api(lambda request: httpx.Response(200, json=answer([], has_more=True)))
    with pytest.raises(ServiceError, match=f"still hasMore after {MAX_PAGES} pages"):
        mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])
    assert len(api.requests) == MAX_PAGES


def test_a_group_seen_twice_across_pages_fails_transiently() -> None:
    # Events ingested between two pages shift OFFSET's order: a row comes again. Re-running reads it anew.
    api = Api(lambda request: httpx.Response(200, json=answer([["2026-12-05", "alpha26", 3, 1]], has_more=True)))
    with pytest.raises(ServiceError, match="came twice across pages") as failed:
        mocked_posthog(api, page_size=1).daily_metrics(FIRST, LAST, ["alpha26"])
    assert failed.value.transient


def test_no_campaign_key_sends_no_request() -> None:
    api = Api(lambda request: httpx.Response(500))
    assert mocked_posthog(api).daily_metrics(FIRST, LAST, []) == {FIRST: [], LAST: []}
    assert api.requests == []


# --- answers refused -----------------------------------------------------------------------------------------


def test_the_recorded_answer_has_the_shape_the_importer_reads() -> None:
    assert shape_problems(RECORDED) == []
    assert RECORDED["columns"] == list(COLUMNS)


def _without(key: str) -> dict[str, Any]:
    payload = copy.deepcopy(RECORDED)
    del payload[key]
    return payload


MUTATED: dict[str, tuple[Any, str]] = {
    "no results": (_without("results"), "'results' is not a list"),
    "results an object": (answer({"rows": []}), "'results' is not a list"),  # type: ignore[arg-type]
    "a row of three": (answer([["2026-12-05", "alpha26", 4]]), "a row is not a list of 4 values"),
    "rows as objects": (answer([{"day": "2026-12-05"}]), "a row is not a list of 4 values"),  # type: ignore[list-item]
    "columns renamed": (answer([], columns=["day", "utm", "events", "persons"]), "columns are"),
    "hasMore a string": (answer([], has_more="yes"), "'hasMore' is not a boolean"),  # type: ignore[arg-type]
    "an error": (answer([], error="Query exceeds max execution time"), "error: Query exceeds"),
    "still running": (answer([], query_status={"id": "q1", "complete": False}), "still running"),
    "a list": ([RECORDED], "expected a JSON object"),
}


@pytest.mark.parametrize("name", MUTATED)
def test_an_answer_of_another_shape_is_refused_in_one_line(name: str) -> None:
    payload, expected = MUTATED[name]
    api = Api(lambda request: httpx.Response(200, json=payload))
    with pytest.raises(ServiceError, match=re.escape(expected)) as refused:
        mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])
    assert "\n" not in str(refused.value) and not refused.value.transient


BAD_ROWS: dict[str, tuple[list[Any], str]] = {
    "a negative count": (["2026-12-05", "alpha26", -1, 0], "events is not a count"),
    "a huge count": (["2026-12-05", "alpha26", 10**13, 1], "events is not a count"),
    "a float count": (["2026-12-05", "alpha26", 1.5, 1], "events is not a count"),
    "a boolean count": (["2026-12-05", "alpha26", 3, True], "persons is not a count"),
    "a count as text": (["2026-12-05", "alpha26", "12", 1], "events is not a count"),
    "nested values": (["2026-12-05", ["alpha26"], 3, 1], "campaign is not text"),
    "a day outside the range": (["2026-12-09", "alpha26", 3, 1], "day is not one of 2026-12-05..2026-12-06"),
    "a day that is no date": (["yesterday", "alpha26", 3, 1], "day is not one of"),
    "more persons than events": (["2026-12-05", "alpha26", 3, 4], "4 persons in 3 events"),
}


@pytest.mark.parametrize("name", BAD_ROWS)
def test_a_row_of_wrong_values_is_refused(name: str) -> None:
    row, expected = BAD_ROWS[name]
    api = Api(lambda request: httpx.Response(200, json=answer([row])))
    with pytest.raises(ServiceError, match=re.escape(expected)):
        mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])


def test_non_finite_numbers_are_no_counts() -> None:
    text = json.dumps(answer([["2026-12-05", "alpha26", 3, 1]])).replace('"alpha26", 3, 1', '"alpha26", NaN, 1')
    api = Api(lambda request: httpx.Response(200, text=text, headers={"content-type": "application/json"}))
    with pytest.raises(ServiceError, match="events is not a count"):
        mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])


def drf_error(status: int, kind: str, code: str, detail: str, **headers: str) -> httpx.Response:
    """PostHog's error body (Django REST framework's exception handler, posthog/exceptions.py)."""
    return httpx.Response(status, json={"type": kind, "code": code, "detail": detail, "attr": None}, headers=headers)


ERRORS: dict[str, tuple[Callable[[httpx.Request], httpx.Response], str]] = {
    "401 echoing the key": (
        lambda r: drf_error(401, "authentication_error", "authentication_failed", f"Invalid key {API_KEY}"),
        "credentials rejected (HTTP 401)",
    ),
    "403 without the scope": (
        lambda r: drf_error(
            403, "authentication_error", "permission_denied", "API key missing required scope 'query:read'"
        ),
        "check POSTHOG_API_KEY (a personal API key with the Query Read scope on POSTHOG_PROJECT_ID)",
    ),
    "404 another region's project": (
        lambda r: drf_error(404, "invalid_request", "not_found", "Not found."),
        "project not found (HTTP 404): check POSTHOG_PROJECT_ID and POSTHOG_HOST",
    ),
    "400 a rejected query": (
        lambda r: drf_error(400, "validation_error", "query_error", "Unable to resolve field: utm_campaign"),
        "query rejected (HTTP 400): Unable to resolve field: utm_campaign",
    ),
    "an HTML page": (
        lambda r: httpx.Response(200, text="<html>Bad gateway</html>"),
        "response was not valid JSON",
    ),
    "418": (lambda r: httpx.Response(418, text="teapot"), "HTTP 418 from https://us.posthog.com/"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_an_error_answer_fails_in_one_line_without_the_key(name: str) -> None:
    handler, expected = ERRORS[name]
    api = Api(handler)
    with pytest.raises(ServiceError) as failed:
        mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])
    message = str(failed.value)
    assert expected in message and "\n" not in message
    assert API_KEY not in message and API_KEY[4:16] not in message
    assert len(api.requests) == 1 and not failed.value.transient


def test_a_429_waits_as_retry_after_says_then_succeeds() -> None:
    answers = iter([drf_error(429, "throttled_error", "throttled", "Request was throttled.", **{"Retry-After": "7"})])
    api = Api(lambda request: next(answers, httpx.Response(200, json=RECORDED)))
    sleeps: list[float] = []
    asked: list[httpx.Request] = []
    mocked_posthog(api, sleeps).daily_metrics(FIRST, LAST, ["alpha26", "beta26"], gate=asked.append)
    assert sleeps == [7.0] and len(api.requests) == 2
    assert len(asked) == 2  # the retry was asked of the shared quota too


def test_a_429_asking_for_longer_than_a_step_waits_raises_rate_limited_at_once() -> None:
    api = Api(
        lambda r: drf_error(429, "throttled_error", "throttled", "Expected in 1800 s.", **{"Retry-After": "1800"})
    )
    sleeps: list[float] = []
    with pytest.raises(RateLimited) as limited:
        mocked_posthog(api, sleeps).daily_metrics(FIRST, LAST, ["alpha26"])
    assert limited.value.retry_after_s == 1800 and sleeps == [] and len(api.requests) == 1


def test_a_429_without_retry_after_waits_a_minute_in_dagster() -> None:
    api = Api(lambda r: httpx.Response(429, json={"detail": "throttled"}))
    with pytest.raises(RateLimited) as limited:
        mocked_posthog(api).daily_metrics(FIRST, LAST, ["alpha26"])
    assert limited.value.retry_after_s == 60


def test_a_5xx_is_retried_with_backoff() -> None:
    answers = iter([httpx.Response(502, text="bad gateway"), httpx.Response(504, text="timeout")])
    api = Api(lambda request: next(answers, httpx.Response(200, json=RECORDED)))
    sleeps: list[float] = []
    mocked_posthog(api, sleeps).daily_metrics(FIRST, LAST, ["alpha26", "beta26"])
    assert len(api.requests) == 3 and len(sleeps) == 2


def test_a_spent_shared_quota_sends_nothing(engine: sa.Engine) -> None:
    api = Api(lambda request: httpx.Response(200, json=RECORDED))
    gate = request_gate(engine, POSTHOG, max_wait_s=0.1)
    client = mocked_posthog(api)
    for _ in range(int(POSTHOG.contract.quota.burst)):
        client.daily_metrics(FIRST, LAST, ["alpha26", "beta26"], gate=gate)
    with pytest.raises(QuotaExhausted):
        client.daily_metrics(FIRST, LAST, ["alpha26", "beta26"], gate=gate)
    assert len(api.requests) == POSTHOG.contract.quota.burst == 12


# --- settings and definitions --------------------------------------------------------------------------------


def test_unconfigured_posthog_is_left_out_naming_what_to_set() -> None:
    assert PostHogClient(project_id="1").not_configured_reason() == "set POSTHOG_API_KEY"
    assert left_out_importers(settings_from({}))[POSTHOG_KEY] == "set POSTHOG_API_KEY and POSTHOG_PROJECT_ID"
    assert left_out_importers(settings_from({"POSTHOG_API_KEY": "phx_k"}))[POSTHOG_KEY] == "set POSTHOG_PROJECT_ID"
    configured = settings_from({"POSTHOG_API_KEY": "phx_k", "POSTHOG_PROJECT_ID": "4242"})
    assert POSTHOG_KEY not in left_out_importers(configured)
    graph = build_defs(configured).resolve_asset_graph()
    assert POSTHOG_KEY in graph.get_all_asset_keys()
    assert POSTHOG_KEY not in build_defs(settings_from({})).resolve_asset_graph().get_all_asset_keys()


def test_the_host_defaults_to_us_cloud_and_takes_eu_or_a_self_hosted_origin() -> None:
    assert load_settings().posthog_host == "https://us.posthog.com"
    assert settings_from({"POSTHOG_HOST": "https://eu.posthog.com"}).posthog_host == "https://eu.posthog.com"
    assert (
        settings_from({"POSTHOG_HOST": "http://posthog.internal:8000"}).posthog_host == "http://posthog.internal:8000"
    )
    for bad in ("eu.posthog.com", "ftp://eu.posthog.com", "https://user:pass@eu.posthog.com"):
        with pytest.raises(SettingsError) as refused:
            load_settings(posthog_host=bad)
        assert str(refused.value).startswith("POSTHOG_HOST=(a secret, not shown) is not valid")
        assert bad not in str(refused.value)


def test_the_project_id_is_a_number() -> None:
    assert load_settings(posthog_project_id=" 4242 ").posthog_project_id == "4242"
    for bad in ("../../users", "42/query", "@current", "\uff14\uff12"):
        with pytest.raises(SettingsError, match=r"POSTHOG_PROJECT_ID=.* is not valid: must be the project's number"):
            load_settings(posthog_project_id=bad)
    api = Api(lambda request: httpx.Response(200, json=RECORDED))
    with pytest.raises(ServiceError, match="POSTHOG_PROJECT_ID must be the project's number"):
        mocked_posthog(api, project_id="1/../2").daily_metrics(FIRST, LAST, ["alpha26"])
    assert api.requests == []


# --- through Dagster, on SQLite and PostgreSQL -----------------------------------------------------------------


def recount(events: Sequence[Event], days: Sequence[date], keys: dict[str, str]) -> dict[tuple[date, str], int]:
    """Events per UTC day and campaign (``keys``: utm value -> what to count it under), from the events themselves."""
    counts: Counter[tuple[date, str]] = Counter()
    for at, utm, _person in events:
        if at.date() in days and utm in keys:
            counts[(at.date(), keys[utm])] += 1
    return dict(counts)


def stored(engine: sa.Engine, metric: str) -> dict[tuple[date, str], int]:
    m = source_daily_metric
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(m.c.day, m.c.key, m.c.value).where(m.c.source == "posthog", m.c.metric == metric)
        ).all()
    return {(row.day, row.key): row.value for row in rows}


def rollup_counts(engine: sa.Engine) -> dict[tuple[date, str], int]:
    r = measurement_daily_rollup
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(r.c.day, r.c.campaign_id, r.c.stage, r.c.event_type, r.c.raw_count, r.c.unique_actors).where(
                r.c.source == "posthog"
            )
        ).all()
    assert {(row.stage, row.event_type, row.unique_actors) for row in rows} <= {("product", "posthog_event", None)}
    return {(row.day, row.campaign_id): row.raw_count for row in rows}


DAYS = [date(2026, 11, 24) + timedelta(days=n) for n in range(3)]
START = datetime.combine(DAYS[0], datetime.min.time(), tzinfo=UTC)
# Every 37 minutes from a day before the range to a day after it, utm values cycling (two campaigns, a stray value,
# none), 7 persons.
EVENTS: list[Event] = [
    (START - timedelta(days=1) + timedelta(minutes=37 * n), ("alpha26", "beta26", "stray", None)[n % 4], f"p{n % 7}")
    for n in range(5 * 24 * 60 // 37)
]
UTM = {"alpha26": "alpha26", "beta26": "beta26"}


def test_posthog_days_are_imported_per_campaign_and_a_rerun_replaces(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    add_campaign(engine, "beta", utm_campaign="beta26")
    fake = FakePostHog(EVENTS)
    api = Api(fake)
    result = materialize_measurement([POSTHOG_KEY], db_url, DAYS, posthog=mocked_posthog(api))
    assert result.success and len(api.requests) == 1  # the three days in one query
    expected = recount(EVENTS, DAYS, UTM)
    assert stored(engine, "events") == expected and len(expected) == 6
    people: dict[tuple[date, str], set[str]] = defaultdict(set)
    for at, utm, person in EVENTS:
        if at.date() in DAYS and utm in UTM:
            people[(at.date(), utm)].add(person)
    assert stored(engine, "persons") == {group: len(persons) for group, persons in people.items()}
    [event] = [e for e in result.get_asset_materialization_events() if e.partition == DAYS[0].isoformat()]
    metadata = {k: getattr(v, "value", v) for k, v in event.materialization.metadata.items()}
    day_events = expected[(DAYS[0], "alpha26")] + expected[(DAYS[0], "beta26")]
    assert {"rows": 4, "keys": 2, "events": day_events}.items() <= metadata.items()

    # Late-ingested events for the first day: the re-import replaces its numbers, it never adds to them.
    fake.events += [(START + timedelta(hours=23, minutes=59), "alpha26", "late") for _ in range(5)]
    assert materialize_measurement([POSTHOG_KEY], db_url, DAYS, posthog=mocked_posthog(api)).success
    assert stored(engine, "events") == recount(fake.events, DAYS, UTM)
    assert stored(engine, "events")[(DAYS[0], "alpha26")] == expected[(DAYS[0], "alpha26")] + 5


def test_posthog_events_roll_up_per_campaign(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    add_campaign(engine, "beta", utm_campaign="beta26")
    api = Api(FakePostHog(EVENTS))
    assert materialize_measurement([POSTHOG_KEY], db_url, DAYS, posthog=mocked_posthog(api)).success
    # The rollup's own SQL, as its asset runs it (without the asset's retries of a database error).
    replace_rollup_days(engine, DAYS)
    assert rollup_counts(engine) == recount(EVENTS, DAYS, {"alpha26": "alpha", "beta26": "beta"})


@pytest.mark.slow
def test_a_throttled_step_is_handed_back_to_dagster(db_url: str, engine: sa.Engine) -> None:
    # A Retry-After past the 30 s a step sleeps: the step is handed back and Dagster runs it again after the wait.
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    limited = iter([drf_error(429, "throttled_error", "throttled", "slow down", **{"Retry-After": "31"})])
    api = Api(lambda request: next(limited, httpx.Response(200, json=answer([]))))
    result = materialize_measurement([POSTHOG_KEY], db_url, [date(2026, 11, 24)], posthog=mocked_posthog(api))
    retries = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert result.success and len(retries) == 1 and len(api.requests) == 2


# --- a year's backfill within the quota ------------------------------------------------------------------------


class QuotaEnforcingPostHog(FakePostHog):
    """Answers 429 past the quota's requests in any hour, as PostHog's throttle would."""

    def __init__(self, events: Sequence[Event], quota: Quota) -> None:
        super().__init__(events)
        self.quota, self.sent, self.throttled = quota, 0, 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.sent += 1
        if self.sent > self.quota.requests:
            self.throttled += 1
            return drf_error(429, "throttled_error", "throttled", "Request was throttled.", **{"Retry-After": "3600"})
        return super().__call__(request)


@pytest.mark.parametrize(("campaigns", "requests"), [(20, 1), (30, 2)])
def test_a_year_of_days_costs_one_request_per_page(engine: sa.Engine, campaigns: int, requests: int) -> None:
    keys = [f"campaign-{n:02d}" for n in range(campaigns)]
    first = date(2025, 12, 1)
    # One event per campaign and day: 365 x campaigns rows, pages of 10,000.
    events: list[Event] = [
        (datetime.combine(first + timedelta(days=d), datetime.min.time(), tzinfo=UTC) + timedelta(hours=12), key, "p")
        for d in range(365)
        for key in keys
    ]
    fake = QuotaEnforcingPostHog(events, POSTHOG.contract.quota)
    api = Api(fake)
    by_day = mocked_posthog(api).daily_metrics(
        first, first + timedelta(days=364), keys, gate=request_gate(engine, POSTHOG)
    )
    assert len(api.requests) == requests and fake.throttled == 0
    assert sum(len(rows) for rows in by_day.values()) == 2 * 365 * campaigns


# --- the key on no surface -------------------------------------------------------------------------------------

POSTHOG_ECHOES: dict[str, Callable[[httpx.Request], httpx.Response]] = {
    "401 quoting the key": lambda r: drf_error(401, "authentication_error", "authentication_failed", f"bad {API_KEY}"),
    "400 quoting the key as base64": lambda r: drf_error(
        400, "validation_error", "query_error", base64.b64encode(API_KEY.encode()).decode()
    ),
    "404 quoting the key cut": lambda r: drf_error(404, "invalid_request", "not_found", API_KEY[:-5]),
    "a row whose campaign is the key": lambda r: httpx.Response(200, json=answer([["2026-11-26", API_KEY, 1, 1]])),
    "an error field quoting the key": lambda r: httpx.Response(200, json=answer([], error=f"key {API_KEY} failed")),
}


@pytest.mark.parametrize("shape", POSTHOG_ECHOES)
def test_a_posthog_echo_of_its_key_lands_on_no_surface(
    shape: str, engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    api = Api(POSTHOG_ECHOES[shape])
    client = mocked_posthog(api)
    failure, surfaces = _failed_run(tmp_path, engine, db_url, capfd, POSTHOG_KEY, date(2026, 11, 26), posthog=client)
    assert api.requests and "posthog" in failure
    assert leaked(surfaces, API_KEY) == []
