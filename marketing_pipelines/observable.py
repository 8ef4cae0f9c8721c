"""Observable source assets: tables that something outside Dagster writes and the project reads a figure of.

A bare ``dg.AssetSpec`` with no materialization is counted by the UI's lineage view among the assets that
"have never been materialized", however often it is observed; an observable one (a function that takes a
reading) shows as observed, with its last reading, and gets an "Observe" button. Their sensors record the
same readings every tick (``SensorResult(asset_events=...)``), without a run.
"""

import warnings
from collections.abc import Callable, Iterator, Sequence

import dagster as dg

Observe = Callable[[dg.AssetExecutionContext], Iterator[dg.ObserveResult]]


def observable_assets(
    specs: Sequence[dg.AssetSpec], name: str, description: str, observe: Observe
) -> dg.AssetsDefinition:
    """``specs`` observed together by ``observe``, which reads the application database (resource ``app_db``)."""
    # multi_observable_source_asset is beta in Dagster 1.13.27 and says so each time a process loads the code
    # location (the daemon, every code server and run worker): a line an operator can do nothing about.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.multi_observable_source_asset(
            specs=specs, name=name, description=description, required_resource_keys={"app_db"}
        )(observe)
