"""Each importer declares its source's contract (sources.py), and the assets, checks and schedule read it: lookback,
revisions, the shared request quota and retention."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db import token_bucket
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import EVERY_MODEL, site_analytics_daily
from marketing_pipelines.definitions import build_defs as build_full_defs
from marketing_pipelines.http import ServiceError
from marketing_pipelines.measurement.assets import checked_metric_rows
from marketing_pipelines.measurement.freshness import build_freshness_sensor
from marketing_pipelines.measurement.importers.base import Importer, MetricRow, QuotaExhausted
from marketing_pipelines.measurement.importers.ga4 import GA4Client
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.measurement.keys import SITE_KEY
from marketing_pipelines.measurement.quota import ensure_quota, request_gate
from marketing_pipelines.measurement.retention import WITHIN_RETENTION, retention_fields
from marketing_pipelines.measurement.schedules import build_measurement_daily_schedule, revision_requests
from marketing_pipelines.measurement.sources import (
    GA4,
    GITHUB_RELEASES,
    SITE_ANALYTICS,
    SOURCES,
    Quota,
    SourceContract,
    source_named,
)
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.factories import settings_from
from marketing_pipelines_tests.measurement.fake_services import Api, mocked_plausible
from marketing_pipelines_tests.measurement.runs import materialize_measurement

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
TODAY = NOW.date()


@pytest.mark.parametrize(
    ("client", "source"),
    [(PlausibleClient, SITE_ANALYTICS), (GitHubReleasesClient, GITHUB_RELEASES), (GA4Client, GA4)],
)
def test_every_importer_declares_its_sources_contract(client: type[Importer], source: object) -> None:
    assert isinstance(client(), Importer)
    assert client.contract is source.contract  # type: ignore[attr-defined]
    assert source_named(source.name) is source  # type: ignore[attr-defined]
    # Running totals are stored as daily deltas; counts that add up and uniques that do not are named apart.
    for s in SOURCES:
        assert not set(s.contract.summable) & set(s.contract.range_only), s.name
    assert GITHUB_RELEASES.contract.count_kind == "cumulative"
    assert SITE_ANALYTICS.contract.range_only == ("visitors",)


@pytest.mark.parametrize(("requests", "period_s"), [(600, 3600.0), (5000, 3600.0), (2, 60.0), (7, 1.0)])
def test_a_quota_bucket_admits_at_most_the_quota_in_any_period(requests: int, period_s: float) -> None:
    quota = Quota(requests, period_s)
    # A bucket of capacity C refilled at R per period admits at most C + R in any window of one period.
    admitted_in_a_period = quota.burst + quota.per_minute * period_s / 60
    assert admitted_in_a_period == pytest.approx(requests)
    assert quota.burst >= 1 and quota.per_minute > 0


def test_a_quota_of_fewer_than_two_requests_is_refused() -> None:
    with pytest.raises(ValueError, match="at least two requests"):
        Quota(1, 60.0)


def tiny(source_quota: Quota) -> object:
    return replace(SITE_ANALYTICS, contract=replace(SITE_ANALYTICS.contract, quota=source_quota))


def test_the_gate_spends_the_shared_quota_and_refuses_unsent_when_it_is_empty(engine: sa.Engine) -> None:
    source = tiny(Quota(30, 3600.0))  # burst 3, then one request every 133 s
    api = Api(lambda request: httpx.Response(200, json={"results": [], "meta": {}, "query": {}}))
    client = mocked_plausible(api)
    gate = request_gate(engine, source, max_wait_s=0.5)  # type: ignore[arg-type]
    for _ in range(3):
        client.campaign_stats(TODAY, TODAY, gate=gate)
    with pytest.raises(QuotaExhausted) as refused:
        client.campaign_stats(TODAY, TODAY, gate=gate)
    assert len(api.requests) == 3  # the fourth was never sent
    assert 100 < refused.value.retry_after_s <= 134
    assert "source:site_analytics's shared request quota (30 per 3600 s)" in str(refused.value)
    # Another replica's gate reads the same row: it is empty for it too.
    other = request_gate(engine, source, max_wait_s=0.1)  # type: ignore[arg-type]
    with pytest.raises(QuotaExhausted):
        other(httpx.Request("POST", "https://plausible.io/api/v2/query"))


def test_an_operators_resize_of_a_source_bucket_is_kept(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        token_bucket.configure_limit(conn, SITE_ANALYTICS.quota_bucket, EVERY_MODEL, "requests", 2.0, burst=5)
    ensure_quota(engine, SITE_ANALYTICS)
    with engine.connect() as conn:
        bucket = token_bucket.get_bucket(conn, SITE_ANALYTICS.quota_bucket)
    assert bucket is not None and (bucket.capacity, bucket.per_minute) == (5, pytest.approx(2.0))


@pytest.mark.slow
def test_a_spent_quota_hands_the_step_back_to_dagster_instead_of_failing_it(engine: sa.Engine, db_url: str) -> None:
    # An operator's bucket of one request, refilled a little under twice a minute: the next request is due in
    # about 32 s, past the 30 s a step waits in-process, so the step is handed back and Dagster re-runs it.
    with engine.begin() as conn:
        token_bucket.configure_limit(conn, SITE_ANALYTICS.quota_bucket, EVERY_MODEL, "requests", 1.9, burst=1)
    api = Api(lambda request: httpx.Response(200, json={"results": [], "meta": {}, "query": {}}))
    day = TODAY - timedelta(days=3)
    assert materialize_measurement([SITE_KEY], db_url, [day], plausible=mocked_plausible(api)).success
    second = materialize_measurement([SITE_KEY], db_url, [day], plausible=mocked_plausible(api))
    retries = [e for e in second.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert len(retries) == 1 and second.success
    # The retried attempt sent the run's one request; the refused one sent nothing.
    assert len(api.requests) == 2


class ShortLookback(PlausibleClient):
    """Plausible as if it kept 14 days, as GitHub traffic does."""

    contract: ClassVar[SourceContract] = replace(SITE_ANALYTICS.contract, lookback_days=14)


def test_a_day_older_than_the_lookback_is_refused_unrequested_and_its_rows_stay(engine: sa.Engine, db_url: str) -> None:
    old = datetime.now(UTC).date() - timedelta(days=20)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(site_analytics_daily).values(
                day=old, utm_campaign="alpha26", page="/", visitors=3, pageviews=4, fetched_at=NOW
            )
        )
    api = Api(lambda request: httpx.Response(200, json={"results": [], "meta": {}, "query": {}}))

    class Mocked(ShortLookback):
        def _client(self, gate: object = None) -> httpx.Client:
            return httpx.Client(base_url=self.base_url, transport=api.transport())

    result = materialize_measurement(
        [SITE_KEY], db_url, [old], plausible=Mocked(api_key="k", site_id="example.com"), raise_on_error=False
    )
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.step_failure_data.user_failure_data.description  # type: ignore[union-attr]
    assert "can be read only 14 days back" in message and old.isoformat() in message
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert api.requests == []
    with engine.connect() as conn:
        assert conn.execute(sa.select(site_analytics_daily.c.pageviews)).scalars().all() == [4]


def forgetting(days: int) -> object:
    return replace(SITE_ANALYTICS, contract=replace(SITE_ANALYTICS.contract, retention_days=days))


def keys(*days: date) -> set[str]:
    return {d.isoformat() for d in days}


def test_retention_passes_while_every_due_day_was_imported() -> None:
    source = forgetting(14)
    done = keys(*(TODAY - timedelta(days=n) for n in range(1, 15)))
    fields = retention_fields(source, done, NOW, date(2026, 1, 1))  # type: ignore[arg-type]
    assert fields["passed"] and fields["check_name"] == WITHIN_RETENTION


def test_a_source_that_stops_answering_is_flagged_before_its_days_are_lost() -> None:
    source = forgetting(14)
    # Imported up to five days ago; nothing since (the source stopped answering four days ago).
    done = keys(*(TODAY - timedelta(days=n) for n in range(5, 15)))
    fields = retention_fields(source, done, NOW, date(2026, 1, 1))  # type: ignore[arg-type]
    assert not fields["passed"] and fields["severity"] == dg.AssetCheckSeverity.WARN
    oldest = TODAY - timedelta(days=4)
    # Yesterday ended 9 h ago, within its grace (a day); the three before it are overdue.
    assert fields["metadata"]["days_overdue"].value == 3
    assert fields["metadata"]["oldest_overdue_day"].value == oldest.isoformat()
    # 2026-12-03 ended 2026-12-04 00:00; kept 14 days after: lost 2026-12-18 00:00, 255 h after NOW.
    assert fields["metadata"]["hours_left"].value == 255.0
    assert f"{oldest} is lost in about 255 h" in fields["description"]


def test_a_one_day_retention_warns_half_a_day_after_the_day_ends() -> None:
    yesterday = TODAY - timedelta(days=1)
    source = forgetting(1)
    early = retention_fields(source, set(), datetime(2026, 12, 7, 11, 0, tzinfo=UTC), date(2026, 1, 1))  # type: ignore[arg-type]
    late = retention_fields(source, set(), datetime(2026, 12, 7, 13, 0, tzinfo=UTC), date(2026, 1, 1))  # type: ignore[arg-type]
    assert early["passed"] and not late["passed"]
    assert late["metadata"]["oldest_overdue_day"].value == yesterday.isoformat()
    assert late["metadata"]["hours_left"].value == 11.0


def test_days_before_the_partitions_are_not_asked_for() -> None:
    fields = retention_fields(forgetting(14), set(), NOW, TODAY - timedelta(days=2))  # type: ignore[arg-type]
    assert fields["metadata"]["days_overdue"].value == 1  # the day before yesterday; yesterday is within grace


def revising(days: int) -> object:
    return replace(SITE_ANALYTICS, contract=replace(SITE_ANALYTICS.contract, revision_days=days))


def test_the_daily_schedule_imports_again_the_days_a_source_may_still_revise() -> None:
    schedule = build_measurement_daily_schedule(load_settings(), [revising(2), GITHUB_RELEASES])  # type: ignore[list-item]
    context = dg.build_schedule_context(scheduled_execution_time=datetime(2026, 11, 27, 0, 15, tzinfo=UTC))
    requests = schedule(context)
    assert [(r.partition_key, r.run_key) for r in requests] == [  # type: ignore[union-attr]
        ("2026-11-26", "measurement-daily:2026-11-26"),
        ("2026-11-25", "measurement-revision:2026-11-25:2026-11-26"),
        ("2026-11-24", "measurement-revision:2026-11-24:2026-11-26"),
    ]
    # A revised day imports only the revising source again; its rollup follows by automation.
    assert requests[1].asset_selection == [SITE_KEY]  # type: ignore[index]
    assert requests[1].tags["marketing/revision_of"] == "site_analytics"  # type: ignore[index]


def test_no_revision_is_asked_for_a_day_before_the_partitions() -> None:
    assert revision_requests(date(2026, 1, 2), [revising(3)], date(2026, 1, 1)) == [  # type: ignore[list-item]
        *revision_requests(date(2026, 1, 2), [revising(1)], date(2026, 1, 1))  # type: ignore[list-item]
    ]
    assert len(revision_requests(date(2026, 1, 2), [revising(3)], date(2026, 1, 1))) == 1  # type: ignore[list-item]


ON_CONTRACT = replace(SITE_ANALYTICS, name="example", table="source_daily_metric")
D1, D2 = date(2026, 11, 24), date(2026, 11, 25)


def row(day: date = D1, key: str = "spring26", metric: str = "pageviews", value: object = 5) -> MetricRow:
    return MetricRow(day=day, key=key, metric=metric, value=value)  # type: ignore[arg-type]


def test_a_sources_answer_is_kept_when_it_holds_exactly_the_asked_days_keys_and_metrics() -> None:
    answer = {D1: [row(), row(metric="visitors", value=3)], D2: []}
    assert checked_metric_rows(ON_CONTRACT, answer, [D1, D2], ["spring26"]) == answer


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({D1: [row()]}, "answered days 2026-11-24, not 2026-11-24..2026-11-25"),
        ({D1: [row(day=D2)], D2: []}, "a row of another day"),
        ({D1: [row(key="someone-elses")], D2: []}, "a row of a key not asked for"),
        ({D1: [row(metric="revenue")], D2: []}, "a row of a metric not in its contract"),
        ({D1: [row(value=-1)], D2: []}, "a row of a count out of range"),
        ({D1: [row(value=10**13)], D2: []}, "a row of a count out of range"),
        ({D1: [row(value=1.5)], D2: []}, "a row of a count out of range"),
        ({D1: [row(value=float("nan"))], D2: []}, "a row of a count out of range"),
        ({D1: [row(value=True)], D2: []}, "a row of a count out of range"),
    ],
)
def test_an_answer_with_a_row_of_another_day_key_or_metric_or_a_wild_count_is_refused_whole(
    answer: dict[date, list[MetricRow]], problem: str
) -> None:
    with pytest.raises(ServiceError) as refused:
        checked_metric_rows(ON_CONTRACT, answer, [D1, D2], ["spring26"])
    assert problem in str(refused.value) and "\n" not in str(refused.value)
    assert not refused.value.transient


def test_a_hostile_key_in_a_refusal_is_shown_inert() -> None:
    with pytest.raises(ServiceError) as refused:
        checked_metric_rows(ON_CONTRACT, {D1: [row(key="=HYPERLINK(\x1b[31m\u202e")], D2: []}, [D1, D2], ["a"])
    assert "\x1b" not in str(refused.value) and "\u202e" not in str(refused.value)


def test_the_freshness_sensor_records_within_retention_from_the_instances_materializations(db_url: str) -> None:
    source = forgetting(14)
    sensor = build_freshness_sensor(load_settings(), name="retention_probe", retention_sources=[source])  # type: ignore[list-item]
    today = datetime.now(UTC).date()
    with dg.instance_for_test() as instance:
        # Imported for a while, then nothing for the last four days: the source stopped answering.
        for n in range(5, 15):
            instance.report_runless_asset_event(
                dg.AssetMaterialization(SITE_KEY, partition=(today - timedelta(days=n)).isoformat())
            )
        result = sensor(dg.build_sensor_context(instance=instance, resources={"app_db": AppDatabase(url=db_url)}))
    assert isinstance(result, dg.SensorResult) and not result.run_requests
    [_, retention] = result.asset_events
    assert isinstance(retention, dg.AssetCheckEvaluation)
    assert retention.asset_check_key == dg.AssetCheckKey(SITE_KEY, WITHIN_RETENTION)
    assert (retention.passed, retention.severity) == (False, dg.AssetCheckSeverity.WARN)
    # The three days before yesterday are overdue; yesterday ended today, within its day of grace.
    assert retention.metadata["oldest_overdue_day"].value == (today - timedelta(days=4)).isoformat()
    assert retention.metadata["days_overdue"].value == 3


def test_within_retention_loads_and_executes_as_from_the_ui(db_url: str) -> None:
    # Built only for a configured source that forgets days (GitHub releases): the default definitions lack it.
    settings = settings_from({"GITHUB_TOKEN": "ghp_test"}).model_copy(update={"database_url": db_url})
    defs = build_full_defs(settings)
    key = dg.AssetCheckKey(dg.AssetKey(GITHUB_RELEASES.asset), WITHIN_RETENTION)
    check_only = dg.define_asset_job("check_only", selection=dg.AssetSelection.checks(key))
    runnable = dg.Definitions.merge(defs, dg.Definitions(jobs=[check_only]))
    with dg.instance_for_test() as instance:
        result = runnable.resolve_job_def("check_only").execute_in_process(instance=instance, raise_on_error=False)
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.asset_check_key == key
    # Nothing was ever imported: yesterday is within its half-day grace or already overdue, by the hour.
    assert evaluation.metadata["retention_days"].value == 1


def test_the_docs_name_every_source_where_readers_look_for_it() -> None:
    # OPERATIONS' table of the sources' contracts has a row per source, ANALYSTS' `source` column names each value.
    from marketing_pipelines.measurement.sources import SOURCES

    root = Path(__file__).resolve().parents[2] / "docs"
    operations = (root / "OPERATIONS.md").read_text()
    table = operations[operations.index("### The sources' contracts") :].split("\n\n")[1]
    rows = [line.split("|")[1].strip() for line in table.splitlines()[2:]]
    assert sorted(row.split()[0].strip("`") for row in rows) == sorted(s.name for s in SOURCES)
    [source_row] = [line for line in (root / "ANALYSTS.md").read_text().splitlines() if line.startswith("| `source` |")]
    assert [s.name for s in SOURCES if f"`{s.name}`" not in source_row] == []
