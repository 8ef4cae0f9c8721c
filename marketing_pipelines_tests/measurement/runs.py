"""Running the measurement assets in-process, for one day or a backfill run's range of days."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any

import dagster as dg

from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.measurement.assets import RANGE_END_TAG, RANGE_START_TAG, ROLLUP_IO_MANAGER
from marketing_pipelines.measurement.report.frames import RollupFrameIOManager
from marketing_pipelines_tests.built import measurement_assets, unconfigured_importers


def materialize_measurement(
    selection: Sequence[dg.AssetKey],
    db_url: str,
    days: Sequence[date],
    instance: dg.DagsterInstance | None = None,
    *,
    raise_on_error: bool = True,
    **clients: Any,
) -> dg.ExecuteInProcessResult:
    """Materialize ``selection`` for ``days``: one day as a partition run, several as one range run.

    A range run is what a backfill launches under BackfillPolicy.multi_run: the same partition
    range tags the backfill daemon puts on each of its runs.
    """
    first, last = min(days), max(days)
    partition = {"partition_key": first.isoformat()} if first == last else {}
    tags = (
        {}
        if first == last
        else {
            RANGE_START_TAG: first.isoformat(),
            RANGE_END_TAG: last.isoformat(),
        }
    )
    return dg.materialize(
        measurement_assets,
        selection=list(selection),
        instance=instance or dg.DagsterInstance.ephemeral(),
        resources={
            "app_db": AppDatabase(url=db_url),
            # Every importer of the definitions, unconfigured unless the test gives it.
            **unconfigured_importers(),
            **clients,
            ROLLUP_IO_MANAGER: RollupFrameIOManager(url=db_url),
        },
        tags=tags,
        raise_on_error=raise_on_error,
        **partition,
    )
