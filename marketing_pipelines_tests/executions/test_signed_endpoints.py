"""Registered webhook endpoints: sealed at rest, signed as Standard Webhooks says, verified by its reference package."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import marketing_execution, webhook_endpoint
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.endpoints import add_endpoint, remove_endpoint, rotate_endpoint
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.sealing import SecretBox, new_key
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.executions.runs import LOCAL, outcomes, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.webserver import Recorder

KEY = new_key()
LOCAL_POLICY = EgressPolicy(parse_networks(LOCAL))
PATH_TOKEN = "PATH-TOKEN-8e1f"  # a Slack-style token in the endpoint URL's path


def _add(engine: sa.Engine, hook: Recorder, name: str = "crm", campaign: str | None = None) -> str:
    with engine.begin() as conn:
        return add_endpoint(conn, SecretBox(KEY), name, f"{hook.url}/{PATH_TOKEN}", LOCAL_POLICY, campaign)


def _schedule(engine: sa.Engine, endpoint: str, n: int = 1, max_attempts: int = 1, campaign: str = "spring-launch"):
    with engine.begin() as conn:
        return [
            schedule_execution(
                conn,
                campaign_id=campaign,
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) - timedelta(seconds=5),
                payload={"endpoint": endpoint, "body": {"n": i, "text": "café ✓"}},
                max_attempts=max_attempts,
            )
            for i in range(n)
        ]


def _run_due(db_url: str, instance: dg.DagsterInstance, key: str | None = KEY, **settings) -> list:
    client = WebhookClient(timeout_s=5, allow_networks=LOCAL, secrets_key=key)
    requests = sensor_requests(due_executions_sensor, db_url, instance, ExecutionSettings(**settings))
    return [
        perform(request, db_url, instance, webhook=client, settings=ExecutionSettings(**settings))
        for request in requests
    ]


def _verifies(secret: str, received) -> bool:
    try:
        Webhook(secret).verify(received.raw, received.headers)
    except WebhookVerificationError:
        return False
    return True


def test_deliveries_verify_with_the_reference_package_over_the_exact_bytes(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    secret = _add(engine, hook)
    ids = _schedule(engine, "crm", n=3)
    results = _run_due(db_url, instance)
    assert all(r.success for r in results)
    assert len(hook.received) == 3
    for received in hook.received:
        assert received.path == f"/hook/{PATH_TOKEN}"  # the sealed URL, opened at send time
        assert Webhook(secret).verify(received.raw, received.headers) == received.body
        assert received.headers["webhook-id"] == received.headers["idempotency-key"]
        assert received.headers["content-type"] == "application/json"
    assert {r.headers["webhook-id"] for r in hook.received} == {f"marketing-execution-{i}" for i in ids}
    # A tampered body, another secret or a stale timestamp is refused by the receiver's check.
    first = hook.received[0]
    assert not _verifies(secret, type(first)(first.path, first.headers, None, first.raw.replace(b"caf", b"CAF")))
    assert not _verifies(_add(engine, hook, "other"), first)
    stale = {**first.headers, "webhook-timestamp": str(int(datetime.now(UTC).timestamp()) - 3600)}
    assert not _verifies(secret, type(first)(first.path, stale, None, first.raw))


def test_a_rotation_signs_with_both_secrets_until_the_overlap_ends(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    old = _add(engine, hook)
    with engine.begin() as conn:
        new = rotate_endpoint(conn, SecretBox(KEY), "crm", timedelta(hours=24))
    _schedule(engine, "crm")
    assert all(r.success for r in _run_due(db_url, instance))
    during = hook.received[-1]
    assert len(during.headers["webhook-signature"].split(" ")) == 2
    assert _verifies(old, during) and _verifies(new, during)  # receivers switch without a gap

    with engine.begin() as conn:  # the overlap is over: a rotation whose window closed an hour ago
        newest = rotate_endpoint(conn, SecretBox(KEY), "crm", timedelta(0))
    _schedule(engine, "crm")
    assert all(r.success for r in _run_due(db_url, instance))
    after = hook.received[-1]
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert _verifies(newest, after) and not _verifies(new, after) and not _verifies(old, after)


def test_a_redelivery_keeps_its_webhook_id_and_is_signed_again(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    secret = _add(engine, hook)
    hook.status_for = lambda received: 503 if len(hook.received) == 1 else 200
    _schedule(engine, "crm", max_attempts=2)
    _run_due(db_url, instance, retry_backoff_seconds=0)  # first attempt: 503, rescheduled at once
    _run_due(db_url, instance, retry_backoff_seconds=0)
    first, second = hook.received
    assert first.headers["webhook-id"] == second.headers["webhook-id"]
    assert (first.headers["marketing-attempt"], second.headers["marketing-attempt"]) == ("1", "2")
    assert _verifies(secret, first) and _verifies(secret, second)


def test_a_dump_of_the_database_reveals_neither_the_url_nor_a_secret(engine: sa.Engine, hook: Recorder) -> None:
    add_campaign(engine)
    secret = _add(engine, hook)
    with engine.begin() as conn:
        rotated = rotate_endpoint(conn, SecretBox(KEY), "crm", timedelta(hours=1))
        dump = json.dumps([list(row) for row in conn.execute(sa.select(webhook_endpoint))], default=str)
    for revealing in (PATH_TOKEN, hook.url, secret, rotated, secret.removeprefix("whsec_")):
        assert revealing not in dump
    assert f"127.0.0.1:{hook.port}" in dump  # the origin alone is plain, for lists


def test_scheduling_checks_the_endpoint_exists_and_serves_the_campaign(engine: sa.Engine, hook: Recorder) -> None:
    add_campaign(engine)
    add_campaign(engine, "other-campaign")
    _add(engine, hook, "crm", campaign="spring-launch")
    with pytest.raises(InvalidInput, match="no webhook endpoint named 'nope'"):
        _schedule(engine, "nope")
    with pytest.raises(InvalidInput, match="serves campaign 'spring-launch', not 'other-campaign'"):
        _schedule(engine, "crm", campaign="other-campaign")
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one() == 0


def test_without_the_key_nothing_is_sent_and_the_run_fails_naming_the_setting(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    _add(engine, hook)
    [execution_id] = _schedule(engine, "crm", max_attempts=3)
    [result] = _run_due(db_url, instance, key=None)
    assert not result.success
    assert hook.received == []
    with engine.connect() as conn:
        row = conn.execute(sa.select(marketing_execution).where(marketing_execution.c.id == execution_id)).one()
    assert row.status == "FAILED" and row.attempts == 1  # refused, not retried against a missing key
    assert "MARKETING_SECRETS_KEY is not set" in row.last_error


def test_a_removed_endpoint_fails_its_executions(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    _add(engine, hook)
    [execution_id] = _schedule(engine, "crm")
    with engine.begin() as conn:
        assert remove_endpoint(conn, "crm")
    [result] = _run_due(db_url, instance)
    assert outcomes(result) == {execution_id: "FAILED"}
    assert hook.received == []


# Header values that the HTTP stack would refuse, quoting them, at send time; refused when scheduled.
BAD_HEADERS = [
    ({"Authorization": "Bearer sk-HDR-SECRET\n"}, "white space"),  # a trailing newline, from a pasted key
    ({"Authorization": " Bearer sk-HDR-SECRET"}, "white space"),  # leading space
    ({"X-Token": "sk-HDR\r\nX-Injected: 1"}, "control character"),  # header injection
    ({"X-Token": "sk-HDR-SECRET\x00"}, "white space|control character"),  # NUL
    ({"X-Token": "sk-HDR-SECRET\x1b[2J"}, "control character"),  # ESC
    ({"X-Token": "sk-HDR-SECRET-€"}, "latin-1"),  # outside latin-1
    ({"X Token": "v"}, "not an HTTP token"),  # a space in a name
    ({"X-Token:": "v"}, "not an HTTP token"),  # a colon in a name
    ({"Webhook-Signature": "v1,forged"}, "may not set"),  # the signature is ours
    ({"Content-Type": "text/plain"}, "may not set"),  # the body is JSON
]


@pytest.mark.parametrize(("headers", "problem"), BAD_HEADERS)
def test_bad_header_names_and_values_are_refused_when_scheduled_without_showing_the_value(
    engine: sa.Engine, headers: dict[str, str], problem: str
) -> None:
    add_campaign(engine)
    with pytest.raises(InvalidInput, match=problem) as refused, engine.begin() as conn:
        schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action="webhook",
            due_at=datetime.now(UTC),
            payload={"url": "https://hooks.example.com/x", "headers": headers},
        )
    assert "SECRET" not in str(refused.value) and "\n" not in str(refused.value)


def test_a_stored_header_the_http_stack_refuses_fails_once_without_showing_it(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    """Rows scheduled before headers were checked: refused at send, not retried as an internal error."""
    add_campaign(engine)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        execution_id = conn.execute(
            sa.insert(marketing_execution)
            .values(
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                payload={"url": hook.url, "headers": {"Authorization": "Bearer sk-OLD-SECRET\n", "X-Other": "é€"}},
                due_at=now - timedelta(seconds=5),
                status="SCHEDULED",
                attempts=0,
                max_attempts=5,
                created_at=now,
                updated_at=now,
            )
            .returning(marketing_execution.c.id)
        ).scalar_one()
    [result] = _run_due(db_url, instance)
    assert outcomes(result) == {execution_id: "FAILED"}
    with engine.connect() as conn:
        row = conn.execute(sa.select(marketing_execution).where(marketing_execution.c.id == execution_id)).one()
    assert row.attempts == 1 and "not valid HTTP" in row.last_error
    shown = row.last_error + " ".join(e.message for e in instance.all_logs(result.run_id) if e.message)
    assert "OLD-SECRET" not in shown
    assert hook.received == []


def test_a_receiver_echoing_the_signing_secret_shows_it_nowhere(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, hook: Recorder
) -> None:
    add_campaign(engine)
    secret = _add(engine, hook)
    # A receiver whose error quotes the secret it expected, with nothing around it a pattern would spot.
    hook.status, hook.body = 401, f"signature mismatch; expected one under {secret} here".encode()
    [execution_id] = _schedule(engine, "crm")
    [result] = _run_due(db_url, instance)
    with engine.connect() as conn:
        row = conn.execute(sa.select(marketing_execution).where(marketing_execution.c.id == execution_id)).one()
    assert row.status == "FAILED" and "answered HTTP 401: signature mismatch; expected one under ***" in row.last_error
    events = "\n".join(dg.serialize_value(e) for e in instance.all_logs(result.run_id))
    for shown in (row.last_error, events):
        assert secret not in shown and secret.removeprefix("whsec_") not in shown


def test_the_cli_prints_a_secret_once_and_never_lists_it(db_url: str, engine: sa.Engine, hook: Recorder) -> None:
    add_campaign(engine)
    env = {"MARKETING_DATABASE_URL": db_url, "MARKETING_SECRETS_KEY": KEY, "MARKETING_WEBHOOK_ALLOW_NETWORKS": LOCAL[0]}
    runner = CliRunner()
    url = f"{hook.url}/{PATH_TOKEN}?token=Q-TOKEN"
    added = runner.invoke(main, ["webhooks", "add", "crm", "--url", url, "--campaign", "spring-launch"], env=env)
    assert added.exit_code == 0, added.output
    secret = added.stdout.strip()
    assert secret.startswith("whsec_") and len(added.stdout.splitlines()) == 1  # on a line of its own
    as_json = runner.invoke(main, ["webhooks", "add", "crm2", "--url", url, "--json"], env=env)
    shown = json.loads(as_json.stdout)
    assert shown["url"] == f"http://127.0.0.1:{hook.port}" and shown["secret"].startswith("whsec_")
    rotated = runner.invoke(main, ["webhooks", "rotate", "crm"], env=env).stdout.strip()
    assert rotated.startswith("whsec_") and rotated != secret
    for args in (["webhooks", "list"], ["webhooks", "list", "--json"]):
        listed = runner.invoke(main, args, env=env)
        assert listed.exit_code == 0
        for hidden in (secret, rotated, shown["secret"], PATH_TOKEN, "Q-TOKEN"):
            assert hidden not in listed.output
    assert runner.invoke(main, ["webhooks", "remove", "crm2"], env=env).exit_code == 0
    assert "crm2" not in runner.invoke(main, ["webhooks", "list"], env=env).output


def test_add_refuses_a_url_with_user_info_in_one_line_without_showing_it(db_url: str) -> None:
    env = {"MARKETING_DATABASE_URL": db_url, "MARKETING_SECRETS_KEY": KEY}
    runner = CliRunner()
    for url in ("https://ana:PW-SECRET@hooks.example.com/x", "https://TOKEN-SECRET@hooks.example.com/x"):
        refused = runner.invoke(main, ["webhooks", "add", "crm", "--url", url], env=env)
        assert refused.exit_code != 0
        assert refused.output.strip().count("\n") == 0 and "holds user info" in refused.output
        assert "https://hooks.example.com" in refused.output
        assert "SECRET" not in refused.output
    assert "crm" not in runner.invoke(main, ["webhooks", "list"], env=env).output


def test_without_a_key_add_refuses_in_one_line_naming_the_variable(db_url: str, tmp_path) -> None:
    runner = CliRunner()
    env = {"MARKETING_DATABASE_URL": db_url, "MARKETING_SECRETS_KEY": ""}
    refused = runner.invoke(main, ["webhooks", "add", "crm", "--url", "https://hooks.example.com/x"], env=env)
    assert refused.exit_code != 0
    assert refused.output.strip().count("\n") == 0 and "MARKETING_SECRETS_KEY is not set" in refused.output
    bad = runner.invoke(
        main,
        ["webhooks", "add", "crm", "--url", "https://hooks.example.com/x"],
        env={**env, "MARKETING_SECRETS_KEY": "k3y-not-fernet"},
    )
    assert bad.exit_code != 0 and "not a Fernet key" in bad.output and "k3y-not-fernet" not in bad.output


def test_a_key_rotation_reseals_every_endpoint_under_the_new_key(
    engine: sa.Engine, db_url: str, hook: Recorder
) -> None:
    add_campaign(engine)
    secret = _add(engine, hook)
    new = new_key()
    runner = CliRunner()
    env = {"MARKETING_DATABASE_URL": db_url, "MARKETING_SECRETS_KEY": f"{new},{KEY}"}
    assert runner.invoke(main, ["webhooks", "reseal"], env=env).output.strip() == "resealed 1 endpoint(s)"
    with engine.connect() as conn:
        row = conn.execute(sa.select(webhook_endpoint)).one()
    assert SecretBox(new).open(row.secret_sealed) == secret  # the old key is no longer needed
    assert SecretBox(new).open(row.url_sealed).endswith(PATH_TOKEN)
