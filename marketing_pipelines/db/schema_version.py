"""The schema check every command and resource runs before using the application database.

Kept apart from ``migrate`` (Alembic) because it runs on every CLI command: a current schema costs
one ``SELECT`` of ``alembic_version`` and a read of the migration files' ``revision`` lines, not an
import of Alembic and a parse of every migration (a third of a command's time). Alembic is imported
only when the schema is not current, to say why. ``test_migrations`` holds ``code_head_revision``
equal to Alembic's head.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import sqlalchemy as sa

from marketing_pipelines.db.engine import check_connection

VERSIONS_DIR = Path(__file__).parent / "migrations" / "versions"
_REVISION = re.compile(r"""^revision\s*(?::\s*str\s*)?=\s*["']([^"']+)["']\s*$""", re.MULTILINE)
_DOWN_REVISION = re.compile(r"""^down_revision\s*(?::[^=]*)?=\s*(?:None|["']([^"']+)["'])\s*$""", re.MULTILINE)

# URLs whose schema was found current in this process; a schema never moves backwards under a
# running process, so sensors ticking every few seconds need not ask the database each time.
_VERIFIED: set[str] = set()


class SchemaNotReady(RuntimeError):
    """The application database has no schema, or an older one than this code needs."""


@functools.cache
def code_head_revision() -> str | None:
    """The newest revision of the packaged migrations, from their ``revision``/``down_revision`` lines.

    None when the history is not one plain chain (a merge, a revision computed in code): then
    Alembic, which the caller falls back to, decides.
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in VERSIONS_DIR.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        revision, down = _REVISION.search(text), _DOWN_REVISION.search(text)
        if revision is None or down is None:
            return None
        revisions.add(revision.group(1))
        if down.group(1):
            parents.add(down.group(1))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def recorded_revisions(engine: sa.Engine) -> list[str]:
    """The revisions in the database's ``alembic_version`` table; empty when it has none."""
    with engine.connect() as conn:
        if not sa.inspect(conn).has_table("alembic_version"):
            return []
        return list(conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars())


def ensure_schema_current(engine: sa.Engine) -> None:
    """Raise SchemaNotReady, naming the fix, unless the database is at the code's head revision."""
    key = engine.url.render_as_string(hide_password=False)
    if key in _VERIFIED:
        return
    check_connection(engine)
    head = code_head_revision()
    if head is not None and recorded_revisions(engine) == [head]:
        _VERIFIED.add(key)
        return
    # Deferred: Alembic (0.1-0.4 s to import) is needed only to tell an empty, older or newer schema apart.
    from marketing_pipelines.db.migrate import schema_problem

    problem = schema_problem(engine)
    if problem is not None:
        raise SchemaNotReady(problem)
    _VERIFIED.add(key)
