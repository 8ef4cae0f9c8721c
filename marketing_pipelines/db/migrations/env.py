"""Alembic environment: runs on the connection handed over by marketing_pipelines.db.migrate."""

from __future__ import annotations

from alembic import context

from marketing_pipelines.db.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `marketing-pipelines db upgrade`, which supplies the connection")

context.configure(
    connection=connection,
    target_metadata=metadata,
    # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
