"""Alembic migrations, applied programmatically (``marketing-pipelines db upgrade``).

Every command that needs the schema calls ``schema_version.ensure_schema_current`` first, so a missing
or outdated schema is one clear line that names the fix rather than a "no such table" trace; that
check asks Alembic (``schema_problem``) only when the schema is not current.
"""

from __future__ import annotations

from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from marketing_pipelines.db.engine import check_connection, create_sqlite_folder, sqlite_path

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations found"
    return head


def current_revision(engine: sa.Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: sa.Engine, revision: str = "head") -> None:
    """Migrate to ``revision``; the one operation that creates a SQLite database (and its folder)."""
    if sqlite_path(engine) is not None:
        create_sqlite_folder(engine)
        engine.connect().close()  # connecting creates the file
    check_connection(engine)
    config = alembic_config()
    with engine.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def schema_problem(engine: sa.Engine) -> str | None:
    """Why the schema is not the code's head (empty, behind, or newer than this code), or None when it is."""
    current, head = current_revision(engine), head_revision()
    if current == head:
        return None
    where = engine.url.render_as_string(hide_password=True)
    if current is None:
        return f"the database at {where} has no schema yet: run `marketing-pipelines db upgrade`"
    known = {rev.revision for rev in ScriptDirectory.from_config(alembic_config()).walk_revisions()}
    if current not in known:
        return (
            f"the database at {where} is at revision {current}, newer than this code knows (head {head}): "
            "upgrade marketing-pipelines"
        )
    return f"the database at {where} is at revision {current}, behind {head}: run `marketing-pipelines db upgrade`"
