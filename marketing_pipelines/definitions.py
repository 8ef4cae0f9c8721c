"""Assembles the Dagster definitions from the domains; nothing else lives here.

``build_defs(settings)`` is the one place the definitions are made: tests and the demo call it with
the settings they want; the code location loads ``defs``, built once from the environment's settings.
"""

import warnings

import dagster as dg

from marketing_pipelines.agents import defs as agents
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions import defs as executions
from marketing_pipelines.measurement import defs as measurement
from marketing_pipelines.monitoring import defs as monitoring
from marketing_pipelines.monitoring import retention
from marketing_pipelines.settings import Settings, current_settings, resource_from_settings

# Dagster 1.13.27 re-creates every sensor that targets a job while attaching resources and passes
# owners=None along, which warns "owners is beta" on every load of the code. No sensor here sets
# owners; the warning says nothing to whoever reads the log.
warnings.filterwarnings(
    "ignore", message=r"Parameter `owners` of initializer `SensorDefinition.__init__`", category=dg.BetaWarning
)


def build_defs(settings: Settings) -> dg.Definitions:
    """Every domain's definitions as ``settings`` shape them, with the resources they share."""
    return dg.Definitions.merge(
        executions.build_defs(settings),
        agents.build_defs(settings),
        measurement.build_defs(settings),
        monitoring.build_defs(settings),
        retention.build_defs(settings),
        dg.Definitions(
            # Shared by every domain; the URL is an EnvVar, so it never shows in run config (see AppDatabase).
            resources={"app_db": resource_from_settings(AppDatabase, settings)},
            # Every job here runs one step, or a few in order (the measurement assets), unless it sets its own
            # executor: a process per step would add seconds of interpreter start-up and code loading to
            # each step of each run, backfill runs included.
            executor=dg.in_process_executor,
        ),
    )


@dg.definitions
def defs() -> dg.Definitions:
    """What `dagster dev -m marketing_pipelines.definitions`, the code servers and the run workers load: the
    definitions of the environment's settings, read when Dagster loads the code, not when a module imports this."""
    return build_defs(current_settings())
