"""The provider registry, the model resources built from it, and one HTTP client per provider resource per run."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import dagster as dg
import pytest
from pydantic.fields import FieldInfo

from marketing_pipelines.agents.jobs import run_agent
from marketing_pipelines.agents.models import model_resources, pick_provider
from marketing_pipelines.agents.providers.anthropic import AnthropicModel
from marketing_pipelines.agents.providers.base import HTTPModel
from marketing_pipelines.agents.providers.offline import OfflineModel
from marketing_pipelines.agents.providers.openai import OpenAIModel
from marketing_pipelines.agents.providers.registry import PROVIDERS, provider_spec
from marketing_pipelines.agents.queue import configured_provider_problem
from marketing_pipelines.http import ServiceError
from marketing_pipelines.settings import MODEL_PROVIDERS
from marketing_pipelines_tests.agents.fake_models import OPENAI_TEXT, SYSTEM
from marketing_pipelines_tests.built import DEFS
from marketing_pipelines_tests.factories import settings_from


@pytest.mark.parametrize(
    ("name", "resource_class", "resource_key", "key_env", "model_env", "base_url_env", "default_model"),
    [
        ("offline", OfflineModel, "offline_model", None, None, None, None),
        (
            "anthropic",
            AnthropicModel,
            "anthropic_model",
            "ANTHROPIC_API_KEY",
            "ANTHROPIC_MODEL",
            "ANTHROPIC_BASE_URL",
            "claude-sonnet-4-5",
        ),
        ("openai", OpenAIModel, "openai_model", "OPENAI_API_KEY", "OPENAI_MODEL", "OPENAI_BASE_URL", "gpt-4o-mini"),
    ],
)
def test_registry_records(
    name: str,
    resource_class: type,
    resource_key: str,
    key_env: str | None,
    model_env: str | None,
    base_url_env: str | None,
    default_model: str | None,
) -> None:
    spec = provider_spec(name)
    assert spec is not None
    variables = (spec.api_key_env, spec.variable("model"), spec.variable("base_url"))
    assert (spec.resource_class, spec.resource_key, *variables) == (
        resource_class,
        resource_key,
        key_env,
        model_env,
        base_url_env,
    )
    assert resource_class.model_fields.get("model", FieldInfo(default=None)).default == default_model
    assert resource_class().name == name


def test_the_agent_op_takes_every_registered_provider_once() -> None:
    # A provider added to the registry but not to run_agent's parameters could never run.
    keys = {spec.resource_key for spec in PROVIDERS}
    assert len(keys) == len(MODEL_PROVIDERS) and keys <= run_agent.required_resource_keys
    assert {key for key in run_agent.required_resource_keys if key.endswith("_model")} == keys


def test_model_resources_read_the_environment_through_the_registry() -> None:
    environ = {
        "ANTHROPIC_API_KEY": "sk-ant",
        "ANTHROPIC_MODEL": "claude-opus-4-1",
        "OPENAI_BASE_URL": "http://llm.internal:8000/v1",
        "OPENAI_MODEL": "",  # empty counts as unset
    }
    resources = model_resources(settings_from(environ), environ=environ)

    assert sorted(resources) == sorted(spec.resource_key for spec in PROVIDERS)
    anthropic, openai = resources["anthropic_model"], resources["openai_model"]
    assert isinstance(anthropic, AnthropicModel) and isinstance(openai, OpenAIModel)
    # The key is an env var reference, never its value.
    assert isinstance(anthropic.api_key, dg.EnvVar) and anthropic.api_key == "ANTHROPIC_API_KEY"
    assert anthropic.model == "claude-opus-4-1"
    assert openai.api_key is None
    # A base URL may carry credentials (an internal server's): shown by its variable's name, as the key is.
    assert openai.model == "gpt-4o-mini" and isinstance(openai.base_url, dg.EnvVar)
    assert openai.base_url == "OPENAI_BASE_URL" and anthropic.base_url == "https://api.anthropic.com"


def test_code_location_registers_the_provider_resources() -> None:
    assert {"offline_model", "anthropic_model", "openai_model"} <= set(DEFS.resources)
    # Once each: no other resource holds a provider (a nested copy would show in the UI without its config).
    for resource in DEFS.resources.values():
        assert not any(isinstance(nested, HTTPModel) for nested in getattr(resource, "nested_resources", {}).values())


@pytest.mark.parametrize(
    ("provider", "environ", "problem"),
    [
        ("offline", {}, None),
        ("anthropic", {}, "model provider 'anthropic' is not configured: set ANTHROPIC_API_KEY"),
        ("anthropic", {"ANTHROPIC_API_KEY": "k"}, None),
        ("openai", {"ANTHROPIC_API_KEY": "k"}, "model provider 'openai' is not configured: set OPENAI_API_KEY"),
        ("llama", {}, "unknown model provider 'llama'; known: offline, anthropic, openai"),
    ],
)
def test_configured_provider_problem(provider: str, environ: dict[str, str], problem: str | None) -> None:
    assert configured_provider_problem(provider, settings_from(environ)) == problem


def test_a_deployment_without_keys_loads_and_a_run_says_not_configured() -> None:
    with dg.build_resources(model_resources(settings_from({}), environ={})) as initialised:
        providers = initialised.original_resource_dict
        assert pick_provider("offline", providers).name == "offline"
        with pytest.raises(ServiceError, match="anthropic: not configured: set ANTHROPIC_API_KEY"):
            pick_provider("anthropic", providers)
        with pytest.raises(ServiceError, match="llama: unknown model provider"):
            pick_provider("llama", providers)


def test_a_key_set_at_load_resolves_in_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    # The definitions hold the variable's name; the run resolves it from its own environment.
    environ = {"OPENAI_API_KEY": "sk-from-env"}
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    with dg.build_resources(model_resources(settings_from(environ), environ)) as initialised:
        assert initialised.openai_model.api_key == "sk-from-env"


# --- one client per resource ---------------------------------------------------------------------


class CountingServer:
    """A local Chat Completions server (HTTP/1.1 keep-alive) that counts TCP connections opened and closed."""

    def __init__(self) -> None:
        self.opened = 0
        self.closed = 0
        self.requests = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                with server._lock:
                    server.opened += 1

            def finish(self) -> None:
                super().finish()
                with server._lock:
                    server.closed += 1

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["content-length"]))
                with server._lock:
                    server.requests += 1
                data = json.dumps(OPENAI_TEXT).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.http.server_address[1]}/v1"

    def wait_closed(self, count: int, timeout_s: float = 5.0) -> int:
        deadline = time.monotonic() + timeout_s
        while self.closed < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.closed


@pytest.fixture
def counting_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[CountingServer]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    server = CountingServer()
    thread = threading.Thread(target=server.http.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.http.shutdown()
        server.http.server_close()
        thread.join(timeout=5)


def test_a_run_reuses_one_client_for_every_call_and_closes_it_at_teardown(counting_server: CountingServer) -> None:
    openai = OpenAIModel(api_key="sk-test", base_url=counting_server.base_url)
    messages = [{"role": "user", "content": "hello"}]

    with dg.build_resources({"openai_model": openai}) as initialised:
        provider = initialised.openai_model
        assert provider.complete(SYSTEM, messages, []).text == "Campaign 7 got 42 signups."
        assert initialised.openai_model.complete(SYSTEM, messages, []).text
        # Two calls, one connection: a fresh client per call would have opened two.
        assert (counting_server.requests, counting_server.opened) == (2, 1)
        assert counting_server.closed == 0

    # Resource teardown closed the client, and with it the kept-alive connection.
    assert counting_server.wait_closed(1) == 1
