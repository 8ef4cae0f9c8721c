"""The agents domain's Dagster definitions."""

import dagster as dg

defs = dg.Definitions()
