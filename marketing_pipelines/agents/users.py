"""Users and their permissions, optionally scoped to one campaign.

A grant is (user, permission, scope) where scope is a campaign id or ``*`` for all campaigns.
Agent runs capture the requester's grants on the run's campaign only (``grants_on_campaign``): a
model steered by text in one campaign's data must not reach another campaign its requester may
touch. Each tool call is then allowed only if the grant is in that captured set *and* the user
still holds it now (see ``authorize``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from marketing_pipelines.db.campaigns import require_campaign
from marketing_pipelines.db.schema import ALL_CAMPAIGNS, app_user, user_permission
from marketing_pipelines.errors import InvalidInput

PERMISSIONS = ("campaign:read", "measurement:read", "execution:read", "execution:write")
# Checked with fullmatch: "$" would also match before a trailing newline ("ana\n").
USER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")


@dataclass(frozen=True, order=True)
class Grant:
    permission: str
    scope: str = ALL_CAMPAIGNS

    def covers(self, permission: str, campaign_id: str) -> bool:
        return self.permission == permission and self.scope in (ALL_CAMPAIGNS, campaign_id)

    def to_json(self) -> list[str]:
        return [self.permission, self.scope]

    @classmethod
    def from_json(cls, value: list[str]) -> Grant:
        return cls(value[0], value[1])


@dataclass(frozen=True)
class User:
    id: str
    display_name: str
    active: bool


def add_user(conn: sa.Connection, user_id: str, display_name: str | None = None) -> None:
    if not USER_ID_RE.fullmatch(user_id):
        raise InvalidInput(f"user id {user_id!r} must be 1-64 letters, digits, '.', '_', '@' or '-'")
    if get_user(conn, user_id) is not None:
        raise InvalidInput(f"user {user_id!r} already exists")
    conn.execute(
        sa.insert(app_user).values(
            id=user_id, display_name=display_name or user_id, active=True, created_at=datetime.now(UTC)
        )
    )


def get_user(conn: sa.Connection, user_id: str) -> User | None:
    row = conn.execute(
        sa.select(app_user.c.id, app_user.c.display_name, app_user.c.active).where(app_user.c.id == user_id)
    ).one_or_none()
    return User(row.id, row.display_name, bool(row.active)) if row else None


def require_user(conn: sa.Connection, user_id: str) -> User:
    user = get_user(conn, user_id)
    if user is None:
        raise InvalidInput(f"unknown user {user_id!r}; add it with `marketing-pipelines users add`")
    return user


def set_active(conn: sa.Connection, user_id: str, active: bool) -> None:
    require_user(conn, user_id)
    conn.execute(sa.update(app_user).where(app_user.c.id == user_id).values(active=active))


def _check_grant(conn: sa.Connection, permission: str, campaign_id: str | None) -> str:
    if permission not in PERMISSIONS:
        raise InvalidInput(f"unknown permission {permission!r}; known: {', '.join(PERMISSIONS)}")
    if campaign_id is None:
        return ALL_CAMPAIGNS
    require_campaign(conn, campaign_id)
    return campaign_id


def grant(conn: sa.Connection, user_id: str, permission: str, campaign_id: str | None = None) -> bool:
    """Grant a permission (on one campaign, or all); False when the user already had it."""
    require_user(conn, user_id)
    scope = _check_grant(conn, permission, campaign_id)
    exists = conn.execute(
        sa.select(user_permission.c.id).where(
            user_permission.c.user_id == user_id,
            user_permission.c.permission == permission,
            user_permission.c.campaign_scope == scope,
        )
    ).first()
    if exists:
        return False
    conn.execute(
        sa.insert(user_permission).values(
            user_id=user_id, permission=permission, campaign_scope=scope, granted_at=datetime.now(UTC)
        )
    )
    return True


def revoke(conn: sa.Connection, user_id: str, permission: str, campaign_id: str | None = None) -> bool:
    """Revoke a grant; False when there was nothing to revoke."""
    require_user(conn, user_id)
    scope = _check_grant(conn, permission, campaign_id)
    return (
        conn.execute(
            sa.delete(user_permission).where(
                user_permission.c.user_id == user_id,
                user_permission.c.permission == permission,
                user_permission.c.campaign_scope == scope,
            )
        ).rowcount
        > 0
    )


def current_grants(conn: sa.Connection, user_id: str) -> frozenset[Grant]:
    rows = conn.execute(
        sa.select(user_permission.c.permission, user_permission.c.campaign_scope).where(
            user_permission.c.user_id == user_id
        )
    )
    return frozenset(Grant(r.permission, r.campaign_scope) for r in rows)


def holds(grants: Iterable[Grant], permission: str, campaign_id: str) -> bool:
    return any(g.covers(permission, campaign_id) for g in grants)


def grants_on_campaign(grants: Iterable[Grant], campaign_id: str) -> list[Grant]:
    """The permissions ``grants`` give on ``campaign_id``, each scoped to that campaign alone.

    A global grant is narrowed to ``campaign_id``: what an agent run captures must not let it act
    on any other campaign, whatever its requester may do there.
    """
    return sorted({Grant(g.permission, campaign_id) for g in grants if g.scope in (ALL_CAMPAIGNS, campaign_id)})


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


def authorize(
    conn: sa.Connection, user_id: str, captured: Iterable[Grant], permission: str, campaign_id: str
) -> Decision:
    """May ``user_id`` use ``permission`` on ``campaign_id`` right now, within the captured set?"""
    user = get_user(conn, user_id)
    if user is None or not user.active:
        return Decision(False, f"user {user_id} is not active")
    if not holds(captured, permission, campaign_id):
        return Decision(False, f"{user_id} did not hold {permission} on {campaign_id} when the run was requested")
    if not holds(current_grants(conn, user_id), permission, campaign_id):
        return Decision(False, f"{user_id} no longer holds {permission} on {campaign_id} (revoked after the request)")
    return Decision(True, "allowed")
