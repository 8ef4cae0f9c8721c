"""A webhook's destination, time and response are bounded, and its secrets are never shown.

Each case was a reproduced defect: any http(s) URL was accepted (cloud metadata, the database's
port, hex-encoded loopback), a receiver dripping one byte a second held a run past its timeout,
a 50 MB error body was read to quote 200 characters, and a URL's password and token appeared in
``last_error``, the run log and ``executions list``.
"""

from __future__ import annotations

import functools
import ipaddress
import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from marketing_pipelines.cli import main
from marketing_pipelines.db.schema import marketing_execution
from marketing_pipelines.egress import EgressPolicy, EgressRefused, parse_networks
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.actions import ActionContext, ActionFailed, WebhookAction
from marketing_pipelines.executions.queue import get_execution, schedule_execution
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.redact import redact_url, redact_urls
from marketing_pipelines.sealing import key_source, new_key
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.executions.runs import perform, sensor_requests
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.processes import child_env
from marketing_pipelines_tests.webserver import webhook_server

# Header values are stored sealed: scheduling them needs the keys, as Settings.sealing_keys finds them.
KEY = new_key()
KEYS = functools.partial(key_source, KEY, None)
NONE = EgressPolicy()
LOOPBACK = EgressPolicy(parse_networks("127.0.0.1/32"))
EVERYTHING = EgressPolicy(parse_networks("0.0.0.0/0,::/0"))


def _schedule(engine: sa.Engine, url: str, egress: EgressPolicy, **payload: Any) -> int:
    with engine.begin() as conn:
        return schedule_execution(
            conn,
            campaign_id="spring-launch",
            stage="launch",
            action="webhook",
            due_at=datetime.now(UTC) - timedelta(seconds=1),
            payload={"url": url, **payload},
            max_attempts=1,
            egress=egress,
            keys=KEYS,
        )


@pytest.mark.parametrize(
    ("url", "egress", "refused"),
    [
        ("http://169.254.169.254/latest/meta-data/", EVERYTHING, "link-local or cloud metadata"),  # AWS/GCP/Azure
        ("http://[fe80::1]/", EVERYTHING, "link-local"),
        ("http://[::ffff:169.254.169.254]/", EVERYTHING, "link-local"),  # IPv4-mapped IPv6
        ("http://100.100.100.200/latest/", EVERYTHING, "cloud metadata"),  # Alibaba Cloud
        ("http://metadata.google.internal/computeMetadata/v1/", EVERYTHING, "cloud metadata"),
        ("http://127.0.0.1:5432/", NONE, "loopback address; an operator can allow it"),  # the database
        ("http://0x7f000001:8080/", NONE, "loopback"),  # hex form a resolver accepts
        ("http://2130706433/", NONE, "loopback"),  # decimal form
        ("http://127.1/", NONE, "loopback"),  # short form
        ("http://localhost:8080/", NONE, "loopback"),
        ("http://10.1.2.3/", NONE, "private or internal"),
        ("http://[::1]/", NONE, "loopback"),
        ("http://0.0.0.0/", EVERYTHING, "unspecified"),
        ("https://user:pw@127.0.0.1/?token=x", NONE, "loopback"),
    ],
)
def test_disallowed_destinations_are_refused_when_scheduled(
    engine: sa.Engine, url: str, egress: EgressPolicy, refused: str
) -> None:
    add_campaign(engine)
    with pytest.raises(InvalidInput, match=refused) as caught:
        _schedule(engine, url, egress)
    assert "pw" not in str(caught.value) and "token" not in str(caught.value)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one() == 0


# Run in a child whose environment allows loopback: a caller that passes no policy gets the strictest one,
# never its own process's (before, schedule_execution read MARKETING_WEBHOOK_ALLOW_NETWORKS and accepted it).
_SCHEDULE_WITHOUT_A_POLICY = """
import sys
from datetime import UTC, datetime
from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.executions.queue import schedule_execution
with get_engine(sys.argv[1]).begin() as conn:
    try:
        schedule_execution(conn, campaign_id="spring-launch", stage="launch", action="webhook",
                           due_at=datetime.now(UTC), payload={"url": "http://127.0.0.1:9/hook"})
    except InvalidInput as exc:
        sys.exit(f"refused: {exc}")
"""


def test_a_schedule_without_a_policy_gets_the_strictest_not_the_processs_environment(
    db_url: str, engine: sa.Engine
) -> None:
    add_campaign(engine)
    child = subprocess.run(
        [sys.executable, "-c", _SCHEDULE_WITHOUT_A_POLICY, db_url],
        env=child_env(MARKETING_WEBHOOK_ALLOW_NETWORKS="127.0.0.1/32"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 1 and "refused: " in child.stderr and "loopback address" in child.stderr, child.stderr
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(marketing_execution)).scalar_one() == 0


@pytest.mark.parametrize(
    ("url", "egress"),
    [
        ("https://hooks.example.com/launch", NONE),  # a name: checked when sent, on its addresses
        ("http://93.184.215.14/hook", NONE),  # a public address
        ("http://127.0.0.1:8080/hook", LOOPBACK),  # allowed by the operator
        ("http://[2606:4700::1111]/x", NONE),  # a global IPv6 literal
        ("http://[2001:db8::7]:8443/x", EgressPolicy(parse_networks("2001:db8::/32"))),  # an allowed IPv6 range
    ],
)
def test_allowed_destinations_are_accepted(engine: sa.Engine, url: str, egress: EgressPolicy) -> None:
    add_campaign(engine)
    assert _schedule(engine, url, egress) > 0


@pytest.mark.parametrize("header", ["Host", "idempotency-key", "Marketing-Attempt"])
def test_a_payload_cannot_set_the_actions_own_headers(engine: sa.Engine, header: str) -> None:
    add_campaign(engine)
    with pytest.raises(InvalidInput, match=f"may not set the header.*{header}"):
        _schedule(engine, "https://hooks.example.com/x", NONE, headers={header: "x"})


def _tick_and_run(db_url: str, instance: dg.DagsterInstance, webhook: WebhookClient) -> dg.ExecuteInProcessResult:
    [request] = sensor_requests(due_executions_sensor, db_url, instance)
    return perform(request, db_url, instance, webhook)


def test_the_resolved_address_is_checked_again_when_sent(db_url: str, engine: sa.Engine) -> None:
    # Scheduled while loopback was allowed; by send time the sender allows nothing private. The
    # address the name resolves to now is what counts, and a refusal is final: FAILED, no retry.
    add_campaign(engine)
    with webhook_server() as hook, dg.instance_for_test() as instance:
        execution_id = _schedule(engine, f"http://127.0.0.1:{hook.port}/hook", LOOPBACK)
        with engine.begin() as conn:
            conn.execute(sa.update(marketing_execution).values(max_attempts=3))
        result = _tick_and_run(db_url, instance, WebhookClient(timeout_s=5))
        assert not result.success  # a FAILED execution fails its run
        assert hook.received == []
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
    assert row is not None and (row["status"], row["attempts"]) == ("FAILED", 1)
    assert "refused" in row["last_error"] and "loopback" in row["last_error"]


@dataclass
class SlowServer:
    port: int
    sent: int = 0  # body bytes the server managed to send before the client went away
    finished: bool = False


@contextmanager
def raw_server(status: int, length: int, chunk: int, pause_s: float) -> Iterator[SlowServer]:
    """Answers one request with ``length`` body bytes, ``chunk`` at a time with ``pause_s`` between."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    server = SlowServer(listener.getsockname()[1])
    stop = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head = f"HTTP/1.1 {status} X\r\nContent-Length: {length}\r\nContent-Type: text/plain\r\n\r\n"
            conn.sendall(head.encode())
            try:
                while server.sent < length and not stop.is_set():
                    conn.sendall(b"x" * min(chunk, length - server.sent))
                    server.sent += min(chunk, length - server.sent)
                    stop.wait(pause_s)
                server.finished = server.sent == length
            except OSError:
                pass  # the client closed: it stopped reading

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        stop.set()
        thread.join(timeout=10)
        listener.close()


def _send(port: int, timeout_s: float) -> None:
    ctx = ActionContext(7, 1, "spring-launch", "launch", logging.getLogger("test"))
    client = WebhookClient(timeout_s=timeout_s, allow_networks=["127.0.0.1/32"])
    WebhookAction().run(ctx, {"url": f"http://127.0.0.1:{port}/hook"}, client)


def test_the_timeout_bounds_the_whole_request_not_each_read() -> None:
    # 100 bytes, one every 0.1 s: each read is quick, the whole answer takes 10 s.
    with (
        raw_server(200, length=100, chunk=1, pause_s=0.1) as server,
        pytest.raises(ActionFailed, match=r"timed out after 1.0s"),
    ):
        _send(server.port, timeout_s=1.0)
    assert not server.finished and server.sent < 100


def test_a_huge_error_body_is_not_read() -> None:
    with (
        raw_server(500, length=50 * 1024 * 1024, chunk=256 * 1024, pause_s=0.0) as server,
        pytest.raises(ActionFailed, match=r"answered HTTP 500: x{200}$"),
    ):
        _send(server.port, timeout_s=10.0)
    # The client stopped after its few kilobytes; the kernel's buffers took a few megabytes more.
    assert not server.finished and server.sent < 50 * 1024 * 1024


SECRETS = ("s3cretpw", "SECRETTOKEN", "HEADERSECRET")


def test_url_credentials_and_query_are_redacted_wherever_shown(db_url: str, engine: sa.Engine) -> None:
    add_campaign(engine)
    # .invalid never resolves (RFC 2606): the attempt fails with the URL in its error.
    url = "https://user:s3cretpw@hooks.invalid/x?token=SECRETTOKEN"
    execution_id = _schedule(engine, url, NONE, headers={"Authorization": "Bearer HEADERSECRET"})
    with dg.instance_for_test() as instance:
        result = _tick_and_run(db_url, instance, WebhookClient(timeout_s=5, secrets_key=KEY))
        logs = "\n".join(e.message or "" for e in instance.all_logs(result.run_id))
        outputs = json.dumps([str(e.event_specific_data) for e in result.all_events], default=str)
    with engine.connect() as conn:
        row = get_execution(conn, execution_id)
    assert row is not None and row["status"] == "FAILED"
    assert "https://hooks.invalid" in row["last_error"]
    runner = CliRunner(env={"MARKETING_DATABASE_URL": db_url})
    listed = runner.invoke(main, ["executions", "list"], catch_exceptions=False).output
    shown = runner.invoke(main, ["executions", "show", str(execution_id), "--json"], catch_exceptions=False).output
    assert "hooks.invalid" in logs and "hooks.invalid" in shown
    for place, text in {
        "last_error": row["last_error"],
        "run log": logs,
        "run events": outputs,
        "list": listed,
    }.items():
        assert not [s for s in SECRETS if s in text], f"a secret in the {place}"
    assert not [s for s in SECRETS if s in shown]


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        # Scheme, host and port only; "/***" says that something followed.
        ("https://user:pw@host/x?token=1#f", "https://host/***"),
        # A path may be the secret itself (Slack, Telegram, Discord webhooks).
        ("http://host:8080/path", "http://host:8080/***"),
        ("https://hooks.slack.com/services/T0/B0/SECRET", "https://hooks.slack.com/***"),
        ("https://api.telegram.org/botTOKEN/sendMessage", "https://api.telegram.org/***"),
        ("http://[::1]:9/p?q=1", "http://[::1]:9/***"),
        ("https://token@host/", "https://host/***"),
        # Nothing beyond the host: nothing hidden.
        ("https://host", "https://host"),
    ],
)
def test_redact_url(raw: str, shown: str) -> None:
    assert redact_url(raw) == shown
    assert redact_urls(f"webhook {raw} failed") == f"webhook {shown} failed"


def test_the_request_goes_to_the_checked_address_with_the_hosts_name(tmp_path: Any) -> None:
    # Sent to the address the policy checked; the Host header still names the URL's host (here an
    # IPv6 literal, which keeps its brackets there).
    import http.server

    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(self.headers["Host"])
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class V6Server(http.server.HTTPServer):
        address_family = socket.AF_INET6

    server = V6Server(("::1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    port = server.server_address[1]
    ctx = ActionContext(7, 1, "spring-launch", "launch", logging.getLogger("test"))
    client = WebhookClient(timeout_s=5, allow_networks=["::1/128"])
    try:
        result = WebhookAction().run(ctx, {"url": f"http://[::1]:{port}/hook"}, client)
    finally:
        thread.join(timeout=5)
        server.server_close()
    assert result["status_code"] == 204
    assert seen == [f"[::1]:{port}"]


IPV6_ANY = EgressPolicy(parse_networks("::/0"))  # every IPv6 range allowed, no IPv4 one


@pytest.mark.parametrize(
    ("address", "egress", "refused"),
    [
        ("2002:7f00:1::", IPV6_ANY, "IPv6 form of 127.0.0.1, a loopback"),  # 6to4 of 127.0.0.1
        ("2002:7f00:1::", NONE, "IPv6 form of 127.0.0.1, a loopback"),  # 2002::/16 counts as global to Python 3.11
        ("2002:a9fe:a9fe::", EVERYTHING, "IPv6 form of 169.254.169.254, a link-local"),  # 6to4 of metadata
        ("2002:a00:1:5::9", IPV6_ANY, "IPv6 form of 10.0.0.1, a private"),  # 6to4 of a private address
        ("64:ff9b::a9fe:a9fe", EVERYTHING, "IPv6 form of 169.254.169.254, a link-local"),  # NAT64 well-known prefix
        ("64:ff9b::7f00:1", IPV6_ANY, "IPv6 form of 127.0.0.1, a loopback"),  # NAT64 well-known prefix
        ("64:ff9b:1::a9fe:a9fe", EVERYTHING, "IPv6 form of 169.254.169.254, a link-local"),  # NAT64 local-use prefix
        ("2001:0:4136:e378:8000:63bf:80ff:fffe", IPV6_ANY, "IPv6 form of 127.0.0.1, a loopback"),  # Teredo client
        ("2001:0:4136:e378:8000:63bf:5601:5601", EVERYTHING, "IPv6 form of 169.254.169.254"),  # Teredo client
        ("::7f00:1", IPV6_ANY, "IPv6 form of 127.0.0.1, a loopback"),  # IPv4-compatible (deprecated)
        ("::ffff:7f00:1", IPV6_ANY, "IPv6 form of 127.0.0.1, a loopback"),  # IPv4-mapped
    ],
)
def test_ipv6_forms_of_a_refused_ipv4_address_are_refused(address: str, egress: EgressPolicy, refused: str) -> None:
    with pytest.raises(EgressRefused, match=refused):  # when scheduled
        egress.check_url(f"http://[{address}]:8080/x")
    reason = egress.refusal(ipaddress.ip_address(address))  # when sent, on what a name resolved to
    assert reason is not None and refused in reason
    with pytest.raises(EgressRefused, match=refused):  # when sent to the literal
        egress.resolve(address, 8080)


@pytest.mark.parametrize(
    ("address", "egress"),
    [
        ("2002:808:808::1", NONE),  # 6to4 of a public address
        ("64:ff9b::808:808", NONE),  # NAT64 of a public address: the translator sends it to 8.8.8.8
        ("2001:0:4136:e378:8000:63bf:f7f7:f7f7", IPV6_ANY),  # Teredo (non-global itself) of a public client
        ("2002:7f00:1::", EVERYTHING),  # the operator allowed loopback and every IPv6 range
        ("::1", EgressPolicy(parse_networks("::1/128"))),  # IPv6's own loopback, not an IPv4 form
    ],
)
def test_ipv6_forms_of_an_allowed_address_are_allowed(address: str, egress: EgressPolicy) -> None:
    egress.check_url(f"http://[{address}]/x")
    assert egress.refusal(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize(
    ("host", "egress"),
    [
        ("2606:4700::1111", NONE),  # a global literal: once parsed as the host "2606", a private address
        ("2001:db8::7", EgressPolicy(parse_networks("2001:db8::/32"))),  # an allowed range
        ("::1", EgressPolicy(parse_networks("::1/128"))),  # allowed loopback
    ],
)
def test_an_ipv6_literal_is_checked_as_itself_when_sent(host: str, egress: EgressPolicy) -> None:
    # The host as urlsplit gives it: without the URL's brackets.
    assert egress.resolve(host, 443) == ipaddress.ip_address(host)


def _ipv6_loopback_port() -> int | None:
    """A free port on ::1, or None when this machine has no IPv6 loopback."""
    if not socket.has_ipv6:
        return None
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
            return int(probe.getsockname()[1])
    except OSError:
        return None


@pytest.mark.skipif(_ipv6_loopback_port() is None, reason="this machine has no IPv6 loopback (::1) to listen on")
@pytest.mark.parametrize(
    "host",
    [
        "[::1]",
        "[0:0:0:0:0:0:0:1]",  # the same address in full: was parsed as the host "0", i.e. 0.0.0.0
    ],
)
def test_a_webhook_reaches_an_allowed_ipv6_receiver(host: str) -> None:
    import http.server

    received: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            received.append(self.path)
            self.rfile.read(int(self.headers.get("content-length", "0")))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class V6Server(http.server.HTTPServer):
        address_family = socket.AF_INET6

    server = V6Server(("::1", 0), Handler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    ctx = ActionContext(7, 1, "spring-launch", "launch", logging.getLogger("test"))
    client = WebhookClient(timeout_s=5, allow_networks=["::1/128"])
    try:
        result = WebhookAction().run(ctx, {"url": f"http://{host}:{server.server_address[1]}/hook"}, client)
    finally:
        thread.join(timeout=5)
        server.server_close()
    assert result["status_code"] == 204 and received == ["/hook"]
