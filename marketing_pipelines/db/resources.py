"""The application database as a Dagster resource."""

from __future__ import annotations

import dagster as dg
import sqlalchemy as sa

from marketing_pipelines.db.engine import DatabaseUnavailable, get_engine
from marketing_pipelines.db.schema_version import SchemaNotReady, ensure_schema_current
from marketing_pipelines.settings import default_database_url, setting_field, shown_in_ui


@shown_in_ui
class AppDatabase(dg.ConfigurableResource):
    """Connection to the application database.

    In ``Definitions`` ``url`` is ``dg.EnvVar("MARKETING_DATABASE_URL")`` when that is set (only the
    variable's name shows in the UI, never a password) and empty otherwise: the embedded SQLite
    default under ``.marketing/`` of the working directory.
    """

    url: str | None = setting_field("database_url")

    def engine(self) -> sa.Engine:
        return get_engine(self.url or default_database_url())

    def ready_engine_or_skip(self) -> sa.Engine | dg.SkipReason:
        """The ready engine for a sensor, or the one-line reason its tick skips (not migrated, unreachable)."""
        try:
            return self.ready_engine()
        except (SchemaNotReady, DatabaseUnavailable) as exc:
            return dg.SkipReason(str(exc))

    def ready_engine(self) -> sa.Engine:
        """The engine, after checking the schema is current (raises SchemaNotReady otherwise)."""
        engine = self.engine()
        ensure_schema_current(engine)
        return engine
