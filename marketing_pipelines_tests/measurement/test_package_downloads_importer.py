"""The package-download importers (importers/packages.py): PyPI downloads from pypistats.org and npm downloads from
api.npmjs.org, faked at the HTTP layer with answers shaped as recorded/ holds them."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa

from marketing_pipelines.db.schema import measurement_daily_rollup, source_daily_metric
from marketing_pipelines.definitions import build_defs
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.assets import left_out_importers
from marketing_pipelines.measurement.importers.base import ImporterNotConfigured, MetricImporter, MetricRow
from marketing_pipelines.measurement.importers.packages import (
    BULK_PACKAGES,
    MAX_SPAN_DAYS,
    NpmDownloadsClient,
    PyPIStatsClient,
    npm_range_problems,
    npm_requests,
    pypistats_shape_problems,
    spans,
)
from marketing_pipelines.measurement.quota import request_gate
from marketing_pipelines.measurement.rollup.daily import replace_rollup_days
from marketing_pipelines.measurement.sources import NPM_DOWNLOADS, PYPI_DOWNLOADS, Quota, missing_variables
from marketing_pipelines.settings import load_settings
from marketing_pipelines_tests.factories import add_campaign
from marketing_pipelines_tests.measurement.fake_services import (
    Api,
    NpmDownloadsFake,
    PyPIStatsFake,
    mocked_npm,
    mocked_pypistats,
    recorded,
)
from marketing_pipelines_tests.measurement.runs import materialize_measurement

PYPI_KEY, NPM_KEY = dg.AssetKey(PYPI_DOWNLOADS.asset), dg.AssetKey(NPM_DOWNLOADS.asset)
DEC1, DEC3 = date(2026, 12, 1), date(2026, 12, 3)


def days(first: date, last: date) -> list[date]:
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]


def rows(by_day: dict[date, list[MetricRow]]) -> dict[tuple[date, str], int]:
    return {(row.day, row.key): row.value for day_rows in by_day.values() for row in day_rows}


class Gate:
    """A request gate that counts what it was asked."""

    def __init__(self) -> None:
        self.asked: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> None:
        self.asked.append(request)


@pytest.fixture
def warnings_logged() -> Iterator[list[str]]:
    """What the importers warn through Dagster's logger (outside a run it is a plain logging.Logger)."""
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logger, handler = logging.getLogger("dagster.builtin"), Keep(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


# ---- the contracts --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("client", "source"), [(PyPIStatsClient, PYPI_DOWNLOADS), (NpmDownloadsClient, NPM_DOWNLOADS)])
def test_each_importer_declares_its_sources_contract(client: type[Any], source: Any) -> None:
    assert isinstance(client(enabled=True), MetricImporter)
    assert client.contract is source.contract
    assert source.contract.counted[0].metric == "downloads" and source.contract.range_only == ()
    assert (source.contract.count_kind, source.contract.revision_days) == ("daily", 1)


def test_the_contracts_say_what_the_services_document() -> None:
    pypi, npm = PYPI_DOWNLOADS.contract, NPM_DOWNLOADS.contract
    # pypistats.org/api: "Time series data is retained only for 180 days".
    assert (pypi.lookback_days, pypi.retention_days, pypi.match) == (180, 180, "pypi_package")
    assert (pypi.counted[0].stage, pypi.counted[0].event_type) == ("package", "pypi_download")
    # docs/download-counts.md: 18 months bounds one query, data goes back to 2015-01-10.
    assert (npm.lookback_days, npm.retention_days, npm.match) == (None, None, "npm_package")
    assert (npm.counted[0].stage, npm.counted[0].event_type) == ("package", "npm_download")
    assert (BULK_PACKAGES, MAX_SPAN_DAYS) == (128, 365)
    assert pypi.quota == npm.quota == Quota(30, 60.0)


# ---- pypistats.org --------------------------------------------------------------------------------------------


def test_pypistats_reads_the_recorded_answer_and_asks_as_documented() -> None:
    api = Api(lambda request: httpx.Response(200, json=recorded("pypi_downloads/overall.json")))
    gate = Gate()
    by_day = mocked_pypistats(api).daily_metrics(date(2026, 11, 30), date(2026, 12, 4), ["acme-widget"], gate=gate)
    assert list(by_day) == days(date(2026, 11, 30), date(2026, 12, 4))
    # A day without an entry (12-03) has no row; a day at 0 keeps its 0.
    assert rows(by_day) == {
        (date(2026, 11, 30), "acme-widget"): 412,
        (DEC1, "acme-widget"): 530,
        (date(2026, 12, 2), "acme-widget"): 0,
        (date(2026, 12, 4), "acme-widget"): 97,
    }
    assert {row.metric for r in by_day.values() for row in r} == {"downloads"}
    [request] = api.requests
    assert (request.method, request.url.host) == ("GET", "pypistats.org")
    assert request.url.path == "/api/packages/acme-widget/overall"
    assert dict(request.url.params) == {"mirrors": "false"}
    assert "authorization" not in request.headers
    assert gate.asked == api.requests


def test_pypistats_asks_each_package_once_whatever_the_range_and_keeps_only_the_asked_days() -> None:
    counts = {day: 10 + n for n, day in enumerate(days(date(2026, 6, 10), date(2026, 12, 6)))}
    api = Api(PyPIStatsFake({"acme-widget": counts, "acme-cli": {DEC1: 3}}))
    by_day = mocked_pypistats(api).daily_metrics(DEC1, DEC3, ["acme-cli", "acme-widget"])
    assert len(api.requests) == 2
    assert rows(by_day) == {
        (DEC1, "acme-cli"): 3,
        **{(day, "acme-widget"): counts[day] for day in days(DEC1, DEC3)},
    }


def test_pypistats_counts_downloads_without_mirrors_only() -> None:
    answer = recorded("pypi_downloads/overall.json")
    answer["data"] += [{"category": "with_mirrors", "date": "2026-12-01", "downloads": 9999}]
    api = Api(lambda request: httpx.Response(200, json=answer))
    assert rows(mocked_pypistats(api).daily_metrics(DEC1, DEC1, ["acme-widget"])) == {(DEC1, "acme-widget"): 530}


def test_a_package_pypistats_does_not_know_costs_only_itself(warnings_logged: list[str]) -> None:
    api = Api(PyPIStatsFake({"acme-widget": {DEC1: 5}}))
    by_day = mocked_pypistats(api).daily_metrics(DEC1, DEC1, ["acme-typo", "acme-widget"])
    assert rows(by_day) == {(DEC1, "acme-widget"): 5}
    [warning] = warnings_logged
    assert "'acme-typo' is unknown" in warning and "pypi_package" in warning


# ---- api.npmjs.org --------------------------------------------------------------------------------------------


def npm_recorded(request: httpx.Request) -> httpx.Response:
    single = request.url.path.endswith("/@acme/sdk")
    return httpx.Response(200, json=recorded(f"npm_downloads/range_{'single' if single else 'bulk'}.json"))


def test_npm_reads_the_recorded_answers_in_one_bulk_request_and_one_per_scoped_package(
    warnings_logged: list[str],
) -> None:
    api, gate = Api(npm_recorded), Gate()
    keys = ["@acme/sdk", "acme-cli", "acme-gone", "acme-widget"]
    by_day = mocked_npm(api).daily_metrics(DEC1, DEC3, keys, gate=gate)
    assert [(r.url.host, r.url.path) for r in api.requests] == [
        ("api.npmjs.org", "/downloads/range/2026-12-01:2026-12-03/acme-cli,acme-gone,acme-widget"),
        ("api.npmjs.org", "/downloads/range/2026-12-01:2026-12-03/@acme/sdk"),
    ]
    assert gate.asked == api.requests
    assert all("authorization" not in r.headers for r in api.requests)
    assert rows(by_day) == {
        **{(day, "acme-widget"): n for day, n in zip(days(DEC1, DEC3), (1904, 2211, 0), strict=True)},
        **{(day, "acme-cli"): n for day, n in zip(days(DEC1, DEC3), (17, 23, 5), strict=True)},
        **{(day, "@acme/sdk"): n for day, n in zip(days(DEC1, DEC3), (88, 91, 64), strict=True)},
    }
    # A null entry is a package npm does not know: a warning naming it, the others imported.
    [warning] = warnings_logged
    assert "'acme-gone' is unknown" in warning and "npm_package" in warning


def test_npm_splits_packages_by_128_and_ranges_by_365_days() -> None:
    unscoped = [f"pkg-{n:03d}" for n in range(300)]
    scoped = ["@acme/a", "@acme/b"]
    assert [len(r) for r in npm_requests([*unscoped, *scoped])] == [128, 128, 44, 1, 1]
    first, last = date(2025, 6, 1), date(2026, 7, 5)  # 400 days
    assert list(spans(first, last)) == [(first, date(2026, 5, 31)), (date(2026, 6, 1), last)]
    downloads = {p: {first: 1, last: 2} for p in [*unscoped, *scoped]}
    api = Api(NpmDownloadsFake(downloads, quota=(1000, 60.0)))
    by_day = mocked_npm(api).daily_metrics(first, last, [*unscoped, *scoped])
    # Two spans, each three bulk requests and one per scoped package; the fake answers 400 past npm's limits.
    assert len(api.requests) == 10
    got = rows(by_day)
    assert got[(first, "pkg-299")] == 1 and got[(last, "@acme/b")] == 2 and sum(got.values()) == 3 * 302
    assert len(got) == 400 * 302


def test_an_unknown_scoped_package_answers_404_and_costs_only_itself(warnings_logged: list[str]) -> None:
    api = Api(NpmDownloadsFake({"acme-widget": {DEC1: 7}}))
    by_day = mocked_npm(api).daily_metrics(DEC1, DEC1, ["@acme/nope", "acme-widget"])
    assert rows(by_day) == {(DEC1, "acme-widget"): 7}
    [warning] = warnings_logged
    assert "'@acme/nope' is unknown" in warning and "package @acme/nope not found" in warning


def test_a_name_that_is_no_package_is_never_put_in_a_path(warnings_logged: list[str]) -> None:
    api = Api(NpmDownloadsFake({"acme-widget": {DEC1: 7}}))
    by_day = mocked_npm(api).daily_metrics(DEC1, DEC1, ["../admin", "a,b", "acme-widget"])
    assert rows(by_day) == {(DEC1, "acme-widget"): 7}
    assert [r.url.path for r in api.requests] == ["/downloads/range/2026-12-01:2026-12-01/acme-widget"]
    assert len(warnings_logged) == 2
    pypi = Api(PyPIStatsFake({}))
    mocked_pypistats(pypi).daily_metrics(DEC1, DEC1, ["../admin?x=1"])
    assert pypi.requests == []


# ---- errors ---------------------------------------------------------------------------------------------------


def both(handler: Any) -> list[tuple[Api, Any]]:
    """The two importers' one-package calls against the same handler."""
    pypi, npm = Api(handler), Api(handler)
    return [
        (pypi, lambda: mocked_pypistats(pypi).daily_metrics(DEC1, DEC1, ["acme-widget"])),
        (npm, lambda: mocked_npm(npm).daily_metrics(DEC1, DEC1, ["acme-widget"])),
    ]


def test_a_429_without_retry_after_hands_the_step_back_at_once() -> None:
    for api, call in both(lambda request: httpx.Response(429, text="Too Many Requests")):
        with pytest.raises(RateLimited) as limited:
            call()
        # No wait was given: a minute, longer than a step sleeps, so nothing is retried in-process.
        assert limited.value.retry_after_s == 60.0 and len(api.requests) == 1


def test_a_short_retry_after_is_honoured_in_process() -> None:
    answers = iter([httpx.Response(429, headers={"Retry-After": "2"}), None])

    def handler(request: httpx.Request) -> httpx.Response:
        return next(answers) or PyPIStatsFake({"acme-widget": {DEC1: 4}})(request)

    api = Api(handler)
    slept: list[float] = []

    class Sleeping(type(mocked_pypistats(api))):  # type: ignore[misc]
        def _sleep(self, seconds: float) -> None:
            slept.append(seconds)

    client = Sleeping(enabled=True)
    assert rows(client.daily_metrics(DEC1, DEC1, ["acme-widget"])) == {(DEC1, "acme-widget"): 4}
    assert slept == [2.0] and len(api.requests) == 2


def test_server_errors_are_retried_then_fail_transiently() -> None:
    for api, call in both(lambda request: httpx.Response(503, text="<html>unavailable</html>")):
        with pytest.raises(ServiceError) as failed:
            call()
        assert failed.value.transient and len(api.requests) == 5 and "gave up after 5 attempts" in str(failed.value)


def test_a_body_that_is_not_json_is_a_clear_error() -> None:
    for _api, call in both(lambda request: httpx.Response(200, text="<html>maintenance</html>")):
        with pytest.raises(ServiceError, match="response was not valid JSON"):
            call()


def test_npm_refusals_are_one_clear_line() -> None:
    hostile = 'end date > start date\n\x1b[31m=HYPERLINK("http://evil")'
    cases = [
        (httpx.Response(400, json={"error": hostile}), "rejected (HTTP 400): end date > start date"),
        (httpx.Response(200, json={"error": "invalid date"}), "refused: invalid date"),
        (httpx.Response(404, text="<h1>Not Found</h1>"), "HTTP 404 from https://api.npmjs.org/"),
        (httpx.Response(403, text="Forbidden"), "credentials rejected (HTTP 403)"),
    ]
    for answer, said in cases:
        api = Api(lambda request, answer=answer: answer)
        with pytest.raises(ServiceError) as failed:
            mocked_npm(api).daily_metrics(DEC1, DEC1, ["acme-widget", "acme-cli"])
        message = str(failed.value)
        assert said in message, message
        assert "\n" not in message and "\x1b" not in message


def test_an_api_root_with_credentials_is_refused_unsent() -> None:
    api = Api(PyPIStatsFake({}))
    with pytest.raises(ServiceError, match="PYPISTATS_API_URL") as refused:
        mocked_pypistats(api, base_url="https://user:hunter2@pypistats.org").daily_metrics(DEC1, DEC1, ["x"])
    assert "hunter2" not in str(refused.value) and api.requests == []
    with pytest.raises(ServiceError, match="NPM_DOWNLOADS_API_URL"):
        mocked_npm(api, base_url="ftp://api.npmjs.org").daily_metrics(DEC1, DEC1, ["x"])


# ---- shape drift ----------------------------------------------------------------------------------------------


def test_the_recorded_answers_pass_the_shape_checks() -> None:
    assert pypistats_shape_problems(recorded("pypi_downloads/overall.json")) == []
    assert npm_range_problems(recorded("npm_downloads/range_single.json"), DEC1, DEC3) == []
    for answer in recorded("npm_downloads/range_bulk.json").values():
        assert answer is None or npm_range_problems(answer, DEC1, DEC3) == []


def mutated(name: str, change: Any) -> str:
    answer = recorded(name)
    change(answer)
    return json.dumps(answer)


def _set(path: list[Any], value: Any) -> Any:
    def change(answer: Any) -> None:
        *parents, last = path
        for step in parents:
            answer = answer[step]
        answer[last] = value

    return change


def _drop(path: list[Any]) -> Any:
    def change(answer: Any) -> None:
        *parents, last = path
        for step in parents:
            answer = answer[step]
        del answer[last]

    return change


PYPI_DRIFT = [
    ("missing data", _drop(["data"]), "data is not a list"),
    ("missing downloads", _drop(["data", 0, "downloads"]), "data[0] is not an object"),
    ("wrong type", _set(["data", 0, "downloads"], "412"), "is not a whole number"),
    ("extra nesting", _set(["data"], {"data": []}), "data is not a list"),
    ("another endpoint", _set(["type"], "recent_downloads"), "type is 'recent_downloads'"),
    ("negative", _set(["data", 0, "downloads"], -1), "out of range"),
    ("huge", _set(["data", 0, "downloads"], 10**13), "out of range"),
    ("fractional", _set(["data", 0, "downloads"], 2.5), "is not a whole number"),
    ("not a day", _set(["data", 0, "date"], "2026-13-01"), "is not a day of the calendar"),
    ("a day twice", _set(["data", 1, "date"], "2026-11-30"), "repeats without_mirrors 2026-11-30"),
    ("unknown category", _set(["data", 0, "category"], "=cmd"), "is not one of"),
]


@pytest.mark.parametrize(("change", "said"), [case[1:] for case in PYPI_DRIFT], ids=[case[0] for case in PYPI_DRIFT])
def test_a_drifted_pypistats_answer_is_refused_whole(change: Any, said: str) -> None:
    body = mutated("pypi_downloads/overall.json", change)
    api = Api(lambda request: httpx.Response(200, text=body, headers={"content-type": "application/json"}))
    with pytest.raises(ServiceError) as refused:
        mocked_pypistats(api).daily_metrics(date(2026, 11, 30), DEC3, ["acme-widget"])
    message = str(refused.value)
    assert message.startswith("pypistats: unexpected answer for acme-widget") and said in message, message
    assert "\n" not in message


NPM_DRIFT = [
    ("missing downloads", _drop(["downloads"]), "downloads is not a list"),
    ("missing day", _drop(["downloads", 0, "day"]), "downloads[0] is not an object"),
    ("wrong type", _set(["downloads", 0, "downloads"], None), "is not a whole number"),
    ("extra nesting", _set(["downloads"], {"downloads": []}), "downloads is not a list"),
    ("negative", _set(["downloads", 0, "downloads"], -5), "out of range"),
    ("huge", _set(["downloads", 0, "downloads"], 10**15), "out of range"),
    ("a bool", _set(["downloads", 0, "downloads"], True), "is not a whole number"),
    ("a day outside", _set(["downloads", 0, "day"], "2026-11-01"), "outside 2026-12-01..2026-12-03"),
    ("a day twice", _set(["downloads", 1, "day"], "2026-12-01"), "repeats 2026-12-01"),
    ("a range cut short at its start", _set(["start"], "2026-12-02"), "answered 2026-12-02..2026-12-03"),
    ("another package", _set(["package"], "@evil/sdk"), "answered package '@evil/sdk'"),
]


@pytest.mark.parametrize(("change", "said"), [case[1:] for case in NPM_DRIFT], ids=[case[0] for case in NPM_DRIFT])
def test_a_drifted_npm_answer_is_refused_whole(change: Any, said: str) -> None:
    body = mutated("npm_downloads/range_single.json", change)
    api = Api(lambda request: httpx.Response(200, text=body, headers={"content-type": "application/json"}))
    with pytest.raises(ServiceError) as refused:
        mocked_npm(api).daily_metrics(DEC1, DEC3, ["@acme/sdk"])
    message = str(refused.value)
    assert message.startswith("npm: unexpected answer for @acme/sdk") and said in message, message


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_a_non_finite_count_is_refused(number: str) -> None:
    pypi_body = json.dumps(recorded("pypi_downloads/overall.json")).replace("412", number)
    npm_body = json.dumps(recorded("npm_downloads/range_single.json")).replace("88", number)
    for body, call in (
        (pypi_body, lambda api: mocked_pypistats(api).daily_metrics(DEC1, DEC3, ["acme-widget"])),
        (npm_body, lambda api: mocked_npm(api).daily_metrics(DEC1, DEC3, ["@acme/sdk"])),
    ):
        api = Api(lambda request, body=body: httpx.Response(200, text=body))
        with pytest.raises(ServiceError, match=r"is not a whole number|not valid JSON"):
            call(api)


def test_a_bulk_answer_not_keyed_by_the_asked_packages_is_refused() -> None:
    bulk = recorded("npm_downloads/range_bulk.json")
    bulk['=HYPERLINK("x")'] = bulk.pop("acme-cli")
    api = Api(lambda request: httpx.Response(200, json=bulk))
    with pytest.raises(ServiceError, match="not an object keyed by the packages asked"):
        mocked_npm(api).daily_metrics(DEC1, DEC3, ["acme-cli", "acme-gone", "acme-widget"])


# ---- configuration --------------------------------------------------------------------------------------------


def test_unconfigured_by_default_and_left_out_of_the_definitions_with_what_turns_them_on() -> None:
    settings = load_settings()
    assert missing_variables(settings)["pypi_downloads"] == ["MARKETING_PYPI_DOWNLOADS_ENABLED=true"]
    assert left_out_importers(settings)[NPM_KEY] == "set MARKETING_NPM_DOWNLOADS_ENABLED=true"
    graph = build_defs(settings).resolve_asset_graph()
    assert not {PYPI_KEY, NPM_KEY} & set(graph.get_all_asset_keys())
    with pytest.raises(ImporterNotConfigured, match="MARKETING_PYPI_DOWNLOADS_ENABLED=true"):
        PyPIStatsClient().daily_metrics(DEC1, DEC1, ["acme-widget"])
    with pytest.raises(ImporterNotConfigured, match="MARKETING_NPM_DOWNLOADS_ENABLED=true"):
        NpmDownloadsClient().daily_metrics(DEC1, DEC1, ["acme-widget"])


def test_turned_on_each_is_defined_and_the_one_that_forgets_days_gets_within_retention() -> None:
    defs = build_defs(load_settings(pypi_downloads_enabled=True, npm_downloads_enabled=True))
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    assert {PYPI_KEY, NPM_KEY} <= set(graph.get_all_asset_keys())
    checks = {(key.asset_key, key.name) for key in graph.asset_check_keys}
    assert (PYPI_KEY, "within_retention") in checks and (NPM_KEY, "within_retention") not in checks
    assert defs.resources["pypistats"].enabled and defs.resources["npm_downloads"].enabled  # type: ignore[union-attr]


# ---- through Dagster, on the databases ------------------------------------------------------------------------


def recent_days() -> list[date]:
    today = datetime.now(UTC).date()
    return days(today - timedelta(days=9), today - timedelta(days=3))


def downloads_table(packages: list[str], run: list[date], seed: int) -> dict[str, dict[date, int]]:
    # Days before and after the run too: only the run's days may be stored.
    span = days(run[0] - timedelta(days=5), run[-1] + timedelta(days=2))
    return {p: {day: (seed * (i + 3) + n * 7) % 50 for n, day in enumerate(span)} for i, p in enumerate(packages)}


def stored(engine: sa.Engine, source: str) -> dict[tuple[date, str], int]:
    m = source_daily_metric
    with engine.connect() as conn:
        found = conn.execute(sa.select(m.c.day, m.c.key, m.c.value).where(m.c.source == source)).all()
    return {(day, key): value for day, key, value in found}


@pytest.mark.parametrize(
    ("key", "column", "packages", "fake", "client", "resource"),
    [
        (PYPI_KEY, "pypi_package", ["acme-widget", "acme-cli"], PyPIStatsFake, mocked_pypistats, "pypistats"),
        (NPM_KEY, "npm_package", ["acme-widget", "@acme/sdk"], NpmDownloadsFake, mocked_npm, "npm_downloads"),
    ],
)
def test_a_range_run_stores_the_campaigns_packages_days_and_a_rerun_replaces_them(
    engine: sa.Engine, db_url: str, key: Any, column: str, packages: list[str], fake: Any, client: Any, resource: str
) -> None:
    for n, package in enumerate(packages):
        add_campaign(engine, f"camp-{n}", **{column: package})
    run = recent_days()
    table = downloads_table([*packages, "not-a-campaigns"], run, seed=3)
    api = Api(fake(table))
    assert materialize_measurement([key], db_url, run, **{resource: client(api)}).success
    expected = {(day, p): table[p][day] for p in packages for day in run}
    source = key.path[0].removesuffix("_daily")
    # pypistats.org leaves out a day without downloads, npm answers it 0.
    got = stored(engine, source)
    assert {k: v for k, v in got.items() if v} == {k: v for k, v in expected.items() if v}
    assert len(api.requests) == len(packages)  # one per package (npm: one bulk of one, one scoped)
    changed = downloads_table([*packages, "not-a-campaigns"], run, seed=11)
    assert materialize_measurement([key], db_url, run, **{resource: client(Api(fake(changed)))}).success
    again = {(day, p): changed[p][day] for p in packages for day in run}
    assert {k: v for k, v in stored(engine, source).items() if v} == {k: v for k, v in again.items() if v}


def test_the_rollup_counts_each_campaigns_package_downloads(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "camp-py", pypi_package="acme-widget")
    add_campaign(engine, "camp-npm", npm_package="@acme/sdk")
    run = recent_days()
    pypi_table = downloads_table(["acme-widget"], run, seed=5)
    npm_table = downloads_table(["@acme/sdk", "acme-other"], run, seed=7)
    result = materialize_measurement(
        [PYPI_KEY, NPM_KEY],
        db_url,
        run,
        pypistats=mocked_pypistats(Api(PyPIStatsFake(pypi_table))),
        npm_downloads=mocked_npm(Api(NpmDownloadsFake(npm_table))),
    )
    assert result.success
    replace_rollup_days(engine, run)
    r = measurement_daily_rollup
    with engine.connect() as conn:
        found = conn.execute(
            sa.select(r.c.day, r.c.campaign_id, r.c.source, r.c.stage, r.c.event_type, r.c.raw_count).where(
                r.c.source.in_(["pypi_downloads", "npm_downloads"])
            )
        ).all()
    expected = {
        *((d, "camp-py", "pypi_downloads", "package", "pypi_download", pypi_table["acme-widget"][d]) for d in run),
        *((d, "camp-npm", "npm_downloads", "package", "npm_download", npm_table["@acme/sdk"][d]) for d in run),
    }
    assert set(found) == {row for row in expected if row[-1]}


# ---- a year's backfill within the quota -----------------------------------------------------------------------


def test_a_years_backfill_sends_one_request_a_package_or_bulk_and_meets_no_429(engine: sa.Engine) -> None:
    # The quotas at a tenth of their period, so the test takes seconds: the gate sized from the quota keeps a fake
    # that refuses past 30 requests in any such period from ever answering 429.
    fast = Quota(30, 6.0)
    first, last = date(2025, 12, 7), date(2026, 12, 6)
    pypi_packages = [f"py-{n:02d}" for n in range(40)]
    pypi = PyPIStatsFake({p: {last: 1} for p in pypi_packages}, quota=(30, 6.0))
    pypi_gate = request_gate(engine, replace(PYPI_DOWNLOADS, contract=replace(PYPI_DOWNLOADS.contract, quota=fast)))
    pypi_api = Api(pypi)
    got = mocked_pypistats(pypi_api).daily_metrics(last - timedelta(days=179), last, pypi_packages, gate=pypi_gate)
    assert len(pypi_api.requests) == 40 and pypi.quota.refused == 0 and len(rows(got)) == 40

    npm_packages = [f"js-{n:03d}" for n in range(200)] + [f"@acme/s{n}" for n in range(5)]
    npm = NpmDownloadsFake({p: {first: 1, last: 2} for p in npm_packages}, quota=(30, 6.0))
    npm_gate = request_gate(engine, replace(NPM_DOWNLOADS, contract=replace(NPM_DOWNLOADS.contract, quota=fast)))
    npm_api = Api(npm)
    got = mocked_npm(npm_api).daily_metrics(first, last, npm_packages, gate=npm_gate)
    # 365 days in one span: two bulk requests for 200 unscoped packages, one for each scoped one.
    assert len(npm_api.requests) == 2 + 5 and npm.quota.refused == 0
    assert sum(rows(got).values()) == 3 * 205
