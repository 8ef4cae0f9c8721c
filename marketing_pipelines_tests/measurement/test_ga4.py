"""The GA4 importer: its service-account key (text or file, refused in one line that never quotes it), the signed
assertion Google's token endpoint verifies, the runReport it pages through, GA4's errors, and its asset and rollup rows
on real databases."""

from __future__ import annotations

import base64
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import dagster as dg
import httpx
import pytest
import sqlalchemy as sa
from cryptography.hazmat.primitives.asymmetric import ec

from marketing_pipelines import redact
from marketing_pipelines.db.schema import measurement_daily_rollup, source_daily_metric
from marketing_pipelines.http import RateLimited, ServiceError
from marketing_pipelines.measurement.importers.base import Importer, ImporterNotConfigured, MetricImporter
from marketing_pipelines.measurement.importers.ga4 import GA4Client
from marketing_pipelines.measurement.keys import ROLLUP_KEY
from marketing_pipelines.measurement.quota import request_gate
from marketing_pipelines.measurement.sources import GA4, Quota, source_named
from marketing_pipelines.service_account import (
    GOOGLE_TOKEN_URL,
    ServiceAccountKeyError,
    key_secrets,
    read_service_account_key,
    signed_assertion,
)
from marketing_pipelines.settings import SettingsError, load_settings
from marketing_pipelines_tests.factories import add_campaign, settings_from
from marketing_pipelines_tests.measurement.fake_services import (
    CLIENT_EMAIL,
    GA4_PROPERTY,
    GA4_REPORT_URL,
    GA4_SCOPE,
    Api,
    FakeGoogle,
    ga4_report,
    google_error,
    mocked_ga4,
    private_pem,
    rsa_key,
    service_account_key,
    verified_claims,
)
from marketing_pipelines_tests.measurement.runs import materialize_measurement

DAY = dt.date(2026, 11, 24)
GA4_KEY = dg.AssetKey("ga4_daily")
# The private key's body, as a leak would show it: any 12-character piece of it must appear nowhere.
KEY_BODY = "".join(line for line in private_pem(rsa_key()).splitlines() if not line.startswith("-----"))


def pieces(secret: str) -> set[str]:
    return {secret[i : i + 12] for i in range(len(secret) - 11)}


def leaked(text: str, secret: str) -> list[str]:
    return sorted(piece for piece in pieces(secret) if piece in text)


def key_json(**fields: Any) -> str:
    return json.dumps(service_account_key(**fields))


def one_report(rows: list[tuple[dt.date, str, int, int, int]]) -> FakeGoogle:
    return FakeGoogle(lambda body: ga4_report(rows))


# ---- the key --------------------------------------------------------------------------------------------------


def test_the_key_is_its_json_text_or_the_path_of_its_file(tmp_path: Path) -> None:
    path = tmp_path / "key.json"
    path.write_text(key_json(), encoding="utf-8")
    from_text, from_file = read_service_account_key(key_json()), read_service_account_key(f"  {path}\n")
    assert from_text == from_file
    assert (from_text.client_email, from_text.token_uri) == (CLIENT_EMAIL, GOOGLE_TOKEN_URL)
    # The private key is not in its repr (a log line of the key object shows no secret).
    assert "PRIVATE" not in repr(from_text) and from_text.private_key_id not in repr(from_text)
    # Settings take either form; the value is kept as given (the client reads the file again where it runs).
    assert load_settings(ga4_service_account_json=str(path)).ga4_service_account_json is not None


def _ec_pem() -> str:
    from cryptography.hazmat.primitives import serialization

    ec_key = ec.generate_private_key(ec.SECP256R1())
    return ec_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode("ascii")


CUT_PEM = private_pem(rsa_key())[:400] + "\n-----END PRIVATE KEY-----\n"
REFUSED_KEYS = {
    "not JSON": (lambda: key_json()[:-40], "is not JSON (line"),
    "a JSON list": (lambda: json.dumps([service_account_key()]), "not an object"),
    "a user's credentials": (
        lambda: json.dumps({"type": "authorized_user", "client_id": "x", "refresh_token": "1//0g" + KEY_BODY[:40]}),
        'of type "authorized_user", not a service-account key',
    ),
    "no type": (lambda: key_json(type="nonsense " + KEY_BODY[:30]), 'without type "service_account"'),
    "no client_email": (lambda: key_json(client_email=None), 'without a "client_email"'),
    "a private key cut short": (lambda: key_json(private_key=CUT_PEM), "not an unencrypted PEM private key"),
    "an EC key": (lambda: key_json(private_key=_ec_pem()), "not an RSA key"),
    "no private key": (lambda: key_json(private_key=""), 'without a PEM "private_key"'),
}


@pytest.mark.parametrize("shape", REFUSED_KEYS)
def test_a_value_that_is_no_service_account_key_is_refused_in_one_line_that_never_quotes_it(
    shape: str, tmp_path: Path
) -> None:
    make, said = REFUSED_KEYS[shape]
    text = make()
    path = tmp_path / "key.json"
    path.write_text(text, encoding="utf-8")
    for value in (text, str(path)):
        with pytest.raises(ServiceAccountKeyError) as refused:
            read_service_account_key(value)
        assert said in str(refused.value)
        with pytest.raises(SettingsError) as at_load:
            load_settings(ga4_service_account_json=value)
        message = str(at_load.value)
        assert message.startswith("GA4_SERVICE_ACCOUNT_JSON=(a secret, not shown) is not valid: "), message
        assert "\n" not in message and said.lower()[:20] in message.lower()
        assert leaked(message, KEY_BODY) == [] and str(tmp_path) not in message


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (None, "nor the path of a readable file (No such file or directory)"),
        (b"\xff\xfe" + b"x" * 100, "not UTF-8 text"),
        (b"{" + b" " * (70 * 1024) + b"}", "larger than 64 KiB"),
    ],
)
def test_a_path_to_no_key_file_is_refused_without_the_path(tmp_path: Path, content: bytes | None, said: str) -> None:
    path = tmp_path / "secret-dir" / "key.json"
    if content is not None:
        path.parent.mkdir()
        path.write_bytes(content)
    with pytest.raises(SettingsError) as refused:
        load_settings(ga4_service_account_json=str(path))
    assert said in str(refused.value) and "secret-dir" not in str(refused.value)


def test_a_loaded_key_hides_its_private_key_from_every_text_the_process_shows() -> None:
    load_settings(ga4_service_account_json=key_json())
    # Echoed whole, cut, or over lines as a JSON string: hidden.
    pem = private_pem(rsa_key())
    for echo in (pem, pem[200:600], json.dumps({"private_key": pem}), KEY_BODY[100:160]):
        assert leaked(redact.redact_text(f"the service said: {echo}"), KEY_BODY) == []
    # Its public parts stay readable: Google's token endpoint, the field names.
    shown = redact.redact_text('token_uri "https://oauth2.googleapis.com/token" of "service_account" keys')
    assert "oauth2.googleapis.com" in shown and "service_account" in shown
    assert key_secrets("not a key") == ()


@pytest.mark.parametrize(("given", "kept"), [("123456789", "123456789"), (" properties/42 ", "42"), ("", None)])
def test_the_property_is_its_number(given: str, kept: str | None) -> None:
    assert load_settings(ga4_property_id=given).ga4_property_id == kept


def test_a_property_that_is_no_number_is_refused() -> None:
    with pytest.raises(SettingsError, match=r"GA4_PROPERTY_ID=\(a secret, not shown\) is not valid: must be the "):
        load_settings(ga4_property_id="UA-12345-1")


def test_the_signed_assertion_verifies_with_the_keys_public_key() -> None:
    key = read_service_account_key(key_json())
    assertion = signed_assertion(key, scope=GA4_SCOPE, audience=GOOGLE_TOKEN_URL, issued_at=1_790_000_000)
    header, claims = verified_claims(assertion, rsa_key().public_key())
    assert header == {"alg": "RS256", "typ": "JWT", "kid": key.private_key_id}
    assert claims == {
        "iss": CLIENT_EMAIL,
        "scope": GA4_SCOPE,
        "aud": GOOGLE_TOKEN_URL,
        "iat": 1_790_000_000,
        "exp": 1_790_003_600,
    }
    # Another key's public key does not verify it: the fake token endpoint really checks.
    from cryptography.exceptions import InvalidSignature

    with pytest.raises(InvalidSignature):
        verified_claims(assertion, rsa_key("another").public_key())
    with pytest.raises(ValueError, match="an assertion lives 1 to 3600 s"):
        signed_assertion(key, scope=GA4_SCOPE, audience=GOOGLE_TOKEN_URL, issued_at=0, lifetime_s=7200)


# ---- the client -----------------------------------------------------------------------------------------------


def test_the_client_meets_the_importer_interface_and_declares_the_contract() -> None:
    assert isinstance(GA4Client(), Importer) and isinstance(GA4Client(), MetricImporter)
    assert GA4Client.contract is GA4.contract and source_named("ga4") is GA4
    contract = GA4.contract
    assert (contract.lookback_days, contract.revision_days, contract.retention_days) == (None, 2, None)
    assert contract.summable == ("sessions", "page_views") and contract.range_only == ("total_users",)
    assert [(c.stage, c.event_type) for c in contract.counted] == [("site", "ga4_session"), ("site", "ga4_pageview")]
    # 500 requests an hour at about 10 tokens each stay within 40,000 tokens an hour and, all day, 200,000 a day.
    assert contract.quota == Quota(500, 3600.0, concurrency=10)
    assert contract.quota.requests * 10 <= 40_000 / 4 and contract.quota.requests * 10 * 24 <= 200_000 * 0.75
    assert (GA4.asset, GA4.resource_key, contract.match) == ("ga4_daily", "ga4", "utm_campaign")


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({}, "set GA4_PROPERTY_ID and GA4_SERVICE_ACCOUNT_JSON"),
        ({"property_id": "1"}, "set GA4_SERVICE_ACCOUNT_JSON"),
        ({"service_account_json": " "}, "set GA4_PROPERTY_ID and GA4_SERVICE_ACCOUNT_JSON"),
    ],
)
def test_not_configured_names_what_to_set(fields: dict[str, str], reason: str) -> None:
    client = GA4Client(**fields)
    assert not client.is_configured() and client.not_configured_reason() == reason
    with pytest.raises(ImporterNotConfigured, match=reason):
        client.daily_metrics(DAY, DAY, ["spring26"])


def test_one_report_reads_the_range_for_every_key_with_a_verified_assertion_and_keeps_the_token() -> None:
    google = one_report([(DAY, "spring26", 12, 30, 9), (DAY + dt.timedelta(days=1), "autumn26", 3, 4, 2)])
    api = Api(google)
    client = mocked_ga4(api)
    first, last = DAY, DAY + dt.timedelta(days=2)
    by_day = client.daily_metrics(first, last, ["spring26", "autumn26"])
    # Every day of the range is there, an empty one too; each row's three metrics under the contract's names.
    assert {day: [(r.key, r.metric, r.value, r.dimension) for r in rows] for day, rows in by_day.items()} == {
        DAY: [("spring26", "sessions", 12, ""), ("spring26", "page_views", 30, ""), ("spring26", "total_users", 9, "")],
        DAY + dt.timedelta(days=1): [
            ("autumn26", "sessions", 3, ""),
            ("autumn26", "page_views", 4, ""),
            ("autumn26", "total_users", 2, ""),
        ],
        last: [],
    }
    token_request, report_request = api.requests
    assert str(token_request.url) == GOOGLE_TOKEN_URL and str(report_request.url) == GA4_REPORT_URL
    assert report_request.headers["authorization"] == f"Bearer {google.issued[0]}"
    assert google.reports == [
        {
            "dateRanges": [{"startDate": "2026-11-24", "endDate": "2026-11-26"}],
            "dimensions": [{"name": "date"}, {"name": "sessionCampaignName"}],
            "metrics": [{"name": "sessions"}, {"name": "screenPageViews"}, {"name": "totalUsers"}],
            "dimensionFilter": {
                "filter": {
                    "fieldName": "sessionCampaignName",
                    "inListFilter": {"values": ["spring26", "autumn26"], "caseSensitive": True},
                }
            },
            "orderBys": [
                {"dimension": {"dimensionName": "date"}},
                {"dimension": {"dimensionName": "sessionCampaignName"}},
            ],
            "limit": 250_000,
            "offset": 0,
            "returnPropertyQuota": True,
        }
    ]
    # A second import within the hour sends the kept token: no second assertion.
    client.daily_metrics(first, last, ["spring26"])
    assert len(google.assertions) == 1 and len(google.reports) == 2
    # The token and the assertion are secrets to this process from now on.
    assert google.issued[0] not in redact.redact_text(f"echo {google.issued[0]}")


def test_the_report_is_paged_by_limit_and_offset_until_its_row_count() -> None:
    days = [DAY + dt.timedelta(days=n) for n in range(5)]
    everything = [(day, "spring26", n + 1, n + 2, 1) for n, day in enumerate(days)]

    def page(body: dict[str, Any]) -> dict[str, Any]:
        offset, limit = body["offset"], body["limit"]
        return ga4_report(everything[offset : offset + limit], row_count=len(everything))

    google = FakeGoogle(page)
    by_day = mocked_ga4(Api(google), page_size=2).daily_metrics(days[0], days[-1], ["spring26"])
    assert [(b["offset"], b["limit"]) for b in google.reports] == [(0, 2), (2, 2), (4, 2)]
    assert [sum(r.value for r in by_day[day] if r.metric == "sessions") for day in days] == [1, 2, 3, 4, 5]
    assert len(google.assertions) == 1  # one token for every page


def test_an_empty_report_is_every_day_empty_after_one_request() -> None:
    # proto3 JSON leaves out a zero rowCount and empty rows: the answer has neither.
    google = FakeGoogle(lambda body: ga4_report([]))
    api = Api(google)
    assert mocked_ga4(api).daily_metrics(DAY, DAY, ["spring26"]) == {DAY: []}
    assert len(google.reports) == 1
    # No campaign key, no request at all.
    assert mocked_ga4(Api(google)).daily_metrics(DAY, DAY, []) == {DAY: []}
    assert len(google.reports) == 1


def test_a_token_about_to_expire_is_replaced_before_it_is_sent() -> None:
    google = one_report([(DAY, "spring26", 1, 1, 1)])
    clock = [1_790_000_000.0]
    api = Api(google)
    client = mocked_ga4(api, now=lambda: clock[0])
    client.daily_metrics(DAY, DAY, ["spring26"])
    clock[0] += 3599 - 400  # more than five minutes left: kept
    client.daily_metrics(DAY, DAY, ["spring26"])
    clock[0] += 200  # under five minutes left: a new one
    client.daily_metrics(DAY, DAY, ["spring26"])
    assert len(google.assertions) == 2 and google.assertions[1][1]["iat"] == int(clock[0])
    assert [r.headers["authorization"] for r in api.requests if r.url.path.endswith(":runReport")] == [
        f"Bearer {google.issued[0]}",
        f"Bearer {google.issued[0]}",
        f"Bearer {google.issued[1]}",
    ]


def test_a_401_gets_one_new_token_and_one_more_try() -> None:
    google = one_report([(DAY, "spring26", 1, 1, 1)])
    api = Api(google)
    client = mocked_ga4(api)
    client.daily_metrics(DAY, DAY, ["spring26"])
    google.issued.clear()  # Google revoked it
    assert client.daily_metrics(DAY, DAY, ["spring26"])[DAY]
    assert len(google.assertions) == 2


def test_an_assertion_signed_by_another_key_is_refused_by_the_token_endpoint_naming_the_key() -> None:
    google = FakeGoogle(lambda body: ga4_report([]), public_key=rsa_key("another").public_key())
    api = Api(google)
    with pytest.raises(ServiceError) as refused:
        mocked_ga4(api).daily_metrics(DAY, DAY, ["spring26"])
    message = str(refused.value)
    assert "the token endpoint refused the service account's assertion (HTTP 400: invalid_grant" in message
    assert "check GA4_SERVICE_ACCOUNT_JSON" in message and not refused.value.transient
    assert [str(r.url) for r in api.requests] == [GOOGLE_TOKEN_URL]  # no report asked without a token


@pytest.mark.parametrize(
    "token_answer",
    [
        httpx.Response(200, json={"expires_in": 3599, "token_type": "Bearer"}),
        httpx.Response(200, json={"access_token": "has\nnewline", "expires_in": 3599, "token_type": "Bearer"}),
        httpx.Response(200, json={"access_token": "ya29.abcdefgh", "expires_in": 3599, "token_type": "MAC"}),
        httpx.Response(200, json={"access_token": "ya29.abcdefgh", "expires_in": -5, "token_type": "Bearer"}),
        httpx.Response(200, text="<html>not json</html>"),
    ],
)
def test_a_token_answer_that_is_not_a_bearer_token_is_refused(token_answer: httpx.Response) -> None:
    google = FakeGoogle(lambda body: ga4_report([]), token=lambda n: token_answer)
    with pytest.raises(ServiceError, match="ga4: "):
        mocked_ga4(Api(google)).daily_metrics(DAY, DAY, ["spring26"])
    assert google.reports == []


def test_a_key_naming_another_token_endpoint_sends_no_assertion_unless_that_endpoint_is_configured() -> None:
    elsewhere = "https://tokens.example.org/token"
    google = FakeGoogle(lambda body: ga4_report([]), token_url=elsewhere)
    api = Api(google)
    with pytest.raises(ServiceError) as refused:
        mocked_ga4(api, service_account_json=key_json(token_uri=elsewhere)).daily_metrics(DAY, DAY, ["spring26"])
    assert "no signed assertion is sent to it. Set GA4_TOKEN_URL" in str(refused.value)
    assert api.requests == []
    # Configured, it is where the assertion goes (its audience), and only there.
    client = mocked_ga4(api, service_account_json=key_json(token_uri=elsewhere), token_url=elsewhere)
    assert client.daily_metrics(DAY, DAY, ["spring26"]) == {DAY: []}
    assert str(api.requests[0].url) == elsewhere and google.assertions[0][1]["aud"] == elsewhere
    # A configured endpoint does not let the key name a third one.
    with pytest.raises(ServiceError, match="is not Google's token endpoint"):
        third = key_json(token_uri="https://evil.example/token")
        mocked_ga4(api, service_account_json=third, token_url=elsewhere).daily_metrics(DAY, DAY, ["spring26"])


def test_a_key_file_is_read_where_the_client_runs(tmp_path: Path) -> None:
    path = tmp_path / "key.json"
    path.write_text(key_json(), encoding="utf-8")
    google = one_report([(DAY, "spring26", 1, 2, 1)])
    assert mocked_ga4(Api(google), service_account_json=str(path)).daily_metrics(DAY, DAY, ["spring26"])[DAY]
    path.unlink()
    with pytest.raises(ServiceError, match=r"GA4_SERVICE_ACCOUNT_JSON is neither .* readable file"):
        mocked_ga4(Api(google), service_account_json=str(path)).daily_metrics(DAY, DAY, ["spring26"])


def test_403_permission_denied_says_the_service_account_must_be_added_to_the_property() -> None:
    message = "User does not have sufficient permissions for this property. To learn more about Property ID, see ..."
    google = FakeGoogle(lambda body: google_error(403, "PERMISSION_DENIED", message))
    with pytest.raises(ServiceError) as refused:
        mocked_ga4(Api(google)).daily_metrics(DAY, DAY, ["spring26"])
    said = str(refused.value)
    assert said.startswith("ga4: access refused (HTTP 403 PERMISSION_DENIED): User does not have sufficient")
    assert "check GA4_SERVICE_ACCOUNT_JSON and GA4_PROPERTY_ID" in said
    assert f"the service account ({CLIENT_EMAIL}) must be added to the property" in said
    assert refused.value.status == 403 and not refused.value.transient


@pytest.mark.parametrize(
    ("message", "wait"),
    [
        ("Exhausted property tokens per hour for a property. This request cannot be served.", 1200.0),
        ("Exhausted concurrent requests quota.", 30.0),
        ("Resource has been exhausted (e.g. check quota).", 1200.0),
    ],
)
def test_429_resource_exhausted_is_rate_limited_unretried_in_process(message: str, wait: float) -> None:
    google = FakeGoogle(lambda body: google_error(429, "RESOURCE_EXHAUSTED", message))
    with pytest.raises(RateLimited) as limited:
        mocked_ga4(Api(google)).daily_metrics(DAY, DAY, ["spring26"])
    assert limited.value.retry_after_s == wait and "RESOURCE_EXHAUSTED" in str(limited.value)
    assert len(google.reports) == 1  # not retried in-process: the step is handed back to Dagster


def test_a_spent_daily_quota_fails_without_a_retry() -> None:
    google = FakeGoogle(lambda body: google_error(429, "RESOURCE_EXHAUSTED", "Exhausted property tokens per day."))
    with pytest.raises(ServiceError) as refused:
        mocked_ga4(Api(google)).daily_metrics(DAY, DAY, ["spring26"])
    assert not isinstance(refused.value, RateLimited) and not refused.value.transient
    assert "daily token quota is spent" in str(refused.value)


def test_400_quotes_googles_message_and_5xx_is_retried_then_transient() -> None:
    google = FakeGoogle(lambda body: google_error(400, "INVALID_ARGUMENT", "Field foo is not a valid dimension."))
    with pytest.raises(ServiceError, match=r"report rejected \(HTTP 400 INVALID_ARGUMENT\): Field foo is not"):
        mocked_ga4(Api(google)).daily_metrics(DAY, DAY, ["spring26"])
    failing = FakeGoogle(lambda body: google_error(503, "UNAVAILABLE", "The service is currently unavailable."))
    with pytest.raises(ServiceError) as gave_up:
        mocked_ga4(Api(failing)).daily_metrics(DAY, DAY, ["spring26"])
    # Three tries, not five: a standard property allows 10 server errors per project and hour.
    assert gave_up.value.transient and len(failing.reports) == 3


@pytest.mark.parametrize(
    ("rows", "said"),
    [
        ([(DAY, "(other)", 1, 1, 1)], re.escape('folded some rows into "(other)"')),
        ([(DAY - dt.timedelta(days=1), "spring26", 1, 1, 1)], "asked for 2026-11-24..2026-11-24 but got a row for"),
    ],
)
def test_a_row_the_import_cannot_place_refuses_the_whole_answer(
    rows: list[tuple[dt.date, str, int, int, int]], said: str
) -> None:
    with pytest.raises(ServiceError, match=said):
        mocked_ga4(Api(one_report(rows))).daily_metrics(DAY, DAY, ["spring26"])


@pytest.mark.parametrize(
    "edit",
    [
        lambda a: a["rows"][0]["dimensionValues"][0].update(value="2026-11-24"),  # not YYYYMMDD
        lambda a: a["rows"][0]["metricValues"][0].update(value="12.5"),
        lambda a: a["rows"][0]["metricValues"][0].update(value="-3"),
        lambda a: a["rows"][0]["metricValues"].pop(),
        lambda a: a.pop("metricHeaders"),
        lambda a: a.update(rowCount="1"),
    ],
)
def test_a_malformed_report_is_a_service_error(edit: Any) -> None:
    answer = ga4_report([(DAY, "spring26", 12, 30, 9)])
    edit(answer)
    with pytest.raises(ServiceError, match="ga4: "):
        mocked_ga4(Api(FakeGoogle(lambda body: answer))).daily_metrics(DAY, DAY, ["spring26"])


def test_the_shared_quota_counts_report_requests_not_token_requests(engine: sa.Engine) -> None:
    google = one_report([])
    api = Api(google)
    asked: list[str] = []
    gate = request_gate(engine, GA4)

    def counting(request: httpx.Request) -> None:
        asked.append(str(request.url))
        gate(request)

    mocked_ga4(api).daily_metrics(DAY, DAY, ["spring26"], gate=counting)
    assert asked == [GA4_REPORT_URL] and len(api.requests) == 2


def test_the_property_quota_is_logged_and_a_low_one_warned(caplog: pytest.LogCaptureFixture) -> None:
    low = {"tokensPerDay": {"consumed": 195_000, "remaining": 5_000}, "tokensPerHour": {"consumed": 40}}
    google = FakeGoogle(lambda body: ga4_report([], propertyQuota=low, metadata={"subjectToThresholding": True}))
    with caplog.at_level("INFO"):
        mocked_ga4(Api(google)).daily_metrics(DAY, DAY, ["spring26"])
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert (
        "GA4 property quota: tokensPerDay 195000 consumed, 5000 remaining; tokensPerHour 40 consumed, 0 remaining"
        in (warnings[0])
    )
    assert any("subjectToThresholding" in w for w in warnings)


# ---- the asset and the rollup ---------------------------------------------------------------------------------


def test_the_asset_stores_each_day_and_the_rollup_sums_sessions_and_page_views_per_campaign(
    engine: sa.Engine, db_url: str
) -> None:
    add_campaign(engine, "spring", utm_campaign="spring26")
    add_campaign(engine, "autumn", utm_campaign="autumn26")
    days = [DAY, DAY + dt.timedelta(days=1)]
    answers = [
        [(DAY, "spring26", 12, 30, 9), (DAY, "autumn26", 2, 3, 2), (days[1], "spring26", 5, 6, 5)],
        [(DAY, "spring26", 13, 31, 10)],  # GA4 revised the day: a re-run replaces it, never adds
    ]
    google = FakeGoogle(lambda body: ga4_report(answers[min(len(google.reports), 2) - 1]))
    result = materialize_measurement([GA4_KEY, ROLLUP_KEY], db_url, days, ga4=mocked_ga4(Api(google)))
    assert result.success
    # The query asked for both campaigns' keys, and the whole range at once.
    [body] = google.reports
    assert body["dimensionFilter"]["filter"]["inListFilter"]["values"] == ["autumn26", "spring26"]
    assert body["dateRanges"] == [{"startDate": "2026-11-24", "endDate": "2026-11-25"}]
    by_day = {
        e.partition: e.materialization.metadata
        for e in result.get_asset_materialization_events()
        if e.asset_key == GA4_KEY
    }
    assert {k: v.value for k, v in by_day[DAY.isoformat()].items()} == {
        "rows": 6,
        "keys": 2,
        "sessions": 14,
        "page_views": 33,
        "status": "imported",
    }
    r = measurement_daily_rollup
    query = sa.select(r.c.day, r.c.campaign_id, r.c.event_type, r.c.raw_count, r.c.unique_actors).where(
        r.c.source == "ga4"
    )
    with engine.connect() as conn:
        rolled = sorted(conn.execute(query).all())
    # Sessions and page views are summed per campaign and day (stage "site"); users are not rolled up.
    assert rolled == [
        (DAY, "autumn", "ga4_pageview", 3, None),
        (DAY, "autumn", "ga4_session", 2, None),
        (DAY, "spring", "ga4_pageview", 30, None),
        (DAY, "spring", "ga4_session", 12, None),
        (days[1], "spring", "ga4_pageview", 6, None),
        (days[1], "spring", "ga4_session", 5, None),
    ]
    assert materialize_measurement([GA4_KEY], db_url, [DAY], ga4=mocked_ga4(Api(google))).success
    m = source_daily_metric
    with engine.connect() as conn:
        stored = conn.execute(
            sa.select(m.c.key, m.c.metric, m.c.value).where(m.c.source == "ga4", m.c.day == DAY).order_by(m.c.metric)
        ).all()
    assert stored == [("spring26", "page_views", 31), ("spring26", "sessions", 13), ("spring26", "total_users", 10)]


def test_a_rate_limited_import_is_handed_back_to_dagster(
    engine: sa.Engine, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import marketing_pipelines.measurement.importers.ga4 as ga4_module

    add_campaign(engine, "spring", utm_campaign="spring26")
    answers = [google_error(429, "RESOURCE_EXHAUSTED", "Exhausted concurrent requests quota."), ga4_report([])]
    google = FakeGoogle(lambda body: answers[min(len(google.reports), 2) - 1])
    # Dagster's RetryRequested waits the 30 s the concurrent quota asks for; the test does not.
    monkeypatch.setattr(ga4_module, "CONCURRENT_WAIT_S", 0.0)
    result = materialize_measurement([GA4_KEY], db_url, [DAY], ga4=mocked_ga4(Api(google)))
    assert result.success
    retries = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    assert len(retries) == 1 and len(google.reports) == 2


def test_a_permission_denied_fails_the_partition_without_a_retry(engine: sa.Engine, db_url: str) -> None:
    add_campaign(engine, "spring", utm_campaign="spring26")
    google = FakeGoogle(
        lambda body: google_error(403, "PERMISSION_DENIED", "User does not have sufficient permissions")
    )
    result = materialize_measurement([GA4_KEY], db_url, [DAY], ga4=mocked_ga4(Api(google)), raise_on_error=False)
    assert not result.success
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY]
    [failure] = [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    assert "must be added to the property" in failure.step_failure_data.user_failure_data.description  # type: ignore[union-attr]


# What GA4 and the token endpoint might quote back: the access token sent, the assertion, the private key.
ECHOES: dict[str, Any] = {
    "403 quoting the access token": lambda g: google_error(403, "PERMISSION_DENIED", f"bad token {g.issued[-1]}"),
    "400 quoting the token base64'd": lambda g: google_error(
        400, "INVALID_ARGUMENT", f"bad {base64.b64encode(g.issued[-1].encode()).decode()}"
    ),
    "a row quoting the private key": lambda g: httpx.Response(200, json=ga4_report([(DAY, KEY_BODY[40:100], 1, 1, 1)])),
    "404 quoting the private key": lambda g: google_error(404, "NOT_FOUND", f"key {KEY_BODY[100:400]}"),
}


@pytest.mark.parametrize("shape", ECHOES)
def test_an_echo_of_a_credential_lands_on_no_surface(
    shape: str, engine: sa.Engine, db_url: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from marketing_pipelines_tests.measurement.test_importer_echoes import _failed_run

    add_campaign(engine, "spring", utm_campaign="spring26")
    google = FakeGoogle(lambda body: ECHOES[shape](google))
    failure, surfaces = _failed_run(tmp_path, engine, db_url, capfd, GA4_KEY, DAY, ga4=mocked_ga4(Api(google)))
    assert "ga4" in failure and google.reports
    assert leaked(surfaces, KEY_BODY) == [] and leaked(surfaces, google.issued[0]) == []


def test_an_echo_of_the_assertion_by_the_token_endpoint_lands_in_no_error() -> None:
    def token(n: int) -> httpx.Response:
        return httpx.Response(400, json={"error": "invalid_grant", "error_description": f"bad JWT {seen[-1]}"})

    seen: list[str] = []
    google = FakeGoogle(lambda body: ga4_report([]), token=token)

    def answer(request: httpx.Request) -> httpx.Response:
        if str(request.url) == GOOGLE_TOKEN_URL:
            seen.append(parse_qs(request.content.decode())["assertion"][0])
        return google(request)

    api = Api(answer)
    with pytest.raises(ServiceError) as refused:
        mocked_ga4(api).daily_metrics(DAY, DAY, ["spring26"])
    assert "invalid_grant" in str(refused.value) and leaked(str(refused.value), seen[0]) == []


def test_the_definitions_hold_the_ga4_asset_only_when_it_is_configured(tmp_path: Path) -> None:
    from marketing_pipelines.measurement.assets import build_measurement_assets, left_out_importers
    from marketing_pipelines.measurement.defs import importer_resources

    unset = settings_from({})
    assert left_out_importers(unset)[GA4_KEY] == "set GA4_PROPERTY_ID and GA4_SERVICE_ACCOUNT_JSON"
    environ = {"GA4_PROPERTY_ID": GA4_PROPERTY, "GA4_SERVICE_ACCOUNT_JSON": key_json()}
    settings = settings_from(environ)
    assert GA4_KEY not in left_out_importers(settings)
    assert GA4_KEY in {a.key for a in build_measurement_assets(settings, left_out=left_out_importers(settings))}
    client = importer_resources(settings, environ=environ)["ga4"]
    # The key and the property go into the definitions (and the UI) by their variables' names only.
    assert client.service_account_json == dg.EnvVar("GA4_SERVICE_ACCOUNT_JSON")
    assert client.property_id == dg.EnvVar("GA4_PROPERTY_ID")
    assert client.api_url == "https://analyticsdata.googleapis.com"


def test_the_daily_schedule_reads_ga4s_last_two_days_again() -> None:
    from marketing_pipelines.measurement.schedules import build_measurement_daily_schedule

    schedule = build_measurement_daily_schedule(settings_from({}), [GA4])
    context = dg.build_schedule_context(scheduled_execution_time=dt.datetime(2026, 11, 27, 0, 15, tzinfo=dt.UTC))
    requests = schedule(context)
    assert [(r.partition_key, r.asset_selection) for r in requests] == [  # type: ignore[union-attr]
        ("2026-11-26", None),
        # GA4 alone; the rollup follows by declarative automation (measurement_automation_sensor).
        ("2026-11-25", [GA4_KEY]),
        ("2026-11-24", [GA4_KEY]),
    ]
