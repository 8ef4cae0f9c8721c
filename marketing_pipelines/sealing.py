"""Secrets at rest: values sealed with Fernet (``cryptography``) under the operator's key.

A webhook endpoint's signing secrets and its URL (whose path is often itself a token: Slack's
``/services/...``) are stored sealed, and so are the header values of a webhook execution's payload
(``Authorization: Bearer ...``; ``actions.seal_headers``), so a dump of the database alone reveals none
of them. The key is ``MARKETING_SECRETS_KEY``: one or more comma-separated Fernet keys. The first
seals; every key opens, so an operator rotates by putting a new key first, running ``webhooks reseal``
and ``executions reseal``, then dropping the old one. Nothing here reads the environment: ``settings``
finds the key text.

A SQLite database may instead keep its key in ``secrets.key`` beside it (the demo makes it). A database
has one key source: when the variable is set and that file holds other keys, the CLI would seal with
one and the local UI's daemon open with the other, so ``key_source`` refuses the pair in one line.
Every error names the source a process actually read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

KEY_SETTING = "MARKETING_SECRETS_KEY"


class SealingError(ValueError):
    """No key, a malformed key, or a sealed value no key opens; the message names the setting, never a key."""


# cryptography is imported where a key is used: settings import this module for key_source, and every
# command imports settings, while only the webhook commands and sending runs seal or open (34 ms saved).


def new_key() -> str:
    """A fresh Fernet key (url-safe base64 of 32 random bytes)."""
    from cryptography.fernet import Fernet

    return Fernet.generate_key().decode("ascii")


def read_key_file(path: str | Path) -> str | None:
    """The key text a key file holds (surrounding white space stripped), or None when there is no such file."""
    path = Path(path)
    return (path.read_text(encoding="ascii").strip() or None) if path.is_file() else None


@dataclass(frozen=True)
class KeySource:
    """The keys a process seals and opens with (None: none), and where it read them, as errors name it."""

    text: str | None
    source: str
    # Where a process looked and found nothing, when text is None.
    missing: str = f"{KEY_SETTING} is not set"


def key_source(variable: str | None, key_file: str | Path | None) -> KeySource:
    """``MARKETING_SECRETS_KEY`` when set, else the SQLite database's key file; refuses the two disagreeing.

    Raises SealingError when both hold keys and they differ: whichever a process read, another process
    of the same database (the local UI's daemon, started without the variable) would read the other.
    """
    from_file = read_key_file(key_file) if key_file is not None else None
    variable = (variable or "").strip() or None
    if variable is not None and from_file is not None and variable != from_file:
        raise SealingError(
            f"{KEY_SETTING} is set and differs from {key_file}, the key file this SQLite database's other processes "
            f"(the demo, `marketing-pipelines ui`) read: keep one source; unset {KEY_SETTING}, or write its keys into "
            "that file for every process"
        )
    if variable is not None:
        return KeySource(variable, KEY_SETTING)
    if from_file is not None:
        return KeySource(from_file, f"the key file {key_file}")
    nowhere = f"{KEY_SETTING} is not set" + (f" and there is no {key_file}" if key_file else "")
    return KeySource(None, KEY_SETTING, nowhere)


class SecretBox:
    """Seals and opens short strings with the keys of ``MARKETING_SECRETS_KEY`` (or a SQLite database's key file)."""

    def __init__(self, keys_text: str | None, source: str = KEY_SETTING, missing: str | None = None) -> None:
        from cryptography.fernet import Fernet, MultiFernet

        keys = [k.strip() for k in (keys_text or "").split(",") if k.strip()]
        self.source = source
        if not keys:
            raise SealingError(
                f"{missing or source + ' is not set'}: webhook endpoints and header values are stored encrypted; "
                "create a key with `marketing-pipelines webhooks new-key` and export it"
            )
        fernets = []
        for position, key in enumerate(keys, start=1):
            try:
                fernets.append(Fernet(key))
            except (ValueError, TypeError):
                # Never echo the key: it is the secret.
                raise SealingError(
                    f"{source}: key {position} of {len(keys)} is not a Fernet key (url-safe base64 of 32 bytes)"
                ) from None
        self._fernet = MultiFernet(fernets)

    @classmethod
    def of(cls, keys: KeySource) -> SecretBox:
        return cls(keys.text, keys.source, keys.missing)

    def seal(self, value: str) -> str:
        return self._fernet.encrypt(value.encode("utf-8")).decode("ascii")

    def open(self, token: str) -> str:
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except InvalidToken:
            raise SealingError(
                f"a stored secret opens with none of the keys from {self.source} (sealed with another key, or the "
                "sealing key was removed)"
            ) from None

    def reseal(self, token: str) -> str:
        """``token`` sealed again under the first key (MultiFernet.rotate keeps its timestamp)."""
        from cryptography.fernet import InvalidToken

        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except InvalidToken:
            raise SealingError(f"a stored secret opens with none of the keys from {self.source}") from None
