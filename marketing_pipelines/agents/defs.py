"""The agents domain's Dagster definitions (its sensors live in marketing_pipelines/work.py)."""

import dagster as dg

from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.models import model_gateway_from_env

defs = dg.Definitions(jobs=[agent_run_job], resources={"models": model_gateway_from_env()})
