"""Outbound requests go where the code says and nowhere else: never through a proxy named in the
environment, and a local UI's webhooks reach the demo's receiver and not the UI itself.

Each case was a reproduced defect: with ``HTTP_PROXY`` set, every HTTP client (httpx trusts the
environment by default) sent its request, API key or token included, to that proxy, which no egress
check had seen; and ``marketing-pipelines ui`` allowed webhooks to 127.0.0.1, where its own GraphQL
API listens.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import marketing_pipelines
from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.cli import main
from marketing_pipelines.egress import ALLOW_SETTING, EgressPolicy, EgressRefused, parse_networks
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.local_dagster import DEMO_RECEIVER_ADDRESS
from marketing_pipelines.measurement.importers.github import GitHubReleasesClient
from marketing_pipelines.measurement.importers.plausible import PlausibleClient
from marketing_pipelines.monitoring.alerts import AlertWebhook

PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@dataclass
class Server:
    port: int
    # (method, request target) of every request; a proxy sees absolute URLs or CONNECT host:port.
    requests: list[tuple[str, str]] = field(default_factory=list)


@contextmanager
def http_server(answer: Callable[[str, str], tuple[int, Any]]) -> Iterator[Server]:
    """A real HTTP server on 127.0.0.1 that records each request and answers ``answer(method, path)`` as JSON."""
    server_state = Server(0)

    class Handler(BaseHTTPRequestHandler):
        def _handle(self) -> None:
            server_state.requests.append((self.command, self.path))
            self.rfile.read(int(self.headers.get("content-length", "0")))
            status, body = answer(self.command, self.path)
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        do_GET = do_POST = do_CONNECT = _handle

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server_state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server_state
    finally:
        server.shutdown()
        server.server_close()


def _target_answer(method: str, path: str) -> tuple[int, Any]:
    """What each service's fake answers: the smallest valid response of each API."""
    if path.endswith("/chat/completions"):
        return 200, {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    if path.endswith("/v1/messages"):
        return 200, {"content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    if path.startswith("/api/v2/query"):
        return 200, {"results": []}
    if path.startswith("/repos/acme/widget/releases"):
        return 200, []
    if path == "/alert":
        return 200, {"ok": True}
    return 404, {"error": f"no fake for {method} {path}"}


def _openai(base: str) -> object:
    model = OpenAIModel(api_key="sk-test", base_url=f"{base}/v1")
    try:
        return model.complete("", [{"role": "user", "content": "hello"}], []).text
    finally:
        model.close()


def _anthropic(base: str) -> object:
    model = AnthropicModel(api_key="sk-test", base_url=base)
    try:
        return model.complete("", [{"role": "user", "content": "hello"}], []).text
    finally:
        model.close()


def _plausible(base: str) -> object:
    client = PlausibleClient(api_key="key", site_id="example.com", base_url=base)
    return client.campaign_stats(dt.date(2026, 3, 1), dt.date(2026, 3, 1))[dt.date(2026, 3, 1)]


def _github(base: str) -> object:
    return GitHubReleasesClient(token="ghp_test", base_url=base).list_release_assets("acme/widget").assets


def _webhook(base: str) -> object:
    client = WebhookClient(allow_networks=["127.0.0.1/32"])
    return client.post(f"{base}/alert", b"{}", {"Content-Type": "application/json"}).status_code


def _alert(base: str) -> object:
    # The alert sender posts through WebhookClient, which builds its client in executions/webhook.py.
    delivery = AlertWebhook(url=f"{base}/alert").send("a run failed", WebhookClient(allow_networks=["127.0.0.1/32"]))
    return "sent" if delivery.delivered else delivery.detail


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (_openai, "hi"),  # agents/providers/base.py, OpenAI's wire format
        (_anthropic, "hi"),  # agents/providers/base.py, Anthropic's wire format
        (_plausible, []),  # measurement/importers/plausible.py
        (_github, ()),  # measurement/importers/github.py
        (_webhook, 200),  # executions/webhook.py: the webhook action's client
        (_alert, "sent"),  # monitoring/alerts.py, through executions/webhook.py's client
    ],
)
def test_no_client_sends_through_a_proxy_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, call: Callable[[str], object], expected: object
) -> None:
    with http_server(lambda method, path: (502, {"error": "proxied"})) as proxy, http_server(_target_answer) as target:
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        for name in PROXY_VARIABLES:
            monkeypatch.setenv(name, f"http://127.0.0.1:{proxy.port}")
        assert call(f"http://127.0.0.1:{target.port}") == expected
    assert proxy.requests == []
    assert len(target.requests) == 1


PACKAGE = Path(marketing_pipelines.__file__).parent


def _client_constructions() -> list[tuple[str, ast.Call]]:
    """Every ``httpx.Client(...)`` / ``httpx.AsyncClient(...)`` in the package, with where it is."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("Client", "AsyncClient")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "httpx"
            ):
                found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return found


def test_every_http_client_the_package_builds_ignores_proxy_variables() -> None:
    # A new client that forgets trust_env=False would send its credentials to whatever HTTP_PROXY names.
    constructions = _client_constructions()
    assert len(constructions) >= 4  # the scan finds the clients it is there to check
    trusting = [
        where
        for where, call in constructions
        if not any(
            k.arg == "trust_env" and isinstance(k.value, ast.Constant) and k.value.value is False for k in call.keywords
        )
    ]
    assert trusting == [], f"httpx clients without trust_env=False: {trusting}"


def test_the_package_builds_http_clients_only_as_httpx_client() -> None:
    # The scan above sees `httpx.Client(`; `from httpx import Client` (or another HTTP library) would hide one.
    hidden = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "httpx":
                hidden.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} from httpx import ...")
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
                hidden += [
                    f"{path.relative_to(PACKAGE.parent)}:{node.lineno} imports {n}"
                    for n in names
                    if n.split(".")[0] in ("requests", "urllib3", "aiohttp") or n == "urllib.request"
                ]
    assert hidden == []


def _ui_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, allow: str | None = None
) -> tuple[list[str], dict[str, str]]:
    """What ``marketing-pipelines ui`` would start dagster dev with (its argv and environment)."""
    started: list[tuple[list[str], dict[str, str]]] = []

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        started.append((argv, dict(env)))
        raise SystemExit(0)

    monkeypatch.setattr(os, "execve", execve)
    monkeypatch.chdir(tmp_path)
    # The CLI's environment for this invocation only ("" is unset: env_ignore_empty).
    cli_env = {ALLOW_SETTING: allow or "", "MARKETING_DATABASE_URL": f"sqlite:///{tmp_path / 'ui.db'}"}
    result = CliRunner().invoke(main, ["ui", "--port", "3000"], env=cli_env)
    assert result.exit_code == 0, result.output
    [(argv, env)] = started
    return argv, env


def test_the_local_ui_lets_webhooks_reach_the_demos_receiver_and_not_itself(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    argv, env = _ui_environment(monkeypatch, tmp_path)
    policy = EgressPolicy(parse_networks(env[ALLOW_SETTING]))
    # The webserver listens on 127.0.0.1 only, so the receiver's address does not reach it either.
    assert argv[argv.index("-h") + 1] == "127.0.0.1" and argv[argv.index("-p") + 1] == "3000"
    for url in ("http://127.0.0.1:3000/graphql", "http://localhost:3000/graphql", "http://127.0.0.1:5432/"):
        with pytest.raises(EgressRefused, match="loopback"):
            policy.check_url(url)
    with pytest.raises(EgressRefused, match="loopback"):
        policy.resolve("127.0.0.1", 3000)
    policy.check_url(f"http://{DEMO_RECEIVER_ADDRESS}:41234/demo-hook")
    assert str(policy.resolve(DEMO_RECEIVER_ADDRESS, 41234)) == DEMO_RECEIVER_ADDRESS


def test_the_local_ui_keeps_the_networks_an_operator_chose(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _, env = _ui_environment(monkeypatch, tmp_path, allow="10.0.0.0/8")
    assert env[ALLOW_SETTING] == "10.0.0.0/8"
