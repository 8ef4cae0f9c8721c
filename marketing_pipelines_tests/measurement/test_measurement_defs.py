"""The measurement definitions: names, and importers configured from settings, their credentials as set variables."""

from __future__ import annotations

import json
from datetime import timedelta

import dagster as dg
import pytest

from marketing_pipelines.measurement.assets import (
    build_measurement_assets,
    left_out_importers,
    marketing_event_asset,
    measurement_daily_job,
)
from marketing_pipelines.measurement.defs import IMPORTER_RESOURCES, importer_resources
from marketing_pipelines_tests.built import DEFAULTS, DEFS, unconfigured_importers
from marketing_pipelines_tests.factories import settings_from
from marketing_pipelines_tests.measurement.fake_services import GA4_PROPERTY, service_account_key


def test_measurement_keys_are_defined() -> None:
    dg.Definitions.validate_loadable(DEFS)
    repo = DEFS.get_repository_def()
    assert {"measurement_daily_job", "measurement_rollup_job"} <= set(repo.job_names)
    assert "measurement_late_events_sensor" in {s.name for s in repo.sensor_defs}
    assert "measurement_daily_schedule" in {s.name for s in repo.schedule_defs}
    graph = DEFS.resolve_asset_graph()
    assert {dg.AssetKey("marketing_event"), dg.AssetKey("measurement_daily_rollup")} <= set(graph.get_all_asset_keys())
    assert {(k.asset_key.path[-1], k.name) for k in graph.asset_check_keys} >= {
        ("measurement_daily_rollup", "first_party_count_matches_events"),
        ("measurement_daily_rollup", "unique_actors_within_raw_count"),
    }


SITE, DOWNLOADS, ROLLUP = (
    dg.AssetKey("site_analytics_daily"),
    dg.AssetKey("github_release_downloads_daily"),
    dg.AssetKey("measurement_daily_rollup"),
)
UNBOUND = {
    **{name: dg.ResourceDefinition.none_resource() for name in ("app_db", *IMPORTER_RESOURCES)},
    "rollup_frames": dg.IOManagerDefinition.hardcoded_io_manager(dg.InMemoryIOManager()),
}
PLAUSIBLE_ENV = {"PLAUSIBLE_API_KEY": "k", "PLAUSIBLE_SITE_ID": "example.com"}
POSTHOG_ENV = {"POSTHOG_API_KEY": "phx_k", "POSTHOG_PROJECT_ID": "4242"}
POSTHOG_LEFT_OUT = "posthog_daily: set POSTHOG_API_KEY and POSTHOG_PROJECT_ID"
GA4_ENV = {"GA4_PROPERTY_ID": GA4_PROPERTY, "GA4_SERVICE_ACCOUNT_JSON": json.dumps(service_account_key())}
GA4_LEFT_OUT = "ga4_daily: set GA4_PROPERTY_ID and GA4_SERVICE_ACCOUNT_JSON"
# Traffic needs GITHUB_TOKEN with push access, and is off until its flag is set.
TRAFFIC_LEFT_OUT = "github_traffic_daily: set GITHUB_TOKEN and MARKETING_GITHUB_TRAFFIC_ENABLED=true"
TRAFFIC_OFF = "github_traffic_daily: set MARKETING_GITHUB_TRAFFIC_ENABLED=true"
# The package-download importers need no key and are off until their flags are set.
PACKAGES_OFF = (
    "pypi_downloads_daily: set MARKETING_PYPI_DOWNLOADS_ENABLED=true; "
    "npm_downloads_daily: set MARKETING_NPM_DOWNLOADS_ENABLED=true"
)
OTHERS_LEFT_OUT = f"{GA4_LEFT_OUT}; {POSTHOG_LEFT_OUT}; {TRAFFIC_LEFT_OUT}; {PACKAGES_OFF}"


@pytest.mark.parametrize(
    ("environ", "importers"),
    [
        ({}, set()),  # the default deployment: first-party events only
        ({"GITHUB_TOKEN": "t"}, {DOWNLOADS}),
        ({"PLAUSIBLE_API_KEY": "k"}, set()),  # half of Plausible's pair is not configured
        ({**PLAUSIBLE_ENV, "GITHUB_TOKEN": "t"}, {SITE, DOWNLOADS}),
    ],
)
def test_an_importer_is_in_the_definitions_only_when_its_source_is_configured(
    environ: dict[str, str], importers: set[dg.AssetKey]
) -> None:
    assets = build_measurement_assets(settings_from(environ), left_out=left_out_importers(settings_from(environ)))
    by_key = {asset.key: asset for asset in assets}
    assert set(by_key) == {ROLLUP, *importers}
    assert set(by_key[ROLLUP].asset_deps[ROLLUP]) == {dg.AssetKey("marketing_event"), *importers}
    assert {key.asset_key for asset in assets for key in asset.check_keys} == {ROLLUP, *importers}
    # The catalog says what is left out and what turns it on, on the rollup everyone looks at.
    description = by_key[ROLLUP].specs_by_key[ROLLUP].description or ""
    for key in (SITE, DOWNLOADS):
        assert (f"`{key.to_user_string()}` (set " in description) == (key not in importers), key
    if not environ:
        assert "(set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID)" in description and "(set GITHUB_TOKEN)" in description


def test_the_daily_job_selects_the_importers_the_definitions_hold() -> None:
    for environ in ({}, {**PLAUSIBLE_ENV, "GITHUB_TOKEN": "t"}):
        assets = [
            marketing_event_asset,
            *build_measurement_assets(settings_from(environ), left_out=left_out_importers(settings_from(environ))),
        ]
        # Resources are bound where the deployment assembles them; the selection needs only the graph.
        graph = dg.Definitions(assets=assets, resources=UNBOUND).resolve_asset_graph()
        assert measurement_daily_job.selection.resolve(graph) == graph.materializable_asset_keys


def test_importers_are_configured_from_env_vars_only_when_set() -> None:
    unset = importer_resources(settings_from({}), environ={})
    assert unset["plausible"].api_key is None and unset["github"].token is None

    environ = {**PLAUSIBLE_ENV, "GITHUB_TOKEN": "t", "PLAUSIBLE_BASE_URL": "https://stats.example.org"}
    configured = importer_resources(settings_from(environ), environ=environ)
    # Only the variables' names go into the definitions (and the UI), never their values.
    assert configured["plausible"].api_key == dg.EnvVar("PLAUSIBLE_API_KEY")
    assert configured["plausible"].site_id == dg.EnvVar("PLAUSIBLE_SITE_ID")
    assert configured["github"].token == dg.EnvVar("GITHUB_TOKEN")
    # A base URL set is shown by its variable's name too (it may carry credentials); unset, the public default.
    assert configured["plausible"].base_url == dg.EnvVar("PLAUSIBLE_BASE_URL")
    assert configured["github"].base_url == "https://api.github.com"


def test_identical_reruns_leave_the_rollup_in_sync(db_url: str) -> None:
    """The UI's "Unsynced" badge reads the stale status resolver (GraphQL's staleStatus). With unconfigured
    importers in the definitions, a rollup partition was "Unsynced (2)", two inputs never materialized,
    however often it ran; with them left out, identical re-runs keep it in sync."""
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    from marketing_pipelines.db.resources import AppDatabase
    from marketing_pipelines.measurement.assets import ROLLUP_IO_MANAGER
    from marketing_pipelines.measurement.report.frames import RollupFrameIOManager

    resources = {
        "app_db": AppDatabase(url=db_url),
        **unconfigured_importers(),
        ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url),
    }
    day = "2026-11-20"
    assets = build_measurement_assets(DEFAULTS, left_out=left_out_importers(DEFAULTS))
    with dg.instance_for_test() as instance:
        for _ in range(3):
            result = dg.materialize(
                [marketing_event_asset, *assets], selection=[ROLLUP], instance=instance, resources=resources,
                partition_key=day,
            )  # fmt: skip
            assert result.success
        [materialization] = result.asset_materializations_for_node("measurement_daily_rollup")
        shown = materialization.metadata["sources_not_configured"].value
        assert shown == "site_analytics_daily: set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID; " + (
            f"github_release_downloads_daily: set GITHUB_TOKEN; {OTHERS_LEFT_OUT}"
        )
        graph = dg.Definitions(assets=[marketing_event_asset, *assets], resources=resources).resolve_asset_graph()
        resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
        assert resolver.get_stale_causes(ROLLUP, day) == []
        assert resolver.get_status(ROLLUP, day) == StaleStatus.FRESH


@pytest.mark.parametrize(
    ("environ", "shown"),
    [
        # The defaults (the demo's code location): every importer left out, named by what turns each on.
        ({}, "site_analytics_daily: set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID; "
         f"github_release_downloads_daily: set GITHUB_TOKEN; {OTHERS_LEFT_OUT}"),
        # Only GitHub, GA4 and PostHog configured: Plausible (and the importers off by default) are named.
        ({"GITHUB_TOKEN": "t", **GA4_ENV, **POSTHOG_ENV},
         f"site_analytics_daily: set PLAUSIBLE_API_KEY and PLAUSIBLE_SITE_ID; {TRAFFIC_OFF}; {PACKAGES_OFF}"),
        # All with keys configured: only the importers turned on by MARKETING_ flags are left out.
        ({**PLAUSIBLE_ENV, "GITHUB_TOKEN": "t", **GA4_ENV, **POSTHOG_ENV}, f"{TRAFFIC_OFF}; {PACKAGES_OFF}"),
    ],
)  # fmt: skip
def test_the_rollups_metadata_names_every_source_the_definitions_leave_out(
    sqlite_url: str, environ: dict[str, str], shown: str
) -> None:
    from marketing_pipelines.db.resources import AppDatabase
    from marketing_pipelines.measurement.assets import ROLLUP_IO_MANAGER
    from marketing_pipelines.measurement.report.frames import RollupFrameIOManager

    settings = settings_from(environ)
    resources = {
        "app_db": AppDatabase(url=sqlite_url),
        **importer_resources(settings, environ=environ),
        ROLLUP_IO_MANAGER: RollupFrameIOManager(url=sqlite_url),
    }
    assets = build_measurement_assets(settings, left_out=left_out_importers(settings))
    with dg.instance_for_test() as instance:
        # Only the rollup is selected, so a configured client is never called.
        result = dg.materialize(
            [marketing_event_asset, *assets], selection=[ROLLUP], instance=instance, resources=resources,
            partition_key="2026-11-20",
        )  # fmt: skip
        assert result.success
        [materialization] = result.asset_materializations_for_node("measurement_daily_rollup")
    assert materialization.metadata["sources_not_configured"].value == shown


def test_every_measurement_asset_is_due_daily_in_dagsters_freshness() -> None:
    environ = {**PLAUSIBLE_ENV, "GITHUB_TOKEN": "t"}
    assets = build_measurement_assets(settings_from(environ), left_out=left_out_importers(settings_from(environ)))
    policies = {asset.key: asset.specs_by_key[asset.key].freshness_policy for asset in assets}
    assert set(policies) == {ROLLUP, SITE, DOWNLOADS}
    for policy in policies.values():
        # FAILING in the UI when not materialized between 00:00 and 06:00 UTC (the schedule runs at 00:15).
        assert (policy.deadline_cron, policy.lower_bound_delta, policy.timezone) == (  # type: ignore[union-attr]
            "0 6 * * *",
            timedelta(hours=6),
            "UTC",
        )


def test_the_rollups_description_names_every_source_and_what_it_adds_from_its_contract() -> None:
    from marketing_pipelines.measurement.sources import SOURCES

    description = DEFS.resolve_asset_graph().get(ROLLUP).description or ""
    for source in SOURCES:
        counted = ", ".join(c.metric for c in source.contract.counted)
        assert f"`{source.name}` {counted} (by campaign.{source.contract.match})" in description, source.name
