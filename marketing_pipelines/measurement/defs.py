"""The measurement domain's Dagster definitions (assets, checks, schedules, sensors)."""

import dagster as dg

defs = dg.Definitions()
