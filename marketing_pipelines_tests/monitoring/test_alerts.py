"""marketing_alerts_sensor against real runs, a real Dagster instance and a local Slack-compatible receiver."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.agents.jobs import agent_run_job
from marketing_pipelines.agents.resources import AgentSettings
from marketing_pipelines.db.resources import AppDatabase
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.resources import ExecutionSettings
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.monitoring.alert_sensor import AlertCursor, marketing_alerts_sensor
from marketing_pipelines.monitoring.alerts import (
    AgentRunInfo,
    Alert,
    AlertWebhook,
    CheckChange,
    FailedRun,
    format_alert,
    mrkdwn,
)
from marketing_pipelines.redact import url_origin
from marketing_pipelines_tests.agents.fake_models import unconfigured_models
from marketing_pipelines_tests.agents.runs import AGENT_RESOURCES
from marketing_pipelines_tests.built import due_executions_sensor, queued_agent_runs_sensor
from marketing_pipelines_tests.executions.runs import LOCAL, perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign, request_offline_analysis
from marketing_pipelines_tests.webserver import Recorder, webhook_server

SECRET = "T000/B000/XXXXSECRETXXXX"


@pytest.fixture
def slack() -> Iterator[Recorder]:
    """The alert receiver."""
    with webhook_server() as recorder:
        yield recorder


@pytest.fixture
def target() -> Iterator[Recorder]:
    """The executions' own webhook receiver; it answers 500, so their attempts fail."""
    with webhook_server(status=500) as recorder:
        yield recorder


def _alert_url(slack: Recorder) -> str:
    return f"{slack.url}/services/{SECRET}"


def _tick(
    instance: dg.DagsterInstance,
    db_url: str,
    cursor: str | None,
    url: str | None,
    allow: list[str] = LOCAL,
    definitions: dg.Definitions | None = None,
    ui_url: str | None = None,
) -> dg.SensorResult:
    context = dg.build_sensor_context(
        instance=instance,
        cursor=cursor,
        definitions=definitions,
        resources={
            "alerts": AlertWebhook(url=url, dagster_ui_url=ui_url),
            "webhook": WebhookClient(timeout_s=5, allow_networks=allow),
            "app_db": AppDatabase(url=db_url),
        },
    )
    result = marketing_alerts_sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def _start(instance: dg.DagsterInstance, db_url: str, slack: Recorder, **kw: Any) -> str:
    """The first tick: it only sets the cursor."""
    first = _tick(instance, db_url, None, _alert_url(slack), **kw)
    assert first.cursor is not None and slack.received == []
    return first.cursor


def _fail_executions(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance, target: Recorder, n: int = 1
) -> list[dg.ExecuteInProcessResult]:
    """``n`` executions whose only attempt fails (the receiver answers 500), one run each."""
    add_campaign(engine)
    with engine.begin() as conn:
        for i in range(n):
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) - timedelta(seconds=n - i),
                payload={"url": f"{target.url}/{i}?token=hunter2", "body": {"n": i}},
                max_attempts=1,
                egress=EgressPolicy(parse_networks(LOCAL)),
            )
    requests = sensor_requests(due_executions_sensor, db_url, instance, ExecutionSettings(executions_per_run=1))
    results = [perform(r, db_url, instance) for r in requests]
    assert len(results) == n and not any(r.success for r in results)
    return results


def _reason(result: dg.SensorResult) -> str:
    return result.skip_reason.skip_message or "" if result.skip_reason else ""


def _text(slack: Recorder) -> list[str]:
    return [r.body["text"] for r in slack.received]


def test_a_failed_execution_run_alerts_once_with_its_executions(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, slack: Recorder, target: Recorder
) -> None:
    cursor = _start(instance, db_url, slack)
    [run] = _fail_executions(engine, db_url, instance, target)
    result = _tick(instance, db_url, cursor, _alert_url(slack), ui_url="http://dagster.example:3000/")
    [message] = _text(slack)
    assert set(slack.received[0].body) == {"text"}  # Slack's incoming-webhook shape
    assert slack.received[0].path == f"/hook/services/{SECRET}"
    assert "1 failed run" in message.splitlines()[0]
    assert f"<http://dagster.example:3000/runs/{run.run_id}|{run.run_id[:8]}>" in message
    assert "1 of 1 execution(s) FAILED" in message
    assert "execution 1 (spring-launch/launch, webhook)" in message
    # The reason, with the execution's receiver shown as scheme and host only.
    assert f"webhook http\u2236//127\u20240\u20240\u20241:{target.port} answered HTTP 500" in message
    assert "/hook/0" not in message and "hunter2" not in message
    assert "more" not in message  # one item listed: nothing left to count (it once said "and -9 more")
    assert "Alerted 1 failed run" in _reason(result)
    assert "http://127.0.0.1" in _reason(result) and SECRET not in _reason(result)

    # The next tick, and a restarted daemon resuming from the persisted cursor, send nothing more.
    again = _tick(instance, db_url, result.cursor, _alert_url(slack))
    restarted = _tick(instance, db_url, again.cursor or result.cursor, _alert_url(slack))
    assert len(slack.received) == 1
    assert _reason(restarted) == "Nothing failed since the last tick."


def test_a_burst_of_failures_is_one_message_that_counts_them(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, slack: Recorder, target: Recorder
) -> None:
    cursor = _start(instance, db_url, slack)
    runs = _fail_executions(engine, db_url, instance, target, n=3)
    _tick(instance, db_url, cursor, _alert_url(slack))
    [message] = _text(slack)
    assert "3 failed runs" in message.splitlines()[0]
    assert all(f"`{r.run_id[:8]}`" in message for r in runs)
    assert [f"execution {i} (" in message for i in (1, 2, 3)] == [True, True, True]


def test_a_run_that_failed_before_recording_outcomes_says_why(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, slack: Recorder, tmp_path: Any
) -> None:
    cursor = _start(instance, db_url, slack)
    add_campaign(engine)
    with engine.begin() as conn:
        schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action="log",
            due_at=datetime.now(UTC),
            payload={"message": "hi"},
        )
    [request] = sensor_requests(due_executions_sensor, db_url, instance)
    # The run's own database is one nobody migrated: it fails before it attempts anything.
    unmigrated = AppDatabase(url=f"sqlite:///{tmp_path / 'empty.db'}")
    assert not perform(request, db_url, instance, app_db=unmigrated).success
    _tick(instance, db_url, cursor, _alert_url(slack))
    [message] = _text(slack)
    assert "of marketing_execution_job failed: " in message and "execution(s) FAILED" not in message


def test_a_failed_agent_run_alerts_with_its_agent_and_reason(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, slack: Recorder
) -> None:
    add_campaign(engine)
    with engine.begin() as conn:
        users.add_user(conn, "ben")
        users.grant(conn, "ben", "measurement:read")
        agent_run_id = request_offline_analysis(conn, "ben")
        users.set_active(conn, "ben", False)
    cursor = _start(instance, db_url, slack)
    context = dg.build_sensor_context(
        instance=instance, resources={"app_db": AppDatabase(url=db_url), "agent_settings": AgentSettings()}
    )
    [request] = queued_agent_runs_sensor(context).run_requests
    run = agent_run_job.execute_in_process(
        run_config=request.run_config,
        tags=request.tags,
        instance=instance,
        resources={"app_db": AppDatabase(url=db_url), **unconfigured_models(), **AGENT_RESOURCES},
        raise_on_error=False,
    )
    assert not run.success
    _tick(instance, db_url, cursor, _alert_url(slack))
    [message] = _text(slack)
    assert f"Agent run {agent_run_id} (measurement_analyst, spring-launch, requested by ben) failed" in message
    assert "ben is not active" in message


def test_a_failed_run_of_another_job_is_not_alerted(db_url: str, instance: dg.DagsterInstance, slack: Recorder) -> None:
    @dg.op
    def explode() -> None:
        raise RuntimeError("not ours")

    @dg.job
    def other_job() -> None:
        explode()

    cursor = _start(instance, db_url, slack)
    assert not other_job.execute_in_process(instance=instance, raise_on_error=False).success
    result = _tick(instance, db_url, cursor, _alert_url(slack))
    assert slack.received == [] and _reason(result) == "Nothing failed since the last tick."
    assert result.cursor != cursor  # read past it, never to be read again


def _closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/services/{SECRET}"


@pytest.mark.parametrize("down", ["http_500", "connection_refused"])
def test_a_receiver_that_is_down_gets_the_alert_at_a_later_tick(
    down: str,
    db_url: str,
    engine: sa.Engine,
    instance: dg.DagsterInstance,
    slack: Recorder,
    target: Recorder,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cursor = _start(instance, db_url, slack)
    _fail_executions(engine, db_url, instance, target)
    if down == "http_500":
        slack.status, url = 500, _alert_url(slack)
    else:
        url = _closed_port_url()
    with caplog.at_level(logging.DEBUG):
        failed = _tick(instance, db_url, cursor, url)
    assert failed.cursor is None  # not advanced
    reason = _reason(failed)
    assert "not delivered" in reason and "\n" not in reason
    assert ("HTTP 500" in reason) if down == "http_500" else ("unreachable" in reason)
    # The URL shows as scheme and host only, wherever the tick says anything.
    shown = reason + caplog.text + "".join(capsys.readouterr())
    assert SECRET not in shown and "/services" not in shown
    assert url_origin(url) in reason

    slack.status = 200
    delivered = _tick(instance, db_url, cursor, _alert_url(slack))
    assert len(slack.received) == (2 if down == "http_500" else 1)
    assert "1 failed run" in slack.received[-1].body["text"]
    _tick(instance, db_url, delivered.cursor, _alert_url(slack))
    assert len(slack.received) == (2 if down == "http_500" else 1)


@pytest.mark.parametrize(
    ("url", "allow", "why"),
    [
        # Cloud metadata: never, whatever an operator allows.
        (f"http://169.254.169.254/services/{SECRET}", LOCAL, "link-local"),
        # Loopback, not allowed by the operator here.
        (None, [], "MARKETING_WEBHOOK_ALLOW_NETWORKS"),
    ],
)
def test_a_url_the_egress_policy_refuses_sends_nothing_and_says_why(
    url: str | None,
    allow: list[str],
    why: str,
    db_url: str,
    engine: sa.Engine,
    instance: dg.DagsterInstance,
    slack: Recorder,
    target: Recorder,
) -> None:
    url = url or _alert_url(slack)
    cursor = _start(instance, db_url, slack)
    _fail_executions(engine, db_url, instance, target)
    result = _tick(instance, db_url, cursor, url, allow=allow)
    reason = _reason(result)
    assert slack.received == [] and result.cursor is None
    assert "refused by the egress policy" in reason and why in reason and "\n" not in reason
    assert SECRET not in reason


def test_alerts_off_send_nothing_and_do_not_keep_a_backlog(
    db_url: str, engine: sa.Engine, instance: dg.DagsterInstance, slack: Recorder, target: Recorder
) -> None:
    cursor = _tick(instance, db_url, None, None).cursor
    _fail_executions(engine, db_url, instance, target)
    off = _tick(instance, db_url, cursor, None)
    assert _reason(off) == "Alerts are off (MARKETING_ALERT_WEBHOOK_URL is not set): 1 failed run not sent."
    # Turned on later: what failed while they were off is not sent.
    on = _tick(instance, db_url, off.cursor, _alert_url(slack))
    assert slack.received == [] and _reason(on) == "Nothing failed since the last tick."


def _queue_checks() -> dg.Definitions:
    """The queue health checks as the code location defines them: external assets with checks that
    a sensor evaluates (these bodies never run)."""

    @dg.asset_check(asset="execution_queue", name="due_lag")
    def due_lag() -> dg.AssetCheckResult:
        raise NotImplementedError

    @dg.asset_check(asset="execution_queue", name="failed_last_hour")
    def failed_last_hour() -> dg.AssetCheckResult:
        raise NotImplementedError

    return dg.Definitions(assets=[dg.AssetSpec("execution_queue")], asset_checks=[due_lag, failed_last_hour])


def _evaluate(instance: dg.DagsterInstance, check: str, passed: bool, severity: dg.AssetCheckSeverity) -> None:
    instance.report_runless_asset_event(
        dg.AssetCheckEvaluation(
            asset_key=dg.AssetKey("execution_queue"),
            check_name=check,
            passed=passed,
            severity=severity,
            description=None if passed else "oldest due execution waits <!channel> 2400 s",
            metadata={"oldest_due_seconds": 2400.0},
        )
    )


def test_a_check_at_error_alerts_once_and_warn_never(
    sqlite_url: str, instance: dg.DagsterInstance, slack: Recorder
) -> None:
    ERROR, WARN = dg.AssetCheckSeverity.ERROR, dg.AssetCheckSeverity.WARN

    def tick(cursor: str | None) -> str | None:
        result = _tick(instance, sqlite_url, cursor, _alert_url(slack), definitions=_queue_checks())
        return result.cursor or cursor

    cursor = tick(None)
    _evaluate(instance, "due_lag", passed=False, severity=ERROR)
    _evaluate(instance, "failed_last_hour", passed=False, severity=WARN)
    cursor = tick(cursor)
    [message] = _text(slack)
    assert "1 check at ERROR" in message.splitlines()[0]
    assert "Check `execution_queue:due_lag` failed at ERROR: oldest due execution waits &lt;!channel&gt; 2400 s" in (
        message
    )
    assert "failed_last_hour" not in message

    # Still at ERROR a minute later, twice: nothing new to say.
    for _ in range(2):
        _evaluate(instance, "due_lag", passed=False, severity=ERROR)
        _evaluate(instance, "failed_last_hour", passed=False, severity=WARN)
        cursor = tick(cursor)
    assert len(slack.received) == 1

    _evaluate(instance, "due_lag", passed=True, severity=ERROR)
    cursor = tick(cursor)
    assert len(slack.received) == 2
    assert "Check `execution_queue:due_lag` is no longer at ERROR." in _text(slack)[1]
    tick(cursor)
    assert len(slack.received) == 2


def test_shown_text_cannot_become_markup_or_leak_a_url() -> None:
    text = mrkdwn("a\x1b[31m <https://x.example/p?t=1|click> & \u2028 https://u:pw@h.example:8443/secret/path")
    # The link's label goes with its URL, which keeps only scheme and host, and neither autolinks.
    assert text == "a \uff3b31m &lt;https\u2236//x\u2024example&gt; &amp; https\u2236//h\u2024example\u22368443"
    assert url_origin(f"https://hooks.slack.com/services/{SECRET}") == "https://hooks.slack.com"
    # A right-to-left override would show the rest of the line reversed in Slack.
    assert mrkdwn("run \u202egnp.exe failed") == "run gnp\u2024exe failed"


@pytest.mark.parametrize(
    ("hostile", "shown"),
    [
        # Slack: special mentions and its own link syntax.
        (
            "<!channel> <!here|here> <@U024BE7LH> <https://evil.example|click>",
            "&lt;!channel&gt; &lt;!here|here&gt; &lt;\uff20U024BE7LH&gt; &lt;https\u2236//evil\u2024example&gt;",
        ),
        # Mattermost and Rocket.Chat: @-mentions and Markdown links, images and references.
        (
            "@channel @all @here [click](https://evil.example/x) ![img](https://evil.example/p.png) [r][1]",
            "\uff20channel \uff20all \uff20here \uff3bclick\uff3d(https\u2236//evil\u2024example) "
            "!\uff3bimg\uff3d(https\u2236//evil\u2024example) \uff3br\uff3d\uff3b1\uff3d",
        ),
        # Discord (through /slack): @everyone, <@id> and masked links.
        (
            "@everyone <@80351110224678912> [docs](http://evil.example)",
            "\uff20everyone &lt;\uff2080351110224678912&gt; \uff3bdocs\uff3d(http\u2236//evil\u2024example)",
        ),
        # Every receiver: bare URLs and www. autolink, e-mail addresses become mailto links.
        (
            "see https://evil.example or WWW.evil.example or ana@evil.example",
            "see https\u2236//evil\u2024example or WWW\u2024evil\u2024example or ana\uff20evil\u2024example",
        ),
        # Slack (and a Unicode-aware linkifier): bare domains and IP addresses, IDNA's other full stops.
        (
            "evil.example/x 1.2.3.4/admin mailto:a@evil.example evil\uff0eexample [::1]",
            "evil\u2024example/x 1\u20242\u20243\u20244/admin mailto\u2236a\uff20evil\u2024example "
            "evil\u2024example \uff3b\u2236\u22361\uff3d",
        ),
    ],
)
def test_nothing_a_receiver_or_model_wrote_becomes_a_link_or_a_mention(hostile: str, shown: str) -> None:
    assert mrkdwn(hostile) == shown
    # Through the whole message, with no UI link of ours: no link or mention syntax of any receiver remains.
    alert = Alert(
        [
            FailedRun(
                "0123456789abcdef",
                "agent_run_job",
                datetime(2026, 12, 3, tzinfo=UTC),
                hostile,
                agent_run=AgentRunInfo(7, "@here", "[c](https://evil.example)", "ana@x.example", "FAILED", hostile),
            ),
            FailedRun("fedcba9876543210", "other_job", datetime(2026, 12, 3, tzinfo=UTC), hostile),
        ],
        [CheckChange(f"q:{hostile}", datetime(2026, 12, 3, tzinfo=UTC), True, True, hostile)],
    )
    text = format_alert(alert, location=hostile)
    for markup in ("@", "[", "]", "://", "<", ">", "www.", "evil.", "mailto:", "1.2"):
        assert markup not in text.lower(), markup


def test_a_ui_url_a_link_may_not_carry_gives_no_link() -> None:
    alert = Alert([FailedRun("0123456789abcdef", "agent_run_job", datetime(2026, 12, 3, tzinfo=UTC), "boom")])
    assert "<http://ui.example:3000/runs/0123456789abcdef|01234567>" in format_alert(alert, "http://ui.example:3000/")
    for refused in ("http://u:pw@ui.example:3000", "http://ui.example:3000/?t=1", "ftp://ui.example"):
        text = format_alert(alert, refused)
        assert "run `01234567`" in text and "ui.example" not in text and "pw" not in text


def test_the_cursor_survives_a_round_trip_and_a_foreign_cursor_restarts() -> None:
    assert AlertCursor.from_json(AlertCursor(7, {}).to_json()) == AlertCursor(7, {})
    assert AlertCursor.from_json("not json") is None
    assert AlertCursor.from_json('{"record_id": 3}') is None
