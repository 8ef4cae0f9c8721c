"""A hostile or careless measurement service that quotes the credential back stores it nowhere.

Each fake answer below quotes the importer's own key or token (whole, cut, base64, in a redirect or a
pagination link, in a field of an entry) the way the issue saw them land in the run's event log. The asset
runs on a Dagster instance on disk; then every file of that instance (run and event storage), the console
output and a dump of the application database are searched for any 12-character piece of the credential.
A base URL with user info is refused before any request, so no ``Authorization: Basic`` replaces the token.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.egress import api_root_problem
from marketing_pipelines.measurement.keys import DOWNLOADS_KEY, SITE_KEY
from marketing_pipelines.settings import SettingsError, load_settings
from marketing_pipelines_tests.factories import add_campaign, dump_app_database
from marketing_pipelines_tests.measurement.fake_services import Api, mocked_github, mocked_plausible
from marketing_pipelines_tests.measurement.runs import materialize_measurement

PLAUSIBLE_KEY = "pl4usibleK3yQw7Er9Ty2Ui8Op5As1Df6Gh0Jk3Lz7Xc9Vb2Nm4Qa6Ws8Ed1Rf5Tg"
GITHUB_TOKEN = "ghp_R7tY9uI2oP4aS6dF8gH1jK3lZ5xC7vB9nM0q"
USER_INFO_PASSWORD = "svcPassw0rdNotForTheLog42"
DAY = date(2026, 11, 26)
# GitHub reports only current totals, so its asset asks GitHub only for a day that ended less than a day ago.
RECENT_DAY = datetime.now(UTC).date() - timedelta(days=1)
REPO = "acme/widget"

Answer = Callable[[httpx.Request], httpx.Response]


def pieces(secret: str) -> set[str]:
    return {secret[i : i + 12] for i in range(len(secret) - 11)}


def leaked(text: str, secret: str) -> list[str]:
    return sorted(piece for piece in pieces(secret) if piece in text)


def _row(value: str) -> dict[str, object]:
    return {"dimensions": [value, "alpha26", "/"], "metrics": [1, 1]}


PLAUSIBLE_ECHOES: dict[str, Answer] = {
    # Plausible's 400 quotes what it was given; this one quotes the key.
    "400 quoting the key": lambda r: httpx.Response(400, json={"error": f"Invalid API key {PLAUSIBLE_KEY}"}),
    "200 with the key and no results": lambda r: httpx.Response(200, json={"key": PLAUSIBLE_KEY, "results": None}),
    "a bad row quoting the key": lambda r: httpx.Response(200, json={"results": [_row(PLAUSIBLE_KEY)]}),
    # Cut by the service (or by our own snippet length): all but the last 5 characters.
    "401 quoting the key cut": lambda r: httpx.Response(401, json={"error": f"bad key {PLAUSIBLE_KEY[:-5]}"}),
    "400 quoting the key as base64": lambda r: httpx.Response(
        400, json={"error": f"bad key {base64.b64encode(PLAUSIBLE_KEY.encode()).decode()}"}
    ),
    "not JSON, quoting the key": lambda r: httpx.Response(200, text=f"<html>key={PLAUSIBLE_KEY[3:]}</html>"),
}

GITHUB_ECHOES: dict[str, Answer] = {
    "302 off the API host carrying the token": lambda r: httpx.Response(
        302, headers={"location": f"https://evil.example/collect?token={GITHUB_TOKEN}"}
    ),
    "Link rel=next off the API host carrying the token": lambda r: httpx.Response(
        200, json=[], headers={"link": f'<https://evil.example/next?token={GITHUB_TOKEN}&page=2>; rel="next"'}
    ),
    "a release entry with the token in a field": lambda r: httpx.Response(
        200, json=[{"id": 1, "tag_name": "v1", "assets": [{"id": f"x{GITHUB_TOKEN}", "name": "a"}]}]
    ),
    "401 quoting the token": lambda r: httpx.Response(401, json={"message": f"Bad credentials {GITHUB_TOKEN}"}),
}


def _failed_run(
    tmp_path: Path,
    engine: sa.Engine,
    db_url: str,
    capfd: pytest.CaptureFixture[str],
    key: dg.AssetKey,
    day: date,
    **client: object,
) -> tuple[str, str]:
    """Materialize ``key`` for ``day`` with ``client`` on a Dagster instance on disk; the run must fail. Returns its
    failure's text and every surface: each file of the instance (runs, event logs, index), the console, the
    application database and the run's events as the UI reads them."""
    home = tmp_path / "dagster"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        result = materialize_measurement([key], db_url, [day], instance, raise_on_error=False, **client)
    captured = capfd.readouterr()
    assert not result.success
    failures = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert failures, "the step was expected to fail"
    stored = [path.read_bytes().decode("latin-1") for path in home.rglob("*") if path.is_file()]
    events = [dg.serialize_value(event) for event in result.all_events]
    surfaces = [*stored, captured.out, captured.err, dump_app_database(engine), *events]
    return "\n".join(str(e.step_failure_data.error) for e in failures), "\n".join(surfaces)


@pytest.mark.parametrize("shape", PLAUSIBLE_ECHOES)
def test_a_plausible_echo_of_its_key_lands_on_no_surface(
    shape: str, engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26")
    api = Api(PLAUSIBLE_ECHOES[shape])
    plausible = mocked_plausible(api, api_key=PLAUSIBLE_KEY)
    failure, surfaces = _failed_run(tmp_path, engine, db_url, capfd, SITE_KEY, DAY, plausible=plausible)
    assert api.requests, "the fake service was asked"
    assert "plausible:" in failure  # the failure says which service, so a search that found nothing searched it
    assert leaked(surfaces, PLAUSIBLE_KEY) == []


@pytest.mark.parametrize("shape", GITHUB_ECHOES)
def test_a_github_echo_of_its_token_lands_on_no_surface(
    shape: str, engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    add_campaign(engine, "alpha", github_repo=REPO)
    api = Api(GITHUB_ECHOES[shape])
    github = mocked_github(api, token=GITHUB_TOKEN)
    failure, surfaces = _failed_run(tmp_path, engine, db_url, capfd, DOWNLOADS_KEY, RECENT_DAY, github=github)
    assert "github" in failure
    assert leaked(surfaces, GITHUB_TOKEN) == []
    # Nothing was sent off the configured API host, where the token would have gone too.
    assert {request.url.host for request in api.requests} == {"api.github.com"}


@pytest.mark.parametrize("importer", ["plausible", "github"])
def test_an_api_root_with_user_info_is_refused_before_any_request(
    importer: str, engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    add_campaign(engine, "alpha", utm_campaign="alpha26", github_repo=REPO)
    api = Api(lambda r: httpx.Response(200, text="not json"))
    root = f"http://svc:{USER_INFO_PASSWORD}@127.0.0.1:9"
    if importer == "plausible":
        key, client = SITE_KEY, {"plausible": mocked_plausible(api, api_key=PLAUSIBLE_KEY, base_url=root)}
    else:
        key, client = DOWNLOADS_KEY, {"github": mocked_github(api, token=GITHUB_TOKEN, base_url=root)}
    failure, surfaces = _failed_run(tmp_path, engine, db_url, capfd, key, RECENT_DAY, **client)
    # No request at all: httpx would have sent "Authorization: Basic svc:..." in place of the service's token.
    assert api.requests == []
    assert "must not hold user info" in failure
    assert leaked(surfaces, USER_INFO_PASSWORD) == []


@pytest.mark.parametrize("variable", ["PLAUSIBLE_BASE_URL", "GITHUB_API_URL", "ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"])
def test_settings_refuse_an_api_root_with_user_info_in_one_line_without_it(variable: str) -> None:
    field = {
        "PLAUSIBLE_BASE_URL": "plausible_base_url",
        "GITHUB_API_URL": "github_api_url",
        "ANTHROPIC_BASE_URL": "anthropic_base_url",
        "OPENAI_BASE_URL": "openai_base_url",
    }[variable]
    with pytest.raises(SettingsError) as refused:
        load_settings(**{field: f"https://svc:{USER_INFO_PASSWORD}@api.example"})
    message = str(refused.value)
    assert "\n" not in message and variable in message and "user info" in message
    assert USER_INFO_PASSWORD not in message


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("https://api.github.com", None),
        ("http://127.0.0.1:8080/api/v3", None),
        ("https://user:pw@api.github.com", "user info"),
        ("https://token@api.github.com", "user info"),
        ("ftp://api.github.com", "http://"),
        ("https://", "http://"),
        ("https://api.github.com:99999", "not a URL"),
    ],
)
def test_api_root_problem(url: str, problem: str | None) -> None:
    found = api_root_problem(url)
    assert (found is None) if problem is None else (found is not None and problem in found)
