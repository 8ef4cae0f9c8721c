"""Migrations create exactly the tables the code declares, on both databases."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from marketing_pipelines.db.migrate import current_revision, head_revision
from marketing_pipelines.db.schema import metadata


def test_migrated_schema_matches_the_models(engine: sa.Engine) -> None:
    assert current_revision(engine) == head_revision()
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), metadata)
    assert diff == []
