"""The tags marketing-pipelines puts on Dagster runs, in one place: what each key holds and who sets it.

Runs carry a small, fixed set of tag keys, the same for one execution or 1,000: how many executions,
which campaigns, who claimed them. No key per execution or agent run id: every distinct key is a row
in the instance's tag-key index and a suggestion in the UI's run filter, so a key per row would grow
both without bound. An execution's runs are found through its attempt history (`executions show`,
which links each attempt to its run), and a run's executions through its config and outcome table.
"""

# Set by each job's definition: "execution" or "agent_run", to filter the Runs page by kind of work.
KIND = "marketing/kind"
# The sensor tick's lease owner, so a run (or its reconciliation) can take the rows over from it.
CLAIMED_BY = "marketing/claimed_by"
# When every row of the run is of one campaign (a value only: a slug may be longer than a tag key's section).
CAMPAIGN_ID = "marketing/campaign_id"

# marketing_execution_job's runs (due_executions_sensor).
CAMPAIGNS = "marketing/campaigns"  # every campaign of the run, comma-separated, or how many there are
EXECUTIONS = "marketing/executions"  # how many executions the run performs

# agent_run_job's runs (queued_agent_runs_sensor): one agent run each, so its id is a value, not a key.
AGENT_RUN_ID = "marketing/agent_run_id"
REQUESTED_BY = "marketing/requested_by"
AGENT = "marketing/agent"
ATTEMPT = "marketing/attempt"

# measurement_rollup_job's runs started by measurement_late_events_sensor.
LATE_EVENTS = "marketing/late_events"

# measurement_daily_job's runs that re-import a day its sources may still revise: the sources, comma-separated.
REVISION_OF = "marketing/revision_of"

# measurement_rollup_job's runs that `marketing-pipelines demo` launched (with `dagster job launch`), and the
# backfills `marketing-pipelines backfill` created (a backfill's tags are its runs'), by name.
LAUNCHED_BY = "marketing/launched_by"
