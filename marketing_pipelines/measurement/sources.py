"""The measurement sources beside first-party events, and the settings that turn each on.

Read without importing the sources' HTTP clients (``importers/``, which import httpx), so
``marketing-pipelines status`` can say what is not configured at a command's start-up cost, and
the definitions can leave an unconfigured importer out. A source is configured when each of its
settings is set (non-empty): the services' own variables, read through ``Settings``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import SecretStr

from marketing_pipelines.settings import Settings, env_name


@dataclass(frozen=True)
class Source:
    name: str  # as the rollup's ``source`` column names it
    asset: str  # the importer's asset key
    settings: tuple[str, ...]  # the Settings fields that turn it on


SOURCES = (
    Source("site_analytics", "site_analytics_daily", ("plausible_api_key", "plausible_site_id")),
    Source("github_releases", "github_release_downloads_daily", ("github_token",)),
)


def _is_set(value: object) -> bool:
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return isinstance(text, str) and bool(text.strip())


def missing_variables(settings: Settings) -> dict[str, list[str]]:
    """Each source that ``settings`` leaves unconfigured -> the variables still to set."""
    missing = {s.name: [env_name(f) for f in s.settings if not _is_set(getattr(settings, f))] for s in SOURCES}
    return {name: names for name, names in missing.items() if names}
