"""A webhook payload's header values: sealed at rest, opened only to be sent, shown as ``***``, resealed on rotation."""

from __future__ import annotations

import functools
import io
import json
import re
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import marketing_execution, metadata
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.queue import read_schedule_file, schedule_execution, schedule_lines
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.sealing import SecretBox, key_source, new_key
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.runs import LOCAL, outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.webserver import Recorder

KEY = new_key()
LOCAL_POLICY = EgressPolicy(parse_networks(LOCAL))
KEYS = functools.partial(key_source, KEY, None)  # as Settings.sealing_keys finds MARKETING_SECRETS_KEY
SCHEDULE = ("executions", "schedule", "--campaign", "spring-launch", "--stage", "launch", "--action", "webhook")


def _credentials() -> tuple[str, str]:
    return secrets.token_urlsafe(30), secrets.token_urlsafe(30)


def _payload(hook: Recorder, bearer: str, api_key: str) -> dict[str, Any]:
    return {"url": hook.url, "headers": {"Authorization": f"Bearer {bearer}", "X-Api-Key": api_key}, "body": {"n": 1}}


def _pieces(*values: str) -> set[str]:
    return {value[i : i + 12] for value in values for i in range(len(value) - 11)}


def _dump(engine: sa.Engine) -> str:
    """Every row of every table of the application database, as text."""
    with engine.connect() as conn:
        return "\n".join(
            json.dumps([list(row) for row in conn.execute(sa.select(table))], default=str)
            for table in metadata.sorted_tables
        )


def _leaks(text: str, *values: str) -> set[str]:
    return {piece for piece in _pieces(*values) if piece in text}


def _stored_headers(engine: sa.Engine, execution_id: int) -> dict[str, Any]:
    with engine.connect() as conn:
        t = marketing_execution
        return conn.execute(sa.select(t.c.payload).where(t.c.id == execution_id)).scalar_one()["headers"]


def _run_due(db_url: str, instance: dg.DagsterInstance, key: str | None) -> dict[int, str]:
    client = WebhookClient(timeout_s=5, allow_networks=LOCAL, secrets_key=key)
    done: dict[int, str] = {}
    for request in sensor_requests(due_executions_sensor, db_url, instance):
        done |= outcomes(perform(request, db_url, instance, webhook=client))
    return done


def _insert_as_an_old_version(engine: sa.Engine, payload: dict[str, Any]) -> int:
    """A row as versions before header sealing wrote it: the header values in plain text."""
    now = datetime.now(UTC)
    with engine.begin() as conn:
        return conn.execute(
            sa.insert(marketing_execution)
            .values(
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                payload=payload,
                due_at=now - timedelta(seconds=5),
                status="SCHEDULED",
                attempts=0,
                max_attempts=1,
                created_at=now,
                updated_at=now,
            )
            .returning(marketing_execution.c.id)
        ).scalar_one()


def test_header_values_are_sealed_at_rest_shown_as_stars_and_reach_the_receiver_exact(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    bearer, api_key = _credentials()
    cli = cli_for(db_url, MARKETING_SECRETS_KEY=KEY, MARKETING_WEBHOOK_ALLOW_NETWORKS=LOCAL[0])
    scheduled = cli(*SCHEDULE, "--due", "now", "--payload", json.dumps(_payload(hook, bearer, api_key)))
    assert scheduled.exit_code == 0, scheduled.output
    execution_id = int(scheduled.output.split()[0])
    assert _leaks(_dump(engine), bearer, api_key) == set()
    assert set(_stored_headers(engine, execution_id)) == {"Authorization", "X-Api-Key"}
    for shown in (
        cli("executions", "show", str(execution_id)).output,
        cli("executions", "show", str(execution_id), "--body", "--json").output,
        cli("executions", "list", "--json").output,
    ):
        assert '"Authorization": "***"' in shown and '"X-Api-Key": "***"' in shown
        assert "gAAAA" not in shown and _leaks(shown, bearer, api_key) == set()  # no Fernet token shown as a value

    assert _run_due(db_url, instance, KEY) == {execution_id: "SUCCEEDED"}
    [received] = hook.received
    assert received.headers["authorization"] == f"Bearer {bearer}" and received.headers["x-api-key"] == api_key
    assert _leaks(_dump(engine), bearer, api_key) == set()


def test_the_same_payload_still_dedupes_when_its_headers_are_sealed(engine: sa.Engine, hook: Recorder) -> None:
    add_campaign(engine)
    payload = _payload(hook, *_credentials())

    def schedule(dedupe_key: str) -> int:
        with engine.begin() as conn:
            return schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) + timedelta(days=1),
                payload=payload,
                dedupe_key=dedupe_key,
                egress=LOCAL_POLICY,
                keys=KEYS,
            )

    first = schedule("launch-1")
    sealed = _stored_headers(engine, first)
    assert all(set(value) == {"sealed"} for value in sealed.values())
    assert schedule("launch-1") == first and _stored_headers(engine, first) == sealed
    line = {"campaign": "spring-launch", "stage": "launch", "action": "webhook", "due": "now", "payload": payload}
    lines = read_schedule_file(io.BytesIO(json.dumps({**line, "dedupe_key": "launch-1"}).encode()))
    with engine.begin() as conn:
        again = schedule_lines(conn, lines, default_max_attempts=1, egress=LOCAL_POLICY, keys=KEYS)
    assert again.existing == (first,) and again.new == () and again.errors == ()
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one() == 1
    assert schedule("launch-2") != first  # another key is another execution


def test_rows_with_plain_header_values_still_send_and_executions_reseal_seals_them(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    bearer, api_key = _credentials()
    sent_plain = _insert_as_an_old_version(engine, _payload(hook, bearer, api_key))
    # Plain values need no key to be sent.
    assert _run_due(db_url, instance, None) == {sent_plain: "SUCCEEDED"}
    later = _insert_as_an_old_version(engine, _payload(hook, bearer, api_key))
    resealed = cli_for(db_url, MARKETING_SECRETS_KEY=KEY)("executions", "reseal")
    assert resealed.exit_code == 0 and "resealed the header values of 2 execution(s)" in resealed.output
    assert _leaks(_dump(engine), bearer, api_key) == set()  # the sent row's too

    assert _run_due(db_url, instance, KEY) == {later: "SUCCEEDED"}
    for received in hook.received:
        assert received.headers["authorization"] == f"Bearer {bearer}" and received.headers["x-api-key"] == api_key
    assert len(hook.received) == 2


def test_a_key_rotation_reseals_header_tokens(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    old, new = new_key(), new_key()
    bearer, api_key = _credentials()
    cli = cli_for(db_url, MARKETING_SECRETS_KEY=old, MARKETING_WEBHOOK_ALLOW_NETWORKS=LOCAL[0])
    execution_id = int(cli(*SCHEDULE, "--due", "now", "--payload", json.dumps(_payload(hook, bearer, api_key))).output)
    before = _stored_headers(engine, execution_id)
    # Without the old key the tokens cannot be resealed: refused in one line, nothing changed.
    refused = cli_for(db_url, MARKETING_SECRETS_KEY=new)("executions", "reseal")
    assert refused.exit_code == 1 and f"execution {execution_id}:" in refused.output
    assert len(refused.output.strip().splitlines()) == 1 and _stored_headers(engine, execution_id) == before
    assert cli_for(db_url, MARKETING_SECRETS_KEY=f"{new},{old}")("executions", "reseal").exit_code == 0

    assert _run_due(db_url, instance, new) == {execution_id: "SUCCEEDED"}  # the old key dropped
    [received] = hook.received
    assert received.headers["authorization"] == f"Bearer {bearer}" and received.headers["x-api-key"] == api_key


def test_without_a_key_headers_are_refused_in_one_line_and_nothing_is_stored(
    engine: sa.Engine, db_url: str, hook: Recorder, tmp_path: Any
) -> None:
    add_campaign(engine)
    bearer, api_key = _credentials()
    payload = _payload(hook, bearer, api_key)
    cli = cli_for(db_url, MARKETING_WEBHOOK_ALLOW_NETWORKS=LOCAL[0])
    refused = cli(*SCHEDULE, "--due", "now", "--payload", json.dumps(payload))
    assert refused.exit_code == 1 and len(refused.output.strip().splitlines()) == 1
    assert "MARKETING_SECRETS_KEY is not set" in refused.output and _leaks(refused.output, bearer, api_key) == set()
    rows = tmp_path / "rows.jsonl"
    line = {"campaign": "spring-launch", "stage": "launch", "action": "webhook", "due": "now", "payload": payload}
    rows.write_text(json.dumps(line) + "\n")
    from_file = cli("executions", "schedule", "--file", str(rows))
    assert from_file.exit_code == 1 and "line 1: MARKETING_SECRETS_KEY is not set" in from_file.output
    # Python callers: a key source that finds no key, and none given (never the process's environment).
    for keys in (lambda: key_source(None, None), None):
        with pytest.raises(InvalidInput, match="MARKETING_SECRETS_KEY") as raised, engine.begin() as conn:
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC),
                payload=payload,
                egress=LOCAL_POLICY,
                keys=keys,
            )
        assert "\n" not in str(raised.value) and _leaks(str(raised.value), bearer, api_key) == set()
    assert _leaks(_dump(engine), bearer, api_key) == set()
    # A payload without headers needs no key.
    assert cli(*SCHEDULE, "--due", "now", "--payload", json.dumps({"url": hook.url})).exit_code == 0


def test_a_run_without_the_key_fails_the_execution_naming_the_variable(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    cli = cli_for(db_url, MARKETING_SECRETS_KEY=KEY, MARKETING_WEBHOOK_ALLOW_NETWORKS=LOCAL[0])
    payload = json.dumps(_payload(hook, *_credentials()))
    execution_id = int(cli(*SCHEDULE, "--due", "now", "--payload", payload, "--max-attempts", "3").output)
    assert _run_due(db_url, instance, None) == {execution_id: "FAILED"}  # refused, not retried
    with engine.connect() as conn:
        row = conn.execute(sa.select(marketing_execution).where(marketing_execution.c.id == execution_id)).one()
    # PostgreSQL's JSONB keeps the headers in its own order: either one is named first.
    assert row.attempts == 1
    assert re.match(
        r"webhook header (Authorization|X-Api-Key) cannot be opened: MARKETING_SECRETS_KEY is not set", row.last_error
    )
    assert hook.received == []


def test_the_sqlite_key_file_seals_headers_as_it_seals_endpoints(
    sqlite_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    """The embedded default's secrets.key (the demo makes it) is the key when the variable is unset."""
    settings = load_settings(database_url=sqlite_url)
    key_file = settings.secrets_key_file()
    assert key_file is not None
    key_file.write_text(new_key() + "\n")
    engine = sa.create_engine(sqlite_url)
    add_campaign(engine)
    bearer, api_key = _credentials()
    cli = cli_for(sqlite_url, MARKETING_WEBHOOK_ALLOW_NETWORKS=LOCAL[0])
    execution_id = int(cli(*SCHEDULE, "--due", "now", "--payload", json.dumps(_payload(hook, bearer, api_key))).output)
    box = SecretBox(key_file.read_text())
    sealed = _stored_headers(engine, execution_id)
    assert json.loads(box.open(sealed["X-Api-Key"]["sealed"])) == ["X-Api-Key", api_key]
    assert _leaks(_dump(engine), bearer, api_key) == set()
    client = WebhookClient.from_settings(settings, timeout_s=5, allow_networks=LOCAL)
    [request] = sensor_requests(due_executions_sensor, sqlite_url, instance)
    assert outcomes(perform(request, sqlite_url, instance, webhook=client)) == {execution_id: "SUCCEEDED"}
    assert hook.received[0].headers["authorization"] == f"Bearer {bearer}"
