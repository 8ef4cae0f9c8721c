"""The measurement definitions: names, and importers configured only from set environment variables."""

from __future__ import annotations

import dagster as dg

from marketing_pipelines.definitions import defs
from marketing_pipelines.measurement.defs import importer_resources


def test_measurement_keys_are_defined() -> None:
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {"measurement_daily_job", "measurement_rollup_job"} <= set(repo.job_names)
    assert "measurement_late_events_sensor" in {s.name for s in repo.sensor_defs}
    assert "measurement_daily_schedule" in {s.name for s in repo.schedule_defs}
    graph = defs.resolve_asset_graph()
    assert {
        dg.AssetKey("marketing_event"),
        dg.AssetKey("site_analytics_daily"),
        dg.AssetKey("github_release_downloads_daily"),
        dg.AssetKey("measurement_daily_rollup"),
    } <= set(graph.get_all_asset_keys())
    assert {(k.asset_key.path[-1], k.name) for k in graph.asset_check_keys} >= {
        ("measurement_daily_rollup", "first_party_count_matches_events"),
        ("measurement_daily_rollup", "unique_actors_within_raw_count"),
        ("github_release_downloads_daily", "no_unflagged_negative_download_delta"),
    }
    assert graph.get(dg.AssetKey("measurement_daily_rollup")).parent_keys == {
        dg.AssetKey("marketing_event"),
        dg.AssetKey("site_analytics_daily"),
        dg.AssetKey("github_release_downloads_daily"),
    }


def test_importers_are_configured_from_env_vars_only_when_set() -> None:
    unset = importer_resources({})
    assert unset["plausible"].api_key is None and unset["github"].token is None

    configured = importer_resources({"PLAUSIBLE_API_KEY": "k", "PLAUSIBLE_SITE_ID": "example.com", "GITHUB_TOKEN": "t"})
    # Only the variables' names go into the definitions (and the UI), never their values.
    assert configured["plausible"].api_key == dg.EnvVar("PLAUSIBLE_API_KEY")
    assert configured["plausible"].site_id == dg.EnvVar("PLAUSIBLE_SITE_ID")
    assert configured["github"].token == dg.EnvVar("GITHUB_TOKEN")
