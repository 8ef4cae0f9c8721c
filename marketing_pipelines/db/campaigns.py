"""Campaigns: the one entity every domain refers to (executions, agent runs, measurement)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from marketing_pipelines.db.schema import campaign
from marketing_pipelines.errors import InvalidInput

# Checked with fullmatch: "$" would also match before a trailing newline ("camp-a\n").
CAMPAIGN_ID_RE = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
GITHUB_REPO_RE = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
# PyPI: a project name as PEP 508 allows it. npm: a package name as the registry accepts a new one (lowercase,
# URL-safe, optionally @scope/), at most 214 characters.
PYPI_PACKAGE_RE = re.compile(r"[A-Za-z0-9]|[A-Za-z0-9][A-Za-z0-9._-]{0,212}[A-Za-z0-9]")
NPM_PACKAGE_RE = re.compile(r"(@[a-z0-9~-][a-z0-9._~-]*/)?[a-z0-9~-][a-z0-9._~-]*")
MAX_NPM_PACKAGE = 214


@dataclass(frozen=True)
class Campaign:
    id: str
    name: str
    owner: str
    utm_campaign: str | None = None
    github_repo: str | None = None
    pypi_package: str | None = None
    npm_package: str | None = None


_COLUMNS = [campaign.c[name] for name in Campaign.__dataclass_fields__]


def validate_campaign(c: Campaign) -> None:
    if not CAMPAIGN_ID_RE.fullmatch(c.id):
        raise InvalidInput(f"campaign id {c.id!r} must be 1-64 lowercase letters, digits, '-' or '_'")
    if not c.name.strip():
        raise InvalidInput("campaign name must not be empty")
    if not c.owner.strip():
        raise InvalidInput("campaign owner must not be empty")
    if c.github_repo is not None and not GITHUB_REPO_RE.fullmatch(c.github_repo):
        raise InvalidInput(f"github repo {c.github_repo!r} must look like owner/name")
    if c.pypi_package is not None and not PYPI_PACKAGE_RE.fullmatch(c.pypi_package):
        raise InvalidInput(f"pypi package {c.pypi_package[:220]!r} is not a PyPI project name (letters, digits, . _ -)")
    if c.npm_package is not None and not (
        len(c.npm_package) <= MAX_NPM_PACKAGE and NPM_PACKAGE_RE.fullmatch(c.npm_package)
    ):
        raise InvalidInput(
            f"npm package {c.npm_package[:220]!r} is not an npm package name (lowercase, optionally @scope/name)"
        )


def add_campaign(conn: sa.Connection, c: Campaign) -> None:
    validate_campaign(c)
    if get_campaign(conn, c.id) is not None:
        raise InvalidInput(f"campaign {c.id!r} already exists")
    now = datetime.now(UTC)
    conn.execute(sa.insert(campaign).values(**_given(c), created_at=now, updated_at=now))


def _given(c: Campaign) -> dict[str, str | None]:
    """The campaign's columns to write: the package mappings only when set, so a seed that names none leaves
    them as they are (and writes to a database of any schema revision since campaigns had mappings)."""
    return {k: v for k, v in c.__dict__.items() if v is not None or k not in ("pypi_package", "npm_package")}


def upsert_campaign(conn: sa.Connection, c: Campaign) -> None:
    """Insert or update; used by seeding so it can run any number of times."""
    validate_campaign(c)
    now = datetime.now(UTC)
    updated = conn.execute(
        sa.update(campaign)
        .where(campaign.c.id == c.id)
        .values(**{k: v for k, v in _given(c).items() if k != "id"}, updated_at=now)
    ).rowcount
    if not updated:
        conn.execute(sa.insert(campaign).values(**_given(c), created_at=now, updated_at=now))


def get_campaign(conn: sa.Connection, campaign_id: str) -> Campaign | None:
    row = conn.execute(sa.select(*_COLUMNS).where(campaign.c.id == campaign_id)).one_or_none()
    return Campaign(**row._mapping) if row else None


def require_campaign(conn: sa.Connection, campaign_id: str) -> Campaign:
    found = get_campaign(conn, campaign_id)
    if found is None:
        raise InvalidInput(f"unknown campaign {campaign_id!r}; add it with `marketing-pipelines campaigns add`")
    return found


def list_campaigns(conn: sa.Connection) -> list[Campaign]:
    rows = conn.execute(sa.select(*_COLUMNS).order_by(campaign.c.id))
    return [Campaign(**row._mapping) for row in rows]
