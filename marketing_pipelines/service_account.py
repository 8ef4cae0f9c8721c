"""A Google service-account key read and checked, and the signed JWT assertion it is exchanged for a token with.

The key is the JSON file the Cloud console downloads (IAM > Service accounts > Keys > Add key > JSON): ``type``
``service_account``, ``client_email``, ``private_key`` (a PEM RSA key), ``private_key_id`` and ``token_uri``. A
setting holding one (``GA4_SERVICE_ACCOUNT_JSON``) may hold the key's JSON text or the path of its file: a value
whose first non-blank character is ``{`` (or ``[``) is JSON text, anything else is a path.
The text suits a secret store that hands out values (the Docker stack's secret files become variables, the
Helm chart's Secrets), the path a file mounted beside the code.

The assertion is the OAuth 2.0 service-account flow's (RFC 7523; Google's "Using OAuth 2.0 for Server to Server
Applications", developers.google.com/identity/protocols/oauth2/service-account): a JWT signed RS256 with the key's
private key, ``iss`` its client_email, ``scope`` the scopes asked for, ``aud`` the token endpoint, ``iat`` now
and ``exp`` at most an hour on. The token endpoint's exchange (HTTP) is the importer's.

No message here quotes the key: not the private key, not the file's text, not a JSON parser's excerpt of it. The
settings' one-line error shows the variable's name and the problem only.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path

GOOGLE_TOKEN_URL = "https://oauth2.googleapis.com/token"
KEY_TYPE = "service_account"
# Other kinds of Google credential file, named when one is given instead of a service account's key.
_OTHER_TYPES = frozenset(
    {"authorized_user", "external_account", "external_account_authorized_user", "impersonated_service_account"}
)
# A service-account key is about 2.4 KB; anything much larger is some other file.
MAX_KEY_BYTES = 64 * 1024
# Google refuses an assertion that lives longer than an hour ("Token must be a short-lived token (60 minutes)").
MAX_ASSERTION_LIFETIME_S = 3600
_PEM_BEGIN, _PEM_END = "-----BEGIN ", "-----END "


class ServiceAccountKeyError(ValueError):
    """The value is not a usable service-account key; the message says why and never quotes the key."""


@dataclass(frozen=True)
class ServiceAccountKey:
    """The parts of a service-account key the token exchange uses; the private key is never shown by repr."""

    client_email: str
    private_key: str = field(repr=False)
    private_key_id: str = field(repr=False)
    # The key's token_uri, or Google's when it names none. Whether an assertion may go there is the caller's call.
    token_uri: str


def key_text(value: str) -> str:
    """The key's JSON text: ``value`` itself when it starts with ``{`` (or ``[``: JSON, if no key), else the file it
    names (at most MAX_KEY_BYTES, UTF-8)."""
    stripped = value.strip()
    if not stripped:
        raise ServiceAccountKeyError("is empty")
    if stripped.startswith(("{", "[")):
        return stripped
    try:
        path = Path(stripped).expanduser()
        with path.open("rb") as file:
            data = file.read(MAX_KEY_BYTES + 1)
    except OSError as exc:
        # strerror only: the path is the setting's value, and some of the message's forms quote it.
        reason = exc.strerror or type(exc).__name__
        raise ServiceAccountKeyError(
            f"is neither a service-account key's JSON text nor the path of a readable file ({reason})"
        ) from None
    except ValueError:  # a NUL in the path
        raise ServiceAccountKeyError("is neither a service-account key's JSON text nor a file path") from None
    if len(data) > MAX_KEY_BYTES:
        raise ServiceAccountKeyError(f"names a file larger than {MAX_KEY_BYTES // 1024} KiB: not a service-account key")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ServiceAccountKeyError("names a file that is not UTF-8 text: not a service-account key") from None


def read_service_account_key(value: str) -> ServiceAccountKey:
    """The service-account key ``value`` holds (its JSON text or its file's path), checked: a JSON object of type
    ``service_account`` with a client_email and a PEM RSA private key. Raises ServiceAccountKeyError."""
    text = key_text(value)
    if len(text.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise ServiceAccountKeyError(f"is larger than {MAX_KEY_BYTES // 1024} KiB: not a service-account key")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        # Its position only: the exception's own message is safe, but its .doc is the key.
        raise ServiceAccountKeyError(
            f"is not JSON (line {exc.lineno}, column {exc.colno}): not a service-account key"
        ) from None
    except (ValueError, RecursionError):
        raise ServiceAccountKeyError("is not JSON: not a service-account key") from None
    if not isinstance(payload, dict):
        raise ServiceAccountKeyError("is JSON but not an object: not a service-account key")
    kind = payload.get("type")
    if kind != KEY_TYPE:
        named = f'of type "{kind}"' if kind in _OTHER_TYPES else 'without type "service_account"'
        raise ServiceAccountKeyError(
            f"is a JSON file {named}, not a service-account key: create a JSON key for a service account "
            "(Cloud console, IAM > Service accounts > Keys)"
        )
    client_email = payload.get("client_email")
    if not isinstance(client_email, str) or "@" not in client_email or not client_email.isprintable():
        raise ServiceAccountKeyError('is a service-account key without a "client_email"')
    private_key = payload.get("private_key")
    if not isinstance(private_key, str) or _PEM_BEGIN not in private_key or _PEM_END not in private_key:
        raise ServiceAccountKeyError('is a service-account key without a PEM "private_key"')
    private_key_id = payload.get("private_key_id", "")
    token_uri = payload.get("token_uri", GOOGLE_TOKEN_URL)
    if not isinstance(private_key_id, str) or not isinstance(token_uri, str):
        raise ServiceAccountKeyError('is a service-account key whose "private_key_id" or "token_uri" is not text')
    key = ServiceAccountKey(client_email, private_key, private_key_id, token_uri)
    _rsa_private_key(key)  # refused here, at the setting's load, not at the first import
    return key


def key_secrets(value: str) -> tuple[str, ...]:
    """What of the key ``value`` holds is secret, for ``redact.remember_secrets``: the private key's base64 body on
    one line (an echo over several lines or re-encoded is still found) and its id. Not the whole JSON text: its
    public parts (the token endpoint's URL, the key's field names) recur in ordinary text. Nothing for a value
    that is no key (its load is refused anyway)."""
    try:
        key = read_service_account_key(value)
    except ServiceAccountKeyError:
        return ()
    return secrets_of(key)


def secrets_of(key: ServiceAccountKey) -> tuple[str, ...]:
    """The key's private key body on one line and its id (``key_secrets``)."""
    body = "".join(line.strip() for line in key.private_key.splitlines() if not line.startswith("-----"))
    return tuple(secret for secret in (body, key.private_key_id) if secret)


def _rsa_private_key(key: ServiceAccountKey):  # type: ignore[no-untyped-def]  # cryptography's type, imported here
    # cryptography is imported where a key is used: every command imports settings, which check the key.
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    try:
        loaded = serialization.load_pem_private_key(key.private_key.encode("utf-8"), password=None)
    except (ValueError, TypeError, UnicodeEncodeError):
        # cryptography's messages do not quote the key, but say nothing a reader can act on either.
        raise ServiceAccountKeyError(
            'is a service-account key whose "private_key" is not an unencrypted PEM private key'
        ) from None
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise ServiceAccountKeyError('is a service-account key whose "private_key" is not an RSA key (RS256 signs)')
    return loaded


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def signed_assertion(
    key: ServiceAccountKey, *, scope: str, audience: str, issued_at: int, lifetime_s: int = MAX_ASSERTION_LIFETIME_S
) -> str:
    """The JWT (RS256) the token endpoint ``audience`` exchanges for an access token of ``scope``: ``iss`` the
    key's client_email, ``iat`` ``issued_at`` (epoch seconds), ``exp`` ``lifetime_s`` later (at most an hour)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import padding

    if not 0 < lifetime_s <= MAX_ASSERTION_LIFETIME_S:
        raise ValueError(f"an assertion lives 1 to {MAX_ASSERTION_LIFETIME_S} s, not {lifetime_s}")
    header = {"alg": "RS256", "typ": "JWT", **({"kid": key.private_key_id} if key.private_key_id else {})}
    claims = {
        "iss": key.client_email,
        "scope": scope,
        "aud": audience,
        "iat": issued_at,
        "exp": issued_at + lifetime_s,
    }
    signing_input = ".".join(
        _b64url(json.dumps(part, separators=(",", ":")).encode("utf-8")) for part in (header, claims)
    )
    signature = _rsa_private_key(key).sign(signing_input.encode("ascii"), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"
