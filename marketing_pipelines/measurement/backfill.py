"""A backfill of the measurement assets over a range of days from the command line, as the UI's Materialize makes one.

``dagster job backfill`` is a job backfill: it submits one run per day at once, bypassing the assets'
``BackfillPolicy``. An asset backfill, which the UI's Materialize dialog creates and the daemon splits
into range runs, has no Dagster CLI command in 1.13.27; its public interface is the GraphQL mutation
``launchPartitionBackfill``, which ``dagster-graphql`` executes against a workspace and the instance of
DAGSTER_HOME without a webserver.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

from marketing_pipelines import run_tags
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.measurement.sources import SOURCES, missing_variables
from marketing_pipelines.redact import redact_text, visible_controls
from marketing_pipelines.settings import Settings

# The module the code location loads under its module's name, as `dagster dev -m` and `marketing-pipelines ui` do.
DEFINITIONS_MODULE = "marketing_pipelines.definitions"
ROLLUP_ASSET = "measurement_daily_rollup"
LAUNCH_BACKFILL = """
mutation LaunchBackfill($params: LaunchBackfillParams!) {
  launchPartitionBackfill(backfillParams: $params) {
    __typename
    ... on LaunchBackfillSuccess { backfillId }
    ... on Error { message }
  }
}
"""


@dataclass(frozen=True)
class AssetDays:
    """One asset's days in a backfill: first..last, inclusive."""

    asset: str
    first: date
    last: date

    @property
    def days(self) -> int:
        return (self.last - self.first).days + 1


@dataclass(frozen=True)
class BackfillLaunched:
    backfill_id: str
    plan: tuple[AssetDays, ...]
    # Range runs the daemon makes of it: ceil(days / MARKETING_BACKFILL_DAYS_PER_RUN) for each distinct range (assets
    # of the same days share runs).
    runs: int


def backfill_plan(
    settings: Settings, imports: bool, first: date, last: date, today: date
) -> tuple[list[AssetDays], list[str]]:
    """The rollup over first..last and, with ``imports``, each configured importer over the days of it its source
    can still be read (``contract.lookback_days``); with a note for each importer cut short or left out.

    An importer's run fails on a day older than its lookback (assets.refuse_unreadable), so asking GitHub traffic
    (13 days) for a month would fail every run of it, readable days included. Older days keep their stored rows,
    which the rollup reads. A source of running totals re-derives any day from its stored snapshots: its whole range.
    """
    missing = missing_variables(settings)
    plan: list[AssetDays] = []
    notes: list[str] = []
    for source in SOURCES:
        if not imports or source.name in missing:
            continue
        contract = source.contract
        start = first
        if contract.lookback_days is not None and contract.count_kind == "daily":
            start = max(first, today - timedelta(days=contract.lookback_days))
        why = f"{source.name} can be read only {contract.lookback_days} days back; older days keep their stored rows"
        if start > last:
            notes.append(f"{source.asset} left out: {why}")
            continue
        if start > first:
            notes.append(f"{source.asset} from {start} only: {why}")
        plan.append(AssetDays(source.asset, start, last))
    return [*plan, AssetDays(ROLLUP_ASSET, first, last)], notes


def check_range(first: date, last: date, partitions_start: date, today: date) -> None:
    """InvalidInput unless first..last are days the partitions hold (MARKETING_MEASUREMENT_START_DATE to today)."""
    if first > last:
        raise InvalidInput(f"--from {first} is after --to {last}")
    if first < partitions_start:
        raise InvalidInput(
            f"--from {first} is before the first partition, {partitions_start} (MARKETING_MEASUREMENT_START_DATE)"
        )
    if last > today:
        raise InvalidInput(f"--to {last} is after today ({today}, UTC), the last partition")


def launch_backfill(
    plan: Sequence[AssetDays],
    days_per_run: int,
    env: Mapping[str, str],
    workspace: Path | None = None,
    timeout_s: float = 300,
) -> BackfillLaunched:
    """One asset backfill of each asset of ``plan`` over its days on the instance of ``env``'s DAGSTER_HOME.

    ``workspace``: a deployment's workspace file; without one the code location is loaded from its module
    in the ``dagster-graphql`` process, under the name the UI's gives it.
    """
    first, last = min(p.first for p in plan), max(p.last for p in plan)
    params = {
        "partitionsByAssets": [
            {
                "assetKey": {"path": [p.asset]},
                "partitions": {"range": {"start": p.first.isoformat(), "end": p.last.isoformat()}},
            }
            for p in plan
        ],
        "title": f"marketing-pipelines backfill {first}..{last}",
        "tags": [{"key": run_tags.LAUNCHED_BY, "value": "marketing-pipelines backfill"}],
    }
    where = ["-w", str(workspace)] if workspace is not None else ["-m", DEFINITIONS_MODULE]
    graphql = str(Path(sys.executable).parent / "dagster-graphql")
    with tempfile.TemporaryDirectory(prefix="marketing-backfill-") as folder:
        # The answer in a file of its own: the code server that dagster-graphql starts logs to the same streams.
        answer = Path(folder) / "answer.json"
        argv = [graphql, *where, "-t", LAUNCH_BACKFILL, "-v", json.dumps({"params": params}), "-o", str(answer)]
        done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=timeout_s, check=False)
        text = answer.read_text() if answer.exists() else ""
    try:
        result = json.loads(text)["data"]["launchPartitionBackfill"]
    except (ValueError, KeyError, TypeError):
        last_line = (done.stderr.strip().splitlines() or done.stdout.strip().splitlines() or ["no output"])[-1]
        raise InvalidInput(
            f"dagster-graphql could not launch the backfill (exit {done.returncode}): "
            f"{visible_controls(redact_text(last_line))}"
        ) from None
    if result.get("__typename") != "LaunchBackfillSuccess":
        message = result.get("message") or result.get("__typename")
        raise InvalidInput(f"Dagster refused the backfill: {visible_controls(redact_text(str(message)))}")
    ranges = {(p.first, p.last): p.days for p in plan}
    runs = sum(-(-days // days_per_run) for days in ranges.values())
    return BackfillLaunched(result["backfillId"], tuple(plan), runs)
