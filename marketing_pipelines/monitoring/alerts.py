"""Alerts to a Slack-compatible incoming webhook: what failed, told once, in one message per minute.

``AlertWebhook`` holds the destination (``MARKETING_ALERT_WEBHOOK_URL``, a secret: a Slack webhook's
path is its token, so it is shown only as scheme and host) and sends through the same
``WebhookClient`` as the webhook action, so the egress policy and its resolved-address check apply.
This module also reads, from the application database, which executions or agent run a failed
Dagster run held, and formats one message from the failures and check changes a tick collected.

The message is ``{"text": ...}`` in Slack mrkdwn: Slack, Mattermost, Rocket.Chat and Discord's
``/slack`` endpoint all take ``text``, while ``blocks`` are Slack's alone. Every piece of text that
comes from a run, a row or a check is untrusted: URLs in it keep only scheme and host, control
characters become spaces, ``&``, ``<``, ``>`` are escaped, ``@``, ``[``, ``]`` are written with their
full-width look-alikes (U+FF20, U+FF3B, U+FF3D), and schemes, domains, IP and e-mail addresses go through
``redact.unlinkable`` (a host's dots as U+2024, a scheme's colon as U+2236), so nothing in it can become a
link or a mention in any of those receivers (``mrkdwn``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

import dagster as dg
import httpx
import sqlalchemy as sa

from marketing_pipelines.db.schema import agent_run, marketing_execution, marketing_execution_attempt
from marketing_pipelines.egress import EgressRefused
from marketing_pipelines.executions.signing import body_bytes
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.redact import CONTROL_CHARACTERS, redact_text, unlinkable, url_origin, url_origins
from marketing_pipelines.settings import dagster_ui_base, env_name, setting_field, shown_in_ui

ALERT_URL_ENV = env_name("alert_webhook_url")
# A message lists at most this many runs and checks, and this many failed executions per run; it
# always counts them all. Slack truncates a message's text beyond 40,000 characters.
MAX_LISTED = 10
MAX_EXECUTIONS_LISTED = 3
MAX_REASON_CHARS = 300

# "dagster._core.definitions.events.Failure: message" -> "Failure: message".
_QUALIFIED_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)+(?=[A-Za-z_]\w*: )")


def neutralise(text: str) -> str:
    """Untrusted text as one line: every URL cut to scheme and host, credential echoes hidden, control and bidirectional
    characters as spaces (line breaks and the Unicode line separators fold with the other white space)."""
    return " ".join(CONTROL_CHARACTERS.sub(" ", url_origins(redact_text(text))).split())


# What would make untrusted text a mention or a link in one of the receivers OPERATIONS names, each
# written as a full-width look-alike that none of them parses: "@" (@channel, @here, @everyone, @all;
# Discord's <@id>) and Markdown's link and image brackets ([text](url), ![](url), [text][ref]). What
# they autolink (schemes, "www.", bare domains as Slack links them, IP and e-mail addresses) goes through
# ``unlinkable``; Slack's <url|text> is escaped below.
_INERT = str.maketrans({"@": "\uff20", "[": "\uff3b", "]": "\uff3d"})


def mrkdwn(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """Untrusted text made safe to place in a message to Slack, Mattermost, Rocket.Chat or Discord: one line
    (``neutralise``), cut to ``limit``, then nothing in it can be a link or a mention (``@`` ``[`` ``]`` as
    full-width look-alikes, ``unlinkable``, ``&`` ``<`` ``>`` escaped; after cutting, so an escape is never
    cut in half)."""
    text = neutralise(text)
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    text = unlinkable(text.translate(_INERT))
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def failure_reason(message: str | None) -> str:
    """The first line of a run's failure message, without the exception's module path."""
    first = next((line.strip() for line in (message or "").splitlines() if line.strip()), "")
    return _QUALIFIED_EXCEPTION.sub("", first) or "no failure message"


@dataclass(frozen=True)
class FailedExecution:
    execution_id: int
    campaign_id: str
    stage: str
    action: str
    error: str


@dataclass(frozen=True)
class AgentRunInfo:
    agent_run_id: int
    agent: str
    campaign_id: str
    requested_by: str
    status: str
    error: str | None


@dataclass(frozen=True)
class RunExecutions:
    """What the application database says about the executions a Dagster run performed."""

    total: int = 0
    failed_count: int = 0
    failed: tuple[FailedExecution, ...] = ()  # at most MAX_EXECUTIONS_LISTED


@dataclass(frozen=True)
class FailedRun:
    run_id: str
    job_name: str
    failed_at: datetime
    reason: str  # the run's failure message, first line, unredacted (formatting redacts)
    executions: RunExecutions | None = None  # for an execution run whose rows could be read
    agent_run: AgentRunInfo | None = None  # for an agent run whose row could be read
    details_unavailable: str | None = None  # why the application database could not tell more


@dataclass(frozen=True)
class CheckChange:
    """A check that went to failing at ERROR since the last tick, or came back from it."""

    check: str  # "asset:check"
    at: datetime
    entered_error: bool  # failed at ERROR at least once since the last tick
    at_error_now: bool
    description: str = ""


@dataclass(frozen=True)
class Alert:
    failed_runs: Sequence[FailedRun] = ()
    checks: Sequence[CheckChange] = ()

    @property
    def checks_at_error(self) -> list[CheckChange]:
        return [c for c in self.checks if c.entered_error]

    def summary(self) -> str:
        """One plain line, e.g. "3 failed runs, 1 check at ERROR": the tick's log line and the message's head."""
        parts = []
        if n := len(self.failed_runs):
            parts.append(f"{n} failed run{'s' if n != 1 else ''}")
        if n := len(self.checks_at_error):
            parts.append(f"{n} check{'s' if n != 1 else ''} at ERROR")
        if n := sum(1 for c in self.checks if not c.entered_error):
            parts.append(f"{n} check{'s' if n != 1 else ''} recovered")
        return ", ".join(parts)

    def __bool__(self) -> bool:
        return bool(self.failed_runs or self.checks)


def executions_of_runs(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, RunExecutions]:
    """Per Dagster run id: how many executions it attempted, and its FAILED ones with their reasons."""
    if not run_ids:
        return {}
    a, e = marketing_execution_attempt, marketing_execution
    totals = conn.execute(
        sa.select(
            a.c.run_id,
            sa.func.count().label("total"),
            sa.func.count().filter(a.c.outcome == "FAILED").label("failed"),
        )
        .where(a.c.run_id.in_(run_ids))
        .group_by(a.c.run_id)
    ).all()
    failed_rows = conn.execute(
        sa.select(a.c.run_id, a.c.execution_id, a.c.error, e.c.campaign_id, e.c.stage, e.c.action)
        .join(e, e.c.id == a.c.execution_id)
        .where(a.c.run_id.in_(run_ids), a.c.outcome == "FAILED")
        .order_by(a.c.run_id, a.c.execution_id)
    ).all()
    listed: dict[str, list[FailedExecution]] = defaultdict(list)
    for row in failed_rows:
        if len(listed[row.run_id]) < MAX_EXECUTIONS_LISTED:
            listed[row.run_id].append(
                FailedExecution(row.execution_id, row.campaign_id, row.stage, row.action, row.error or "")
            )
    return {
        row.run_id: RunExecutions(total=row.total, failed_count=row.failed, failed=tuple(listed[row.run_id]))
        for row in totals
    }


def agent_runs_of_runs(conn: sa.Connection, run_ids: Sequence[str]) -> dict[str, AgentRunInfo]:
    """Per Dagster run id: the agent run it performed (its latest attempt's run)."""
    if not run_ids:
        return {}
    t = agent_run
    rows = conn.execute(
        sa.select(t.c.run_id, t.c.id, t.c.agent, t.c.campaign_id, t.c.requested_by, t.c.status, t.c.error).where(
            t.c.run_id.in_(run_ids)
        )
    ).all()
    return {r.run_id: AgentRunInfo(r.id, r.agent, r.campaign_id, r.requested_by, r.status, r.error) for r in rows}


def ui_base(ui_url: str | None) -> str | None:
    """The Dagster UI's base URL for links; None when unset or not one a link may carry (no link then)."""
    try:
        return dagster_ui_base(ui_url.strip() if ui_url else ui_url)
    except ValueError:
        return None


def _run_label(run_id: str, ui: str | None) -> str:
    short = mrkdwn(run_id[:8])
    if ui is None:
        return f"run `{short}`"
    link = f"{ui}/runs/{run_id}".replace("&", "&amp;").replace("<", "%3C").replace(">", "%3E").replace("|", "%7C")
    return f"run <{link}|{short}>"


def _run_lines(run: FailedRun, ui: str | None) -> list[str]:
    label = _run_label(run.run_id, ui)
    if run.agent_run is not None:
        a = run.agent_run
        reason = a.error or run.reason
        who = f"{mrkdwn(a.agent, 64)}, {mrkdwn(a.campaign_id, 64)}, requested by {mrkdwn(a.requested_by, 64)}"
        # A run that failed an attempt with attempts left leaves the row queued for the next one.
        now = "" if a.status == "FAILED" else f" (now {mrkdwn(a.status, 16)})"
        return [f"• Agent run {a.agent_run_id} ({who}) failed in {label}{now}: {mrkdwn(reason)}"]
    if run.executions is not None and run.executions.failed_count:
        ex = run.executions
        lines = [f"• {label} of {mrkdwn(run.job_name, 64)}: {ex.failed_count} of {ex.total} execution(s) FAILED"]
        lines += [
            f"    - execution {f.execution_id} ({mrkdwn(f.campaign_id, 64)}/{mrkdwn(f.stage, 64)}, "
            f"{mrkdwn(f.action, 64)}): {mrkdwn(f.error)}"
            for f in ex.failed
        ]
        if (more := ex.failed_count - len(ex.failed)) > 0:
            lines.append(f"    - and {more} more")
        return lines
    held = ""
    if run.executions is not None and run.executions.total:
        held = f" (it held {run.executions.total} execution(s))"
    elif run.details_unavailable:
        held = f" (details unavailable: {mrkdwn(run.details_unavailable, 120)})"
    return [f"• {label} of {mrkdwn(run.job_name, 64)} failed: {mrkdwn(run.reason)}{held}"]


def _check_line(change: CheckChange) -> str:
    name = f"`{mrkdwn(change.check, 120)}`"
    if not change.entered_error:
        return f"• Check {name} is no longer at ERROR."
    since = "" if change.at_error_now else " (since recovered)"
    detail = f": {mrkdwn(change.description)}" if change.description else ""
    return f"• Check {name} failed at ERROR{since}{detail}"


def format_alert(alert: Alert, ui_url: str | None = None, location: str = "marketing-pipelines") -> str:
    """The message's mrkdwn text: a head that counts everything, then at most ``MAX_LISTED`` items."""
    ui = ui_base(ui_url)
    times = [r.failed_at for r in alert.failed_runs] + [c.at for c in alert.checks]
    first, last = min(times), max(times)
    start, end = f"{first:%Y-%m-%d %H:%M}", f"{last:%Y-%m-%d %H:%M}"
    span = f"{start} UTC" if start == end else f"{start} to {end[11:] if end[:10] == start[:10] else end} UTC"
    icon = ":rotating_light:" if alert.failed_runs or alert.checks_at_error else ":white_check_mark:"
    lines = [f"{icon} *{mrkdwn(location, 64)}*: {alert.summary()} ({span})"]
    items: list[list[str]] = [_run_lines(r, ui) for r in alert.failed_runs] + [[_check_line(c)] for c in alert.checks]
    for item in items[:MAX_LISTED]:
        lines += item
    if (more := len(items) - MAX_LISTED) > 0:
        lines.append(f"…and {more} more{' (see the Runs page)' if ui is None else f': <{ui}/runs|Runs>'}")
    return "\n".join(lines)


@dataclass(frozen=True)
class Delivery:
    delivered: bool
    detail: str  # one line, the destination shown as scheme and host only


@dataclass
class _Scrubber:
    """Removes the webhook URL's secret parts from text about a failed POST (an httpx error may quote
    the URL it connected to, path included)."""

    url: str
    secrets: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        try:
            parts = urlsplit(self.url)
        except ValueError:
            return
        self.secrets = [s for s in (parts.path, parts.query, parts.username, parts.password) if s and s != "/"]

    def __call__(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, "***")
        return neutralise(text)[:MAX_REASON_CHARS]


@shown_in_ui
class AlertWebhook(dg.ConfigurableResource):
    """Where alerts go: a Slack-compatible incoming webhook, or nowhere when ``url`` is empty.

    In ``Definitions`` ``url`` is ``dg.EnvVar("MARKETING_ALERT_WEBHOOK_URL")`` when that is set, so
    only the variable's name shows in the UI; messages and tick reasons show its scheme and host.
    """

    url: str | None = setting_field("alert_webhook_url")
    dagster_ui_url: str | None = setting_field("dagster_ui_url")

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    def destination(self) -> str:
        """The webhook as it may be shown: scheme and host."""
        return url_origin(self.url) if self.url else "nowhere (alerts are off)"

    def send(self, text: str, client: WebhookClient) -> Delivery:
        """POST ``{"text": text}`` through ``client`` (its egress policy, timeout and pinned address)."""
        url, shown = self.url or "", self.destination()
        if not url:
            return Delivery(False, f"alerts are off ({ALERT_URL_ENV} is not set)")
        scrub = _Scrubber(url)
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018 - parses the port, raising on a bad one
        except ValueError:
            return Delivery(False, f"{ALERT_URL_ENV} is not a URL")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            return Delivery(False, f"{ALERT_URL_ENV} is not an http(s) URL ({shown})")
        try:
            # httpx's request log line shows the URL redacted (http.redact_httpx_logs, installed by the client).
            response = client.post(url, body_bytes({"text": text}), {"Content-Type": "application/json"})
        except EgressRefused as exc:
            return Delivery(False, f"alert webhook {shown} refused by the egress policy: {scrub(str(exc))}")
        except (TimeoutError, httpx.TimeoutException):
            return Delivery(False, f"alert webhook {shown} timed out after {client.timeout_s}s")
        except (httpx.TransportError, OSError) as exc:
            return Delivery(False, f"alert webhook {shown} unreachable: {scrub(f'{type(exc).__name__}: {exc}')}")
        if not 200 <= response.status_code < 300:
            snippet = scrub(response.text[:200])
            return Delivery(False, f"alert webhook {shown} answered HTTP {response.status_code}: {snippet}")
        return Delivery(True, f"sent to {shown}")


def describe_failed_runs(
    conn: sa.Connection | None,
    runs: Iterable[tuple[str, str, datetime, str]],
    execution_job: str,
    agent_job: str,
    unavailable: str | None = None,
) -> list[FailedRun]:
    """``(run_id, job_name, failed_at, reason)`` of failed runs -> `FailedRun`s with what the
    application database says they held; ``conn`` None: it could not be read (``unavailable`` says why)."""
    runs = list(runs)
    executions: Mapping[str, RunExecutions] = {}
    agents: Mapping[str, AgentRunInfo] = {}
    if conn is not None:
        executions = executions_of_runs(conn, [r[0] for r in runs if r[1] == execution_job])
        agents = agent_runs_of_runs(conn, [r[0] for r in runs if r[1] == agent_job])
    described = []
    for run_id, job_name, failed_at, reason in runs:
        described.append(
            FailedRun(
                run_id,
                job_name,
                failed_at,
                reason,
                executions=executions.get(run_id, RunExecutions()) if job_name == execution_job and conn else None,
                agent_run=agents.get(run_id),
                details_unavailable=unavailable,
            )
        )
    return described
