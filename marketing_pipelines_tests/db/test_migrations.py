"""Migrations create exactly the tables the code declares, on both databases."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import current_revision, head_revision
from marketing_pipelines.db.schema import metadata
from marketing_pipelines.db.schema_version import SchemaNotReady, code_head_revision, ensure_schema_current


def test_migrated_schema_matches_the_models(engine: sa.Engine) -> None:
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), metadata)
    assert diff == []


def test_the_cheap_head_is_alembics_head() -> None:
    # ensure_schema_current compares against code_head_revision without importing Alembic.
    assert code_head_revision() == head_revision()


@pytest.mark.parametrize(
    ("recorded", "message"),
    [
        # One revision behind: the fix is to upgrade the database.
        ("0001", "is at revision 0001, behind {head}: run `marketing-pipelines db upgrade`"),
        # A revision from newer code: the fix is to upgrade the package.
        ("9999", "is at revision 9999, newer than this code knows (head {head}): upgrade marketing-pipelines"),
    ],
)
def test_a_schema_not_at_head_is_refused_with_its_fix(sqlite_url: str, recorded: str, message: str) -> None:
    engine = get_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": recorded})
    with pytest.raises(SchemaNotReady, match=re.escape(message.format(head=head_revision()))):
        ensure_schema_current(engine)
