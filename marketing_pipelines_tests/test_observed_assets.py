"""The tables Dagster only watches (the two queues, the raw events) are observable source assets, and the sensors
that watch them record observations: the UI's lineage view then counts them as observed, not among the assets
that "have never been materialized" (it counts an external asset without materializations there).

The UI's rule (asset-graph/AssetNodeStatusContent.tsx, Dagster 1.13.27): an asset whose definition
``isObservable`` with a ``lastObservation`` is SOURCE_OBSERVED (successful); an external asset that is not
observable and has no materialization is SOURCE_NO_STATE, which the group summary counts as missing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.assets import MARKETING_EVENT_KEY, observe_marketing_event
from marketing_pipelines.measurement.events.validate import EventRow
from marketing_pipelines.measurement.events.write import store_events
from marketing_pipelines.measurement.sensors import build_late_events_sensor
from marketing_pipelines.monitoring.assets import AGENT_RUN_QUEUE, EXECUTION_QUEUE, observe_queues
from marketing_pipelines_tests.built import DEFAULTS, DEFS
from marketing_pipelines_tests.factories import add_campaign

WATCHED = [EXECUTION_QUEUE, AGENT_RUN_QUEUE, MARKETING_EVENT_KEY]


def test_every_watched_table_is_observable_and_every_other_asset_is_materialized() -> None:
    graph = DEFS.resolve_asset_graph()
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        # Each asset is either observed or materialized: none is left as an external asset with no state.
        assert (node.is_observable, node.is_materializable) == ((True, False) if key in WATCHED else (False, True))


def test_observing_from_the_ui_reads_the_tables(engine: sa.Engine, db_url: str, instance: dg.DagsterInstance) -> None:
    add_campaign(engine, "alpha")
    now = datetime.now(UTC)
    with engine.begin() as conn:
        row = EventRow("e1", "alpha", "awareness", "page_view", now, "web", "actor-1", {}, "{}")
        store_events(conn, [row], now - timedelta(minutes=5), False)
    defs = dg.Definitions(
        assets=[observe_queues, observe_marketing_event], resources={"app_db": AppDatabase(url=db_url)}
    )
    # The "Observe" button launches the implicit asset job over the observable assets.
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(instance=instance, asset_selection=WATCHED)
    assert result.success
    observed = {e.asset_observation_data.asset_observation.asset_key: e for e in result.get_asset_observation_events()}
    assert set(observed) == set(WATCHED)
    events = observed[MARKETING_EVENT_KEY].asset_observation_data.asset_observation.metadata
    assert events["ingested_last_hour"] == dg.MetadataValue.int(1)
    assert instance.get_latest_materialization_event(MARKETING_EVENT_KEY) is None


def test_the_late_events_sensor_observes_the_raw_events_each_tick(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    add_campaign(engine, "alpha")
    sensor = build_late_events_sensor(DEFAULTS, settle_seconds=0)
    context = dg.build_sensor_context(instance=instance, resources={"app_db": AppDatabase(url=db_url)})
    empty = sensor(context)
    assert isinstance(empty, dg.SensorResult)
    [observation] = empty.asset_events
    assert isinstance(observation, dg.AssetObservation) and observation.asset_key == MARKETING_EVENT_KEY
    assert observation.metadata["last_ingested_at"] == dg.MetadataValue.text("no event yet")
    ingested = datetime.now(UTC) - timedelta(minutes=1)
    with engine.begin() as conn:
        rows = [EventRow(f"e{n}", "alpha", "awareness", "page_view", ingested, "web", None, {}, "{}") for n in range(3)]
        store_events(conn, rows, ingested, False)
    context = dg.build_sensor_context(
        instance=instance, cursor=empty.cursor, resources={"app_db": AppDatabase(url=db_url)}
    )
    ticked = sensor(context)
    assert isinstance(ticked, dg.SensorResult)
    [observation] = [e for e in ticked.asset_events if isinstance(e, dg.AssetObservation)]
    assert observation.metadata["ingested_last_hour"] == dg.MetadataValue.int(3)
    assert observation.metadata["last_ingested_at"].value == ingested.timestamp()
