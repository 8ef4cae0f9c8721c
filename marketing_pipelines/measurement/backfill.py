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
from datetime import date
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
class BackfillLaunched:
    backfill_id: str
    assets: tuple[str, ...]
    first: date
    last: date
    runs: int  # range runs the daemon makes of it: ceil(days / MARKETING_BACKFILL_DAYS_PER_RUN)


def backfill_assets(settings: Settings, imports: bool) -> list[str]:
    """The rollup, and with ``imports`` the importers the definitions of ``settings`` hold (the configured ones)."""
    missing = missing_variables(settings)
    importers = [source.asset for source in SOURCES if imports and source.name not in missing]
    return [*importers, ROLLUP_ASSET]


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
    assets: Sequence[str],
    first: date,
    last: date,
    days_per_run: int,
    env: Mapping[str, str],
    workspace: Path | None = None,
    timeout_s: float = 300,
) -> BackfillLaunched:
    """One asset backfill of ``assets`` over first..last on the instance of ``env``'s DAGSTER_HOME.

    ``workspace``: a deployment's workspace file; without one the code location is loaded from its module
    in the ``dagster-graphql`` process, under the name the UI's gives it.
    """
    days = {"range": {"start": first.isoformat(), "end": last.isoformat()}}
    params = {
        "partitionsByAssets": [{"assetKey": {"path": [key]}, "partitions": days} for key in assets],
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
    count = (last - first).days + 1
    return BackfillLaunched(result["backfillId"], tuple(assets), first, last, -(-count // days_per_run))
