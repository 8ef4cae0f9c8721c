"""The measurement sources beside first-party events, and the variables that turn each on.

Read without importing the sources' HTTP clients (``importers/``, which import httpx), so
``marketing-pipelines status`` can say what is not configured at a command's start-up cost, and
the definitions can leave an unconfigured importer out. A source is configured when each of its
variables is set (non-empty) where the code location loads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

PLAUSIBLE_API_KEY_ENV = "PLAUSIBLE_API_KEY"
PLAUSIBLE_SITE_ID_ENV = "PLAUSIBLE_SITE_ID"
GITHUB_TOKEN_ENV = "GITHUB_TOKEN"


@dataclass(frozen=True)
class Source:
    name: str  # as the rollup's ``source`` column names it
    asset: str  # the importer's asset key
    env_vars: tuple[str, ...]


SOURCES = (
    Source("site_analytics", "site_analytics_daily", (PLAUSIBLE_API_KEY_ENV, PLAUSIBLE_SITE_ID_ENV)),
    Source("github_releases", "github_release_downloads_daily", (GITHUB_TOKEN_ENV,)),
)


def missing_variables(environ: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Each source that is not configured -> the variables still to set (``environ``: os.environ)."""
    environ = os.environ if environ is None else environ
    missing = {source.name: [name for name in source.env_vars if not environ.get(name)] for source in SOURCES}
    return {name: names for name, names in missing.items() if names}
