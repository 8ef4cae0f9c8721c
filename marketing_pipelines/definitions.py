"""Assembles the Dagster definitions from the domains; nothing else lives here."""

import dagster as dg

# Modules, not their `defs` objects: Dagster refuses a module holding several Definitions.
from marketing_pipelines.agents import defs as agents
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions import defs as executions
from marketing_pipelines.measurement import defs as measurement

defs = dg.Definitions.merge(
    executions.defs,
    agents.defs,
    measurement.defs,
    dg.Definitions(
        # Shared by every domain. The URL is resolved from MARKETING_DATABASE_URL in the process
        # that uses it (see AppDatabase), so it never shows in run config.
        resources={"app_db": AppDatabase()},
    ),
)
