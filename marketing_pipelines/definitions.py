"""Assembles the Dagster definitions from the domains; nothing else lives here."""

import warnings

import dagster as dg

# Modules, not their `defs` objects: Dagster refuses a module holding several Definitions.
from marketing_pipelines.agents import defs as agents
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions import defs as executions
from marketing_pipelines.measurement import defs as measurement
from marketing_pipelines.monitoring import defs as monitoring
from marketing_pipelines.settings import current_settings, resource_from_settings

# Dagster 1.13.27 re-creates every sensor that targets a job while attaching resources and passes
# owners=None along, which warns "owners is beta" on every load of the code. No sensor here sets
# owners; the warning says nothing to whoever reads the log.
warnings.filterwarnings(
    "ignore", message=r"Parameter `owners` of initializer `SensorDefinition.__init__`", category=dg.BetaWarning
)

defs = dg.Definitions.merge(
    executions.defs,
    agents.defs,
    measurement.defs,
    monitoring.defs,
    dg.Definitions(
        # Shared by every domain; the URL is an EnvVar, so it never shows in run config (see AppDatabase).
        resources={"app_db": resource_from_settings(AppDatabase, current_settings())},
        # Every job here runs one step (or sets its own executor): a step process of its own would add
        # seconds of interpreter start-up and code loading to each run, backfill runs included.
        executor=dg.in_process_executor,
    ),
)
