"""No 12-character piece of a secret the process holds shows, raw or re-encoded (issue 44 item 2).

Each kind of secret is remembered the way the project remembers it (a model key by sending it, an endpoint's
signing secret, a header value, a secret setting), then echoed in each shape a service or a model was seen to
use: whole, cut at either end, URL-encoded, every byte percent-encoded, base64 (standard, URL-safe, inside
``user:key``), JSON ``\\u`` escapes, hex, split over lines (raw and as JSON ``\\n``), base64 wrapped at 76, and
an endpoint secret without its ``whsec_`` prefix or as its key's bytes in hex. The check is independent of the
redaction: no 12 characters of the echo as written survive. Ordinary text is left as it is.

End to end: a fake Anthropic API whose model writes the key in every shape, then a 401 quoting it cut and
base64: the app database (every table), the run's whole event log, the CLI's lists and shows and the alert
hold no piece of it.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.agents import users
from marketing_pipelines.egress import EgressPolicy, parse_networks
from marketing_pipelines.executions.endpoints import add_endpoint
from marketing_pipelines.executions.queue import schedule_execution
from marketing_pipelines.executions.webhook import WebhookClient
from marketing_pipelines.redact import remember_headers, remember_secrets, shown_text
from marketing_pipelines.sealing import SecretBox, key_source, new_key
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.agents.fake_models import anthropic_models, text_turn
from marketing_pipelines_tests.agents.runs import run_one
from marketing_pipelines_tests.built import due_executions_sensor
from marketing_pipelines_tests.cli_runner import cli_for
from marketing_pipelines_tests.executions.runs import LOCAL, perform, sensor_requests
from marketing_pipelines_tests.factories import (
    add_campaign,
    alert_for_failed_runs,
    dump_app_database,
    request_brief,
)
from marketing_pipelines_tests.webserver import Received, Recorder

MODEL_KEY = "sk-ant-api03-Qm7Zr2Xv9Lp4Tn8Wc6Hb1Jd5Fs3Gk0Ye7Ua2Io"
ENDPOINT_SECRET = "whsec_" + base64.b64encode(bytes(range(100, 124))).decode()
HEADER_VALUE = "hv_9f8e7d6c5b4a39281726354453627180"
SETTING_TOKEN = "ghp_Bare7Token3Setting9Value1Held5Here2x"
KEY = new_key()


def _remember_model_key(key: str) -> None:
    remember_headers({"x-api-key": key, "content-type": "application/json"})


def _remember_setting(token: str) -> None:
    load_settings(github_token=token)


KINDS: dict[str, tuple[str, Callable[[str], None]]] = {
    "model API key (a header the run sent)": (MODEL_KEY, _remember_model_key),
    "endpoint signing secret": (ENDPOINT_SECRET, remember_secrets),
    "header value": (HEADER_VALUE, lambda v: remember_headers({"X-Custom-Auth": v})),
    "secret setting (bare token)": (SETTING_TOKEN, _remember_setting),
}


def _wrapped(text: str, width: int) -> str:
    return "\n".join(text[i : i + width] for i in range(0, len(text), width))


SHAPES: dict[str, Callable[[str], str]] = {
    "whole": lambda s: s,
    "cut at the end (a 200-character snippet)": lambda s: s[:-8],
    "cut at the start": lambda s: s[10:],
    "URL-encoded": lambda s: urllib.parse.quote(s + "/+=", safe=""),
    "every byte percent-encoded": lambda s: "".join(f"%{b:02X}" for b in s.encode()),
    "URL-encoded twice": lambda s: urllib.parse.quote(urllib.parse.quote(s + "/+=", safe=""), safe=""),
    "base64": lambda s: base64.b64encode(s.encode()).decode(),
    "base64 URL-safe": lambda s: base64.urlsafe_b64encode(s.encode()).decode(),
    "base64 of user:secret (Basic)": lambda s: base64.b64encode(f"api:{s}".encode()).decode(),
    "base64 cut": lambda s: base64.b64encode(s.encode()).decode()[:-6],
    "JSON \\u escapes": lambda s: "".join(f"\\u{ord(c):04x}" for c in s),
    "Python \\x escapes": lambda s: "".join(f"\\x{ord(c):02x}" for c in s),
    "HTML character references": lambda s: "".join(f"&#{ord(c)};" for c in s),
    "hex": lambda s: s.encode().hex(),
    "hex upper case": lambda s: s.encode().hex().upper(),
    "split over lines": lambda s: _wrapped(s, 7),
    "split over lines, indented": lambda s: _wrapped(s, 9).replace("\n", "\n    "),
    "split with JSON \\n": lambda s: _wrapped(s, 6).replace("\n", "\\n"),
    "split, its breaks turned to spaces (a one-line snippet)": lambda s: _wrapped(s, 7).replace("\n", " "),
    "base64 wrapped at 76": lambda s: _wrapped(base64.b64encode((s * 3).encode()).decode(), 76),
}

ENDPOINT_ONLY_SHAPES: dict[str, Callable[[str], str]] = {
    # Standard Webhooks libraries strip "whsec_" and decode the rest to the key's bytes.
    "without its whsec_ prefix": lambda s: s.removeprefix("whsec_"),
    "its key's bytes in hex": lambda s: base64.b64decode(s.removeprefix("whsec_")).hex(),
    "its key's bytes in hex, cut": lambda s: base64.b64decode(s.removeprefix("whsec_")).hex()[6:-6],
}


def traces(shown: str, secret: str, echo: str) -> list[str]:
    """12-character pieces of ``secret`` or of the ``echo`` as written that survive in ``shown``."""
    raw = {secret[i : i + 12] for i in range(len(secret) - 11)}
    written = {echo[i : i + 12] for i in range(len(echo) - 11)} - {"\n"}
    return sorted(piece for piece in raw | written if piece in shown and not piece.isspace())


CASES = [(kind, shape) for kind in KINDS for shape in SHAPES] + [
    ("endpoint signing secret", shape) for shape in ENDPOINT_ONLY_SHAPES
]


@pytest.mark.parametrize(("kind", "shape"), CASES, ids=[f"{k}: {s}" for k, s in CASES])
def test_no_piece_of_a_remembered_secret_shows_in_any_shape(kind: str, shape: str) -> None:
    secret, remember = KINDS[kind]
    remember(secret)
    echo = {**SHAPES, **ENDPOINT_ONLY_SHAPES}[shape](secret)
    text = f'HTTP 400: {{"error": "invalid credential", "detail": "{echo}"}} -- giving up'
    shown = shown_text(text)
    assert traces(shown, secret, echo) == [], shown
    # What surrounds the echo stays readable: the operator still learns what happened.
    assert "invalid credential" in shown and "giving up" in shown


ORDINARY = [
    "Execution 42 (spring-launch/launch, webhook): HTTP 500 from the receiver after 3 attempts",
    '{"campaign": "spring-launch", "stage": "launch", "signups": 42, "day": "2026-11-26"}',
    # Unrelated base64 and hex, and long words: no piece of any secret, so nothing hidden.
    base64.b64encode(b"an unrelated payload that is base64 encoded").decode(),
    hashlib.sha256(b"unrelated").hexdigest(),
    "measurement_daily_rollup materialized for 2026-11-26 in 0.8 s\nnext line",
    "Campaign spring-launch got 42 signups.\\nThe next stage is due tomorrow.",
]


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_text_is_left_as_it_is_with_every_kind_of_secret_remembered(text: str) -> None:
    for secret, remember in KINDS.values():
        remember(secret)
    assert shown_text(text) == text


def test_a_secret_shorter_than_a_piece_is_hidden_whole_only() -> None:
    remember_secrets("Short9Key")  # 9 characters: remembered, but a piece of it could be any word
    assert shown_text("key Short9Key refused") == "key *** refused"
    assert shown_text("Short9 and Key") == "Short9 and Key"


def _every_shape(secret: str) -> str:
    return "\n".join(f"{name}: {shape(secret)}" for name, shape in SHAPES.items())


def _invalid_key_echoed(key: str) -> httpx.Response:
    cut, encoded = key[:-6], base64.b64encode(key.encode()).decode()
    error = {"type": "authentication_error", "message": f"invalid x-api-key ({cut}...) [{encoded}]"}
    return httpx.Response(401, json={"type": "error", "error": error})


@pytest.mark.slow
def test_a_model_and_a_provider_echoing_the_key_in_every_shape_leave_no_piece_on_any_surface(
    engine: sa.Engine, db_url: str, instance: dg.DagsterInstance
) -> None:
    add_campaign(engine, "spring-launch")
    with engine.begin() as conn:
        users.add_user(conn, "ana")
        users.grant(conn, "ana", "campaign:read")

    def requested_and_run(answer: Callable[[int, dict], httpx.Response]) -> tuple[int, dg.ExecuteInProcessResult]:
        with engine.begin() as conn:
            run_id = request_brief(conn, max_attempts=1)
        return run_id, run_one(db_url, instance, anthropic_models(answer, MODEL_KEY))

    # The first run's model answers with the key in every shape; the second run's provider rejects the key,
    # quoting it cut and in base64.
    echoing_id, echoing = requested_and_run(lambda n, body: text_turn(_every_shape(MODEL_KEY)))
    rejected_id, rejected = requested_and_run(lambda n, body: _invalid_key_echoed(MODEL_KEY))
    run_ids = [echoing_id, rejected_id]
    assert echoing.success and not rejected.success

    cli = cli_for(db_url)
    commands = [("agents", "list"), ("agents", "list", "--json")]
    commands += [("agents", "show", str(i), *flags) for i in run_ids for flags in ((), ("--json",))]
    outputs = {" ".join(c): cli(*c) for c in commands}
    assert all(result.exit_code == 0 for result in outputs.values()), outputs
    surfaces = {
        "app database": dump_app_database(engine),
        "event log": "\n".join(
            dg.serialize_value(e) for run in instance.get_runs() for e in instance.all_logs(run.run_id)
        ),
        "alert": alert_for_failed_runs(instance, engine),
        **{command: result.output for command, result in outputs.items()},
    }
    echoes = [shape(MODEL_KEY) for shape in SHAPES.values()]
    found = {
        place: sorted({p for echo in echoes for p in traces(text, MODEL_KEY, echo)}) for place, text in surfaces.items()
    }
    assert {place: pieces for place, pieces in found.items() if pieces} == {}
    # The surfaces hold the runs, so a search that found nothing searched them.
    assert "credentials rejected (HTTP 401)" in surfaces["alert"]
    assert "hex upper case: ***" in surfaces["app database"]


@pytest.mark.slow
def test_a_receiver_echoing_the_endpoint_secret_and_a_header_in_every_shape_leaves_no_piece_anywhere(
    engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str], hook: Recorder
) -> None:
    """A registered endpoint whose receiver answers 401 quoting the signing secret it expected, or the header value
    it was sent, each execution in another shape: the app database, every file of the Dagster instance (event
    logs, compute logs), the console, the CLI's lists and shows and the alert hold no piece of either."""
    add_campaign(engine)
    with engine.begin() as conn:
        signing_secret = add_endpoint(
            conn, SecretBox(KEY), "crm", f"{hook.url}/T0/B0", EgressPolicy(parse_networks(LOCAL))
        )
    echoes = [
        (secret, shape)
        for secret in (signing_secret, HEADER_VALUE)
        for shape in ({**SHAPES, **ENDPOINT_ONLY_SHAPES} if secret == signing_secret else SHAPES).values()
    ]
    hook.status = 401

    def answer(received: Received) -> bytes:
        secret, shape = echoes[received.body["n"]]
        return f"signature mismatch: {shape(secret)}".encode()

    hook.body_for = answer
    with engine.begin() as conn:
        for n in range(len(echoes)):
            schedule_execution(
                conn,
                campaign_id="spring-launch",
                stage="launch",
                action="webhook",
                due_at=datetime.now(UTC) - timedelta(seconds=5),
                payload={"endpoint": "crm", "headers": {"X-Custom-Auth": HEADER_VALUE}, "body": {"n": n}},
                max_attempts=1,
                keys=functools.partial(key_source, KEY, None),
            )
    home = tmp_path / "dagster"
    home.mkdir()
    client = WebhookClient(timeout_s=5, allow_networks=LOCAL, secrets_key=KEY)
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        results = [
            perform(request, db_url, instance, webhook=client)
            for request in sensor_requests(due_executions_sensor, db_url, instance)
        ]
        alert = alert_for_failed_runs(instance, engine)
    captured = capfd.readouterr()
    assert results and not any(result.success for result in results)
    assert len(hook.received) == len(echoes)
    cli = cli_for(db_url, MARKETING_SECRETS_KEY=KEY)
    commands = [("executions", "list"), ("executions", "list", "--json")]
    commands += [("executions", "show", str(n + 1), *flags) for n in range(len(echoes)) for flags in ((), ("--json",))]
    outputs = {" ".join(c): cli(*c) for c in commands}
    assert all(result.exit_code == 0 for result in outputs.values()), outputs
    surfaces = {
        "app database": dump_app_database(engine),
        "Dagster instance files": "\n".join(p.read_bytes().decode("latin-1") for p in home.rglob("*") if p.is_file()),
        "console": captured.out + captured.err,
        "alert": alert,
        **{command: result.output for command, result in outputs.items()},
    }
    found = {
        place: sorted({p for secret, shape in echoes for p in traces(text, secret, shape(secret))})
        for place, text in surfaces.items()
    }
    assert {place: pieces for place, pieces in found.items() if pieces} == {}
    # The receiver's words are there, its quotes hidden: a search that found nothing searched them.
    assert "signature mismatch: ***" in surfaces["app database"]
    assert "compute_logs" in " ".join(str(p) for p in home.rglob("*"))
