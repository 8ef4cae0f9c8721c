"""The application database as a Dagster resource."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.engine import get_engine
from marketing_pipelines.db.migrate import ensure_schema_current
from marketing_pipelines.settings import Settings


class AppDatabase(dg.ConfigurableResource):
    """Connection to the application database.

    ``url`` is left empty in ``Definitions`` on purpose: it is then resolved from
    MARKETING_DATABASE_URL (or the embedded SQLite default) inside the process that uses it,
    so a URL with a password never appears in the run config shown in the UI.
    """

    url: str | None = None

    def resolved_url(self) -> str:
        return self.url or Settings.from_env().resolved_database_url

    def engine(self) -> sa.Engine:
        return get_engine(self.resolved_url())

    def ready_engine(self) -> sa.Engine:
        """The engine, after checking the schema is current (raises SchemaNotReady otherwise)."""
        engine = self.engine()
        ensure_schema_current(engine)
        return engine
