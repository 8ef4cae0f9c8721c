"""Package-download importers: daily downloads of the campaigns' PyPI projects (pypistats.org) and npm packages
(api.npmjs.org), the open-source counterpart of GitHub release downloads.

Neither service needs a key. Both count per UTC day and load a day once, soon after it ends, so each contract
re-reads yesterday (sources.py). Every answer passes a shape check (``pypistats_shape_problems``,
``npm_range_problems``) before a number is taken from it: a field missing, of another type, a date that is not a
day, or a count that is negative, fractional, non-finite or past ``MAX_DAILY_DOWNLOADS`` refuses the whole answer
with one ServiceError line, so a changed API fails a run instead of storing zeros.

A package the service does not know (a campaign's typo, a package not yet published) costs only itself: a
warning names it and the campaign column to fix, and the other packages are imported.
"""

from __future__ import annotations

import datetime as dt
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import dagster as dg
import httpx
from pydantic import Field

from marketing_pipelines.egress import api_root_problem
from marketing_pipelines.http import HttpRetry, ServiceError, describe_error_response, send_with_retries
from marketing_pipelines.measurement.importers.base import (
    MAX_COUNT,
    ImporterNotConfigured,
    MetricRow,
    RequestGate,
    error_field,
    every_day,
    hooks,
    response_json,
)
from marketing_pipelines.measurement.sources import NPM_DOWNLOADS, PYPI_DOWNLOADS, SourceContract
from marketing_pipelines.settings import env_name, setting_field, shown_in_ui

DOWNLOADS = "downloads"
# A package's downloads in one day; the most downloaded npm packages see about 10**8. Larger is a corrupt answer.
MAX_DAILY_DOWNLOADS = MAX_COUNT
# Problems quoted in one ServiceError line, at most.
SHOWN_PROBLEMS = 3
# Neither service sends Retry-After on its 429 as documented: a minute is the least wait, past what a step sleeps
# (30 s), so a rate-limited answer hands the step back to Dagster (RateLimited -> RetryRequested) at once.
PACKAGES_HTTP_RETRY = HttpRetry(max_wait_s=30.0, min_rate_limit_wait_s=60.0)
_DAY = re.compile(r"\d{4}-\d{2}-\d{2}")


def _day_problem(value: Any) -> str | None:
    if not (isinstance(value, str) and _DAY.fullmatch(value)):
        return f"{str(value)[:40]!r} is not a YYYY-MM-DD day"
    try:
        dt.date.fromisoformat(value)
    except ValueError:
        return f"{value!r} is not a day of the calendar"
    return None


def _count_problem(value: Any) -> str | None:
    # bool is an int to Python; a float (2.0, 1e400 as inf, NaN) is no count of downloads.
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{str(value)[:40]!r} is not a whole number of downloads"
    if not 0 <= value <= MAX_DAILY_DOWNLOADS:
        return f"{str(value)[:40]} downloads is out of range (0 to {MAX_DAILY_DOWNLOADS})"
    return None


def _refuse(service: str, what: str, problems: Sequence[str]) -> ServiceError:
    more = f" (and {len(problems) - SHOWN_PROBLEMS} more)" if len(problems) > SHOWN_PROBLEMS else ""
    return ServiceError(service, f"unexpected answer for {what}: {'; '.join(problems[:SHOWN_PROBLEMS])}{more}")


def _unknown(service: str, package: str, column: str, said: str) -> None:
    dg.get_dagster_logger().warning(
        f"{service}: package {package[:214]!r} is unknown to the service ({said[:200]}); its downloads are not "
        f"imported. Check the campaign's {column}."
    )


class KeylessDownloadsClient(dg.ConfigurableResource):
    """What the two keyless download APIs' clients share: turned on by a flag, an API root, a timeout, and the
    checks every run makes before its first request."""

    service: ClassVar[str]
    # The variables of the flag and of the API root, and the service's host, as a reason not configured names them.
    enabled_env: ClassVar[str]
    base_url_env: ClassVar[str]
    host: ClassVar[str]

    enabled: bool
    # Shown by name when set, as every API root: a proxy's URL may carry credentials.
    base_url: str
    timeout_s: float = Field(default=30.0, gt=0, description="Timeout of each HTTP call, in seconds.")

    def is_configured(self) -> bool:
        return self.enabled

    def not_configured_reason(self) -> str:
        return "" if self.enabled else f"set {self.enabled_env}=true ({self.host} needs no key)"

    def _empty_days(self, first: dt.date, last: dt.date) -> dict[dt.date, list[MetricRow]]:
        """Every day of the range with no rows yet, once the client may send: turned on, its API root allowed."""
        if not self.is_configured():
            raise ImporterNotConfigured(f"{self.service}: {self.not_configured_reason()}")
        problem = api_root_problem(self.base_url)
        if problem:
            raise ServiceError(self.service, f"{self.base_url_env} {problem}")
        return every_day(first, last)

    def _client(self, gate: RequestGate | None = None) -> httpx.Client:
        # trust_env=False: HTTP(S)_PROXY in the environment must not reroute the importer.
        return httpx.Client(base_url=self.base_url, timeout=self.timeout_s, trust_env=False, event_hooks=hooks(gate))

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)


# ---- PyPI: pypistats.org ------------------------------------------------------------------------------------

PYPI = "pypistats"
PYPI_ENABLED_ENV = env_name("pypi_downloads_enabled")
OVERALL_TYPE = "overall_downloads"
# ?mirrors=false keeps the series without known mirrors (bandersnatch), as pypistats.org shows every number.
WITHOUT_MIRRORS = "without_mirrors"
CATEGORIES = ("with_mirrors", WITHOUT_MIRRORS)
# What a URL path segment may hold of a PyPI project name (PEP 508: letters, digits, . _ -); the campaign column
# is checked on input (db/campaigns.py), this keeps any other value out of the path.
_PYPI_PATH_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,213}")


def pypistats_shape_problems(payload: Any) -> list[str]:
    """What keeps ``payload`` from being pypistats.org's answer to ``/api/packages/{package}/overall``
    (``{"data": [{"category", "date", "downloads"}], "package", "type": "overall_downloads"}``); [] when it is."""
    if not isinstance(payload, dict):
        return [f"the answer is a {type(payload).__name__}, not an object"]
    problems = []
    if payload.get("type") != OVERALL_TYPE:
        problems.append(f"type is {str(payload.get('type'))[:40]!r}, not {OVERALL_TYPE!r}")
    if not isinstance(payload.get("package"), str):
        problems.append("package is not a string")
    data = payload.get("data")
    if not isinstance(data, list):
        return [*problems, "data is not a list"]
    seen: set[tuple[str, str]] = set()
    for n, item in enumerate(data):
        if not isinstance(item, dict) or not {"category", "date", "downloads"} <= set(item):
            problems.append(f"data[{n}] is not an object of category, date and downloads")
            continue
        if item["category"] not in CATEGORIES:
            problems.append(f"data[{n}].category {str(item['category'])[:40]!r} is not one of {CATEGORIES}")
        for problem in (_day_problem(item["date"]), _count_problem(item["downloads"])):
            if problem:
                problems.append(f"data[{n}]: {problem}")
        key = (str(item["category"]), str(item["date"]))
        if key in seen:
            problems.append(f"data[{n}] repeats {key[0]} {key[1][:10]}")
        seen.add(key)
    return problems


@shown_in_ui
class PyPIStatsClient(KeylessDownloadsClient):
    """Daily downloads of the campaigns' PyPI projects from pypistats.org
    (``GET /api/packages/{package}/overall?mirrors=false``), without known mirrors.

    One request a package answers every day pypistats.org keeps (180), so a run of any range asks each package
    once. A day with no downloads has no entry in the answer and no row here.
    """

    name: ClassVar[str] = "pypi_downloads"
    contract: ClassVar[SourceContract] = PYPI_DOWNLOADS.contract
    service: ClassVar[str] = PYPI
    enabled_env: ClassVar[str] = PYPI_ENABLED_ENV
    base_url_env: ClassVar[str] = env_name("pypistats_api_url")
    host: ClassVar[str] = "pypistats.org"

    enabled: bool = setting_field("pypi_downloads_enabled")
    base_url: str = setting_field("pypistats_api_url")

    def daily_metrics(
        self, first: dt.date, last: dt.date, keys: Sequence[str], gate: RequestGate | None = None
    ) -> dict[dt.date, list[MetricRow]]:
        """Each package's downloads on each day from ``first`` to ``last`` (every day present, maybe empty);
        ``gate`` is asked before each request (the shared quota, measurement/quota.py)."""
        by_day = self._empty_days(first, last)
        with self._client(gate) as client:
            for package in keys:
                counts = self._overall(client, package)
                for day, downloads in sorted(counts.items()):
                    if first <= day <= last:
                        by_day[day].append(MetricRow(day, package, DOWNLOADS, downloads))
        return by_day

    def _overall(self, client: httpx.Client, package: str) -> dict[dt.date, int]:
        """``package``'s downloads without mirrors per day; {} (and a warning) when pypistats.org does not know it."""
        if not _PYPI_PATH_SAFE.fullmatch(package):
            _unknown(PYPI, package, "pypi_package", "not a PyPI project name")
            return {}
        request = client.build_request("GET", f"/api/packages/{package}/overall", params={"mirrors": "false"})
        response = send_with_retries(client, request, service=PYPI, policy=PACKAGES_HTTP_RETRY, sleep=self._sleep)
        if response.status_code == 404:
            # pypistats.org answers 404 for a project it has no downloads of in its 180 days, as for one unknown.
            _unknown(PYPI, package, "pypi_package", "HTTP 404: no downloads in its 180 days, or no such project")
            return {}
        if not response.is_success:
            raise describe_error_response(PYPI, response)
        payload = response_json(PYPI, response)
        problems = pypistats_shape_problems(payload)
        if problems:
            raise _refuse(PYPI, package, problems)
        return {
            dt.date.fromisoformat(item["date"]): item["downloads"]
            for item in payload["data"]
            if item["category"] == WITHOUT_MIRRORS
        }


# ---- npm: api.npmjs.org --------------------------------------------------------------------------------------

NPM = "npm"
NPM_ENABLED_ENV = env_name("npm_downloads_enabled")
# "Bulk queries are limited to at most 128 packages at a time and at most 365 days of data" (Limits); a single
# package may span 18 months, but one span for both keeps every request within both limits.
BULK_PACKAGES = 128
MAX_SPAN_DAYS = 365
# A package name as it may go into the path: unscoped, or @scope/name ("Scoped packages are not yet supported in
# bulk queries"). Never a comma, which would split a bulk query.
_NPM_PATH_SAFE = re.compile(r"(@[A-Za-z0-9~-][A-Za-z0-9._~-]*/)?[A-Za-z0-9~-][A-Za-z0-9._~-]*")
_NOT_FOUND = re.compile(r"package .* not found")


def npm_range_problems(payload: Any, first: dt.date, last: dt.date) -> list[str]:
    """What keeps ``payload`` from being npm's range answer for one package over ``first`` to ``last``
    (``{"downloads": [{"downloads", "day"}], "start", "end", "package"}``); [] when it is.

    The answer may end before ``last`` (a day not yet loaded) but must start at ``first``: npm cuts a range it will
    not serve from its start (npm/registry-issue-archive#206), and the days cut would read as no downloads.
    """
    if not isinstance(payload, dict):
        return [f"the answer is a {type(payload).__name__}, not an object"]
    if "error" in payload:
        return [f"error {str(payload['error'])[:200]!r}"]
    problems = [f"{field}: {p}" for field in ("start", "end") if (p := _day_problem(payload.get(field)))]
    if not isinstance(payload.get("package"), str):
        problems.append("package is not a string")
    downloads = payload.get("downloads")
    if not isinstance(downloads, list):
        return [*problems, "downloads is not a list"]
    if problems:
        return problems
    start, end = dt.date.fromisoformat(payload["start"]), dt.date.fromisoformat(payload["end"])
    if start != first or not start <= end <= last:
        problems.append(f"answered {start}..{end} for {first}..{last}")
    seen: set[str] = set()
    for n, item in enumerate(downloads):
        if not isinstance(item, dict) or not {"day", "downloads"} <= set(item):
            problems.append(f"downloads[{n}] is not an object of day and downloads")
            continue
        for problem in (_day_problem(item["day"]), _count_problem(item["downloads"])):
            if problem:
                problems.append(f"downloads[{n}]: {problem}")
        if _day_problem(item["day"]) is None and not start <= dt.date.fromisoformat(item["day"]) <= end:
            problems.append(f"downloads[{n}] is of {item['day']}, outside {start}..{end}")
        if item["day"] in seen:
            problems.append(f"downloads[{n}] repeats {str(item['day'])[:10]}")
        seen.add(str(item["day"]))
    return problems


def spans(first: dt.date, last: dt.date) -> Iterator[tuple[dt.date, dt.date]]:
    """``first`` to ``last`` in consecutive ranges of at most MAX_SPAN_DAYS days."""
    while first <= last:
        end = min(last, first + dt.timedelta(days=MAX_SPAN_DAYS - 1))
        yield first, end
        first = end + dt.timedelta(days=1)


def npm_requests(packages: Sequence[str]) -> list[list[str]]:
    """The packages each request asks for: unscoped ones 128 at a time, each scoped one alone."""
    unscoped = [p for p in packages if not p.startswith("@")]
    scoped = [[p] for p in packages if p.startswith("@")]
    return [unscoped[n : n + BULK_PACKAGES] for n in range(0, len(unscoped), BULK_PACKAGES)] + scoped


@shown_in_ui
class NpmDownloadsClient(KeylessDownloadsClient):
    """Daily downloads of the campaigns' npm packages from npm's download counts API
    (``GET /downloads/range/{start}:{end}/{packages}``).

    Up to 128 unscoped packages share a request over up to 365 days; a scoped package (``@scope/name``) is asked
    alone, as bulk queries do not take one. A package npm does not know answers null in a bulk answer, 404 alone.
    """

    name: ClassVar[str] = "npm_downloads"
    contract: ClassVar[SourceContract] = NPM_DOWNLOADS.contract
    service: ClassVar[str] = NPM
    enabled_env: ClassVar[str] = NPM_ENABLED_ENV
    base_url_env: ClassVar[str] = env_name("npm_downloads_api_url")
    host: ClassVar[str] = "api.npmjs.org"

    enabled: bool = setting_field("npm_downloads_enabled")
    base_url: str = setting_field("npm_downloads_api_url")

    def daily_metrics(
        self, first: dt.date, last: dt.date, keys: Sequence[str], gate: RequestGate | None = None
    ) -> dict[dt.date, list[MetricRow]]:
        """Each package's downloads on each day from ``first`` to ``last`` (every day present, maybe empty);
        ``gate`` is asked before each request (the shared quota, measurement/quota.py)."""
        by_day = self._empty_days(first, last)
        packages = []
        for package in keys:
            if _NPM_PATH_SAFE.fullmatch(package):
                packages.append(package)
            else:
                _unknown(NPM, package, "npm_package", "not an npm package name")
        with self._client(gate) as client:
            for start, end in spans(first, last):
                for asked in npm_requests(packages):
                    for package, counts in self._range(client, start, end, asked).items():
                        for day, downloads in sorted(counts.items()):
                            by_day[day].append(MetricRow(day, package, DOWNLOADS, downloads))
        return by_day

    def _range(
        self, client: httpx.Client, first: dt.date, last: dt.date, packages: list[str]
    ) -> dict[str, dict[dt.date, int]]:
        """Each of ``packages``' downloads per day (one request); a package npm does not know is left out."""
        # The path as the docs write it, a scoped name's slash included (/downloads/point/last-month/@slack/client).
        request = client.build_request("GET", f"/downloads/range/{first}:{last}/{','.join(packages)}")
        response = send_with_retries(client, request, service=NPM, policy=PACKAGES_HTTP_RETRY, sleep=self._sleep)
        said = error_field(response, "error", 200) if not response.is_success else ""
        if response.status_code == 404 and len(packages) == 1 and _NOT_FOUND.fullmatch(said):
            _unknown(NPM, packages[0], "npm_package", said)
            return {}
        if response.status_code == 400:
            raise ServiceError(NPM, f"query {first}..{last} rejected (HTTP 400): {said}", 400)
        if not response.is_success:
            raise describe_error_response(NPM, response)
        payload = response_json(NPM, response)
        if isinstance(payload, dict) and isinstance(payload.get("error"), str):
            # npm has answered some refusals with 200 and {"error": "..."} instead of a status.
            raise ServiceError(NPM, f"query {first}..{last} refused: {payload['error'][:200]}")
        if len(packages) == 1:
            # One package answers its object alone, not keyed by its name.
            answers: Mapping[str, Any] = {packages[0]: payload}
        elif isinstance(payload, dict) and set(payload) == set(packages):
            answers = payload
        else:
            shown = sorted(map(str, payload))[:5] if isinstance(payload, dict) else type(payload).__name__
            raise _refuse(NPM, f"{len(packages)} packages", [f"not an object keyed by the packages asked: {shown}"])
        counts: dict[str, dict[dt.date, int]] = {}
        for package, answer in answers.items():
            if answer is None:
                _unknown(NPM, package, "npm_package", "null in a bulk answer")
                continue
            problems = npm_range_problems(answer, first, last)
            if not problems and answer["package"] != package:
                problems = [f"answered package {answer['package'][:214]!r}"]
            if problems:
                raise _refuse(NPM, package, problems)
            counts[package] = {dt.date.fromisoformat(i["day"]): i["downloads"] for i in answer["downloads"]}
        return counts
