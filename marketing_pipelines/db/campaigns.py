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


@dataclass(frozen=True)
class Campaign:
    id: str
    name: str
    owner: str
    utm_campaign: str | None = None
    github_repo: str | None = None


def validate_campaign(c: Campaign) -> None:
    if not CAMPAIGN_ID_RE.fullmatch(c.id):
        raise InvalidInput(f"campaign id {c.id!r} must be 1-64 lowercase letters, digits, '-' or '_'")
    if not c.name.strip():
        raise InvalidInput("campaign name must not be empty")
    if not c.owner.strip():
        raise InvalidInput("campaign owner must not be empty")
    if c.github_repo is not None and not GITHUB_REPO_RE.fullmatch(c.github_repo):
        raise InvalidInput(f"github repo {c.github_repo!r} must look like owner/name")


def add_campaign(conn: sa.Connection, c: Campaign) -> None:
    validate_campaign(c)
    if get_campaign(conn, c.id) is not None:
        raise InvalidInput(f"campaign {c.id!r} already exists")
    now = datetime.now(UTC)
    conn.execute(sa.insert(campaign).values(**c.__dict__, created_at=now, updated_at=now))


def upsert_campaign(conn: sa.Connection, c: Campaign) -> None:
    """Insert or update; used by seeding so it can run any number of times."""
    validate_campaign(c)
    now = datetime.now(UTC)
    updated = conn.execute(
        sa.update(campaign)
        .where(campaign.c.id == c.id)
        .values(name=c.name, owner=c.owner, utm_campaign=c.utm_campaign, github_repo=c.github_repo, updated_at=now)
    ).rowcount
    if not updated:
        conn.execute(sa.insert(campaign).values(**c.__dict__, created_at=now, updated_at=now))


def get_campaign(conn: sa.Connection, campaign_id: str) -> Campaign | None:
    row = conn.execute(
        sa.select(
            campaign.c.id, campaign.c.name, campaign.c.owner, campaign.c.utm_campaign, campaign.c.github_repo
        ).where(campaign.c.id == campaign_id)
    ).one_or_none()
    return Campaign(**row._mapping) if row else None


def require_campaign(conn: sa.Connection, campaign_id: str) -> Campaign:
    found = get_campaign(conn, campaign_id)
    if found is None:
        raise InvalidInput(f"unknown campaign {campaign_id!r}; add it with `marketing-pipelines campaigns add`")
    return found


def list_campaigns(conn: sa.Connection) -> list[Campaign]:
    rows = conn.execute(
        sa.select(
            campaign.c.id, campaign.c.name, campaign.c.owner, campaign.c.utm_campaign, campaign.c.github_repo
        ).order_by(campaign.c.id)
    )
    return [Campaign(**row._mapping) for row in rows]
