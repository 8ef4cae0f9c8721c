"""Redaction's shortcut (text holding no hint of a secret is returned unscanned) changes no result.

``redact_text`` and ``is_secret_name`` skip their regular-expression scans for ASCII text without
any of a few substrings; the scans alone must give the same answer for every text, hostile
spellings included. Texts are built from the pieces the scans look for, in random case and order.
"""

import random

import pytest

from marketing_pipelines.redact import (
    _names_a_secret,
    _redact_text_scanned,
    is_secret_name,
    redact_text,
    redact_value,
    secret_parts,
)

PIECES = [
    *("token", "Tokens", "tokens_used", "max_tokens", "secret", "passwd", "password", "pasword", "authorization"),
    *("Authorisation", "signature", "cookie", "credential", "api_key", "ApiKey", "apikey", "X-Api-Key", "key"),
    *("Key", "keys", "monkey", "access-key", "signingKey", "bearer", "Bearer ", "Basic ", "https://", "h://x"),
    *("://", "http://u:p@host/p?q=1", "b'", 'b"', "b\\'", "'", '"', ":", "=", ": ", " = ", " ", "\n", "\t", "/"),
    *("?", "&", ",", "{", "}", "x", "-", "_", "AbC12345678", "value", "0123456789abcdef0123"),
    # Letters a case-insensitive regular expression matches as ASCII ones ("\u017f" as s, "\u212a" as k).
    *("\u017fecret", "\u212aey", "to\u212aen", "cooki\u0131", "\u0130", "\u00e9", "\u200e", "\x00", "\u202e"),
]


def texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)

    def piece() -> str:
        p = rng.choice(PIECES)
        return p.upper() if rng.random() < 0.15 else p

    return ["".join(piece() for _ in range(rng.randint(1, 10))) for _ in range(count)]


@pytest.mark.parametrize("seed", range(4))
def test_redact_text_gives_what_the_full_scans_give(seed: int) -> None:
    for text in texts(5000, seed):
        assert redact_text(text) == _redact_text_scanned(text), repr(text)


@pytest.mark.parametrize("seed", range(4))
def test_is_secret_name_gives_what_the_full_scans_give(seed: int) -> None:
    for name in texts(5000, seed):
        assert is_secret_name(name) == _names_a_secret(name), repr(name)


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("message=spring launch payload={'message': 'hi'}", "message=spring launch payload={'message': 'hi'}"),
        ("\u017fecret=hunter22", "\u017fecret=***"),
        ("X-API-KEY: abc123", "X-API-KEY: ***"),
        ("see https://hooks.example/T0/B0/tok", "see https://hooks.example/***"),
    ],
)
def test_the_shortcut_keeps_plain_text_and_still_hides_secrets(text: str, shown: str) -> None:
    assert redact_text(text) == shown


def test_a_payload_without_a_url_or_a_secret_name_is_shown_as_it_is() -> None:
    payload = {"message": "spring launch", "count": 3, "nested": {"words": ["a", "b"]}}
    assert redact_value(payload) == payload
    assert secret_parts(payload) == set()
    assert secret_parts({"message": "see https://u:longpassword@host/path"}) >= {"u:longpassword", "longpassword"}
