"""The rollup follows its importers by declarative automation (assets.ROLLUP_AUTOMATION): a day of an importer
materialized without its rollup (a revised day, a re-run partition) brings that day's rollup up to date, and
nothing else does. Evaluated on a real instance with Dagster's own evaluator, the one its sensor runs."""

from __future__ import annotations

from dataclasses import replace
from datetime import date

import dagster as dg
import httpx
import sqlalchemy as sa
from dagster._core.definitions.asset_daemon_cursor import AssetDaemonCursor

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.db.schema import measurement_daily_rollup
from marketing_pipelines.measurement.assets import MARKETING_EVENT_KEY, ROLLUP_IO_MANAGER
from marketing_pipelines.measurement.defs import measurement_automation_sensor
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.keys import ROLLUP_KEY, SITE_KEY
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines.measurement.schedules import revision_requests
from marketing_pipelines.measurement.sources import SITE_ANALYTICS
from marketing_pipelines_tests.built import DEFS, measurement_assets, unconfigured_importers
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.fake_services import Api, mocked_plausible
from marketing_pipelines_tests.measurement.runs import materialize_measurement

DAY = date(2026, 11, 24)


def answer(pageviews: int) -> httpx.Response:
    row = {"dimensions": [DAY.isoformat(), "spring26", "/"], "metrics": [pageviews, pageviews]}
    return httpx.Response(200, json={"results": [row], "meta": {}, "query": {}})


def requested(result: dg.EvaluateAutomationConditionsResult) -> set[str]:
    return set(result.get_requested_partitions(ROLLUP_KEY)) if result.total_requested else set()


def test_a_day_imported_without_its_rollup_brings_that_day_up_to_date_and_nothing_else_does(
    engine: sa.Engine, db_url: str
) -> None:
    add_campaign(engine, "spring", utm_campaign="spring26")
    pageviews = [40]
    api = Api(lambda request: answer(pageviews[0]))
    plausible = mocked_plausible(api)
    defs = dg.Definitions(
        assets=measurement_assets,
        resources={
            "app_db": AppDatabase(url=db_url),
            **unconfigured_importers(),
            "plausible": plausible,
            "github": GitHubReleasesClient(),
            ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url),
        },
    )

    def evaluate(cursor: AssetDaemonCursor | None = None) -> dg.EvaluateAutomationConditionsResult:
        return dg.evaluate_automation_conditions(defs, instance, cursor=cursor)

    with dg.instance_for_test() as instance:
        first = evaluate()
        assert requested(first) == set()
        # The daily job: the import and the rollup in one run. The rollup is not asked for again.
        materialize_measurement([SITE_KEY, ROLLUP_KEY], db_url, [DAY], instance, plausible=plausible)
        after_daily = evaluate(first.cursor)
        assert requested(after_daily) == set()
        # Plausible revised the day; the revision run imports only. The day's rollup is now stale: asked for.
        pageviews[0] = 55
        materialize_measurement([SITE_KEY], db_url, [DAY], instance, plausible=plausible)
        after_revision = evaluate(after_daily.cursor)
        assert requested(after_revision) == {DAY.isoformat()}
        # Its run (as the sensor launches it) rebuilds the day: the rollup holds the revised count, and
        # the next evaluation asks for nothing.
        materialize_measurement([ROLLUP_KEY], db_url, [DAY], instance)
        with engine.connect() as conn:
            assert conn.execute(sa.select(measurement_daily_rollup.c.raw_count)).scalars().all() == [55]
        settled = evaluate(after_revision.cursor)
        assert requested(settled) == set()
        # An observation of the raw events table (every late-events tick records one) asks for no day.
        instance.report_runless_asset_event(dg.AssetObservation(MARKETING_EVENT_KEY, metadata={"n": 1}))
        observed = evaluate(settled.cursor)
        assert requested(observed) == set()


def test_revision_runs_import_only_and_the_sensor_targets_the_rollup() -> None:
    revising = replace(SITE_ANALYTICS, contract=replace(SITE_ANALYTICS.contract, revision_days=1))
    [request] = revision_requests(date(2026, 11, 26), [revising], date(2026, 1, 1))
    assert request.asset_selection == [SITE_KEY]
    sensor = DEFS.resolve_sensor_def("measurement_automation_sensor")
    assert sensor is measurement_automation_sensor
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    assert sensor.asset_selection.resolve(DEFS.resolve_asset_graph()) == {ROLLUP_KEY}  # type: ignore[union-attr]
