"""Secrets at rest: values sealed with Fernet (``cryptography``) under the operator's key.

A webhook endpoint's signing secrets and its URL (whose path is often itself a token: Slack's
``/services/...``) are stored sealed, so a dump of the database alone reveals none of them. The key
is ``MARKETING_SECRETS_KEY``: one or more comma-separated Fernet keys. The first seals; every key
opens, so an operator rotates by putting a new key first, running ``webhooks reseal``, then dropping
the old one. Nothing here reads the environment: ``settings`` finds the key text.
"""

from __future__ import annotations

from cryptography.fernet import Fernet, InvalidToken, MultiFernet

KEY_SETTING = "MARKETING_SECRETS_KEY"


class SealingError(ValueError):
    """No key, a malformed key, or a sealed value no key opens; the message names the setting, never a key."""


def new_key() -> str:
    """A fresh Fernet key (url-safe base64 of 32 random bytes)."""
    return Fernet.generate_key().decode("ascii")


class SecretBox:
    """Seals and opens short strings with the keys of ``MARKETING_SECRETS_KEY``."""

    def __init__(self, keys_text: str | None) -> None:
        keys = [k.strip() for k in (keys_text or "").split(",") if k.strip()]
        if not keys:
            raise SealingError(
                f"{KEY_SETTING} is not set: webhook endpoints are stored encrypted; "
                "create a key with `marketing-pipelines webhooks new-key` and export it"
            )
        fernets = []
        for position, key in enumerate(keys, start=1):
            try:
                fernets.append(Fernet(key))
            except (ValueError, TypeError):
                # Never echo the key: it is the secret.
                raise SealingError(
                    f"{KEY_SETTING} key {position} of {len(keys)} is not a Fernet key (url-safe base64 of 32 bytes)"
                ) from None
        self._fernet = MultiFernet(fernets)

    def seal(self, value: str) -> str:
        return self._fernet.encrypt(value.encode("utf-8")).decode("ascii")

    def open(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise SealingError(
                f"a stored secret opens with none of the keys in {KEY_SETTING} (was the sealing key removed?)"
            ) from None

    def reseal(self, token: str) -> str:
        """``token`` sealed again under the first key (MultiFernet.rotate keeps its timestamp)."""
        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except InvalidToken:
            raise SealingError(f"a stored secret opens with none of the keys in {KEY_SETTING}") from None
