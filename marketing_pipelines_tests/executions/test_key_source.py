"""One key source per database: the CLI and the daemon of one SQLite database seal and open with the same key,
and every sealing error names the source the process actually read (the variable or the key file)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.schema import marketing_execution, webhook_endpoint
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.sealing import SealingError, key_source, new_key
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.runs import LOCAL, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign


def _key_file(sqlite_url: str, key: str) -> Path:
    """The SQLite database's own key file (what the demo makes), holding ``key``."""
    path = load_settings(database_url=sqlite_url).secrets_key_file()
    assert path is not None
    path.write_text(key + "\n")
    return path


def test_the_variable_and_a_different_key_file_are_refused_in_one_line_naming_both(sqlite_url: str) -> None:
    key_file = _key_file(sqlite_url, new_key())
    cli = cli_for(sqlite_url, MARKETING_SECRETS_KEY=new_key())
    refused = cli("webhooks", "add", "crm", "--url", "https://hooks.example.com/x")
    assert refused.exit_code == 1
    assert refused.output.count("\n") == 1
    assert "MARKETING_SECRETS_KEY is set and differs from" in refused.output and str(key_file) in refused.output
    assert "crm" not in cli("webhooks", "list").output  # nothing sealed with either key


def test_the_same_key_in_both_places_is_one_source(sqlite_url: str) -> None:
    key = new_key()
    _key_file(sqlite_url, key)
    assert (
        cli_for(sqlite_url, MARKETING_SECRETS_KEY=key)(
            "webhooks", "add", "crm", "--url", "https://h.example/x"
        ).exit_code
        == 0
    )
    # And the file alone, as the local UI's daemon reads it, opens what the command sealed.
    assert cli_for(sqlite_url, MARKETING_SECRETS_KEY="")("webhooks", "rotate", "crm").exit_code == 0


@pytest.mark.parametrize(
    ("variable", "from_file", "source"),
    [
        ("K", None, "MARKETING_SECRETS_KEY"),  # the variable alone
        (None, "K", "the key file {file}"),  # the key file alone
        ("K", "K", "MARKETING_SECRETS_KEY"),  # both, equal
        (" ", "K", "the key file {file}"),  # a blank variable is unset
    ],
)
def test_the_source_is_named_as_it_was_read(tmp_path: Path, variable: str | None, from_file: str | None, source: str):
    file = tmp_path / "secrets.key"
    if from_file is not None:
        file.write_text(from_file)
    keys = key_source(variable, file)
    assert (keys.text, keys.source) == ("K", source.format(file=file))


def test_nothing_anywhere_says_where_it_looked(tmp_path: Path) -> None:
    keys = key_source(None, tmp_path / "secrets.key")
    assert (
        keys.text is None and keys.missing == f"MARKETING_SECRETS_KEY is not set and there is no {tmp_path}/secrets.key"
    )
    with pytest.raises(SealingError, match="differs from"):
        (tmp_path / "secrets.key").write_text("A")
        key_source("B", tmp_path / "secrets.key")


def test_a_run_that_cannot_open_an_endpoint_names_the_key_file_it_read(
    sqlite_url: str, instance: dg.DagsterInstance
) -> None:
    """The recipe's failure: the endpoint was sealed under one key, the daemon reads the database's key file,
    which holds another. The execution fails naming the file, not a variable the daemon never read."""
    engine = get_engine(sqlite_url)
    add_campaign(engine)
    sealed_with = new_key()
    assert (
        cli_for(sqlite_url, MARKETING_SECRETS_KEY=sealed_with)(
            "webhooks", "add", "crm", "--url", "https://hooks.example.com/x", "--campaign", "spring-launch"
        ).exit_code
        == 0
    )
    key_file = _key_file(sqlite_url, new_key())  # made afterwards, as a demo would make it
    with engine.begin() as conn:
        execution_id = schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action="webhook",
            due_at=datetime.now(UTC) - timedelta(seconds=5),
            payload={"endpoint": "crm", "body": {}},
            max_attempts=1,
        )
    # The daemon's resource as the definitions build it, without the variable.
    client = WebhookClient.from_settings(load_settings(database_url=sqlite_url), allow_networks=LOCAL)
    [request] = sensor_requests(due_executions_sensor, sqlite_url, instance, ExecutionSettings())
    result = perform(request, sqlite_url, instance, webhook=client, settings=ExecutionSettings())
    assert not result.success
    with engine.connect() as conn:
        error = conn.execute(
            sa.select(marketing_execution.c.last_error).where(marketing_execution.c.id == execution_id)
        ).scalar_one()
    assert f"none of the keys from the key file {key_file}" in error
    assert "MARKETING_SECRETS_KEY" not in error


def _sealed_rows(sqlite_url: str) -> list[tuple[object, ...]]:
    with get_engine(sqlite_url).connect() as conn:
        return [tuple(r) for r in conn.execute(sa.select(webhook_endpoint).order_by(webhook_endpoint.c.name))]


@pytest.mark.parametrize("command", [("webhooks", "rotate", "crm"), ("webhooks", "reseal")], ids=" ".join)
@pytest.mark.parametrize("from_file", [False, True], ids=["variable", "key file"])
def test_a_key_that_opens_nothing_is_one_line_naming_its_source_and_changes_nothing(
    sqlite_url: str, command: tuple[str, ...], from_file: bool
) -> None:
    sealing_key, other_key = new_key(), new_key()
    cli_for(sqlite_url, MARKETING_SECRETS_KEY=sealing_key)("webhooks", "add", "crm", "--url", "https://h.example/x")
    cli_for(sqlite_url, MARKETING_SECRETS_KEY=sealing_key)("webhooks", "add", "erp", "--url", "https://e.example/y")
    before = _sealed_rows(sqlite_url)
    if from_file:
        source = f"the key file {_key_file(sqlite_url, other_key)}"
        cli = cli_for(sqlite_url, MARKETING_SECRETS_KEY="")
    else:
        source = "MARKETING_SECRETS_KEY"
        cli = cli_for(sqlite_url, MARKETING_SECRETS_KEY=other_key)
    refused = cli(*command)
    assert refused.exit_code == 1
    [line] = refused.output.splitlines()
    assert line.startswith("Error: webhook endpoint 'crm': a stored secret opens with none of the keys from " + source)
    assert line.endswith("nothing was changed")
    assert _sealed_rows(sqlite_url) == before
