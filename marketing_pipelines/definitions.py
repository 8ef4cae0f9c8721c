"""Assembles the Dagster definitions from the domains; nothing else lives here."""

import dagster as dg

from marketing_pipelines.agents.defs import defs as agents_defs
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.executions.defs import defs as executions_defs
from marketing_pipelines.measurement.defs import defs as measurement_defs
from marketing_pipelines.work import due_work_sensor, work_run_canceled_sensor, work_run_failure_sensor

defs = dg.Definitions.merge(
    executions_defs,
    agents_defs,
    measurement_defs,
    # Shared by every domain. The URL is resolved from MARKETING_DATABASE_URL in the process
    # that uses it (see AppDatabase), so it never shows in run config.
    dg.Definitions(
        sensors=[due_work_sensor, work_run_failure_sensor, work_run_canceled_sensor],
        resources={"app_db": AppDatabase()},
    ),
)
