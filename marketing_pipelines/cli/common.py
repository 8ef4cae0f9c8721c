"""What the command groups share: one-line errors, settings and database access, table output, option types."""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import click
import sqlalchemy as sa

from marketing_pipelines.db.engine import DatabaseUnavailable, get_engine
from marketing_pipelines.db.schema_version import SchemaNotReady, ensure_schema_current
from marketing_pipelines.errors import InvalidInput
from marketing_pipelines.redact import visible_controls
from marketing_pipelines.sealing import SealingError
from marketing_pipelines.settings import Settings, SettingsError, load_settings

KNOWN_ERRORS: tuple[type[Exception], ...] = (
    InvalidInput,
    SchemaNotReady,
    DatabaseUnavailable,
    SettingsError,
    SealingError,
)


class FriendlyGroup(click.Group):
    """Turns the project's known errors into one clear ``Error: ...`` line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except KNOWN_ERRORS as exc:
            raise click.ClickException(visible_controls(str(exc))) from None
        except Exception as exc:
            if is_service_error(exc):  # its message may quote a receiver's answer
                raise click.ClickException(visible_controls(str(exc))) from None
            if (refused := permission_refused(exc)) is not None:
                raise click.ClickException(visible_controls(refused)) from None
            raise


class LazyGroup(FriendlyGroup):
    """A group whose commands are imported when one is invoked or help lists them, not when the CLI starts.

    ``lazy_commands`` maps each command's name to ``"module:attribute"``: ``executions list`` then loads
    the executions module alone, not every group and what each of them imports.
    """

    def __init__(self, *args: Any, lazy_commands: Mapping[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands and cmd_name not in self.commands:
            module, attribute = self.lazy_commands[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)


def is_service_error(exc: Exception) -> bool:
    """Whether ``exc`` is an ``http.ServiceError``, without importing ``http`` (and httpx, 0.2 s) to ask.

    Only commands that call an outside service load ``http``; if it is not loaded, nothing raised one.
    """
    http = sys.modules.get("marketing_pipelines.http")
    return http is not None and isinstance(exc, http.ServiceError)


def permission_refused(exc: Exception) -> str | None:
    """One line for a statement PostgreSQL refused for lack of a privilege (SQLSTATE 42501), else None.

    Deployed, the CLI connects as the application role, which reads and writes rows only
    (deploy/provision.sh); a command that needs more is a setup problem to name, not a crash to trace.
    PostgreSQL's own first line names the object and never a value.
    """
    if not isinstance(exc, sa.exc.DBAPIError) or getattr(exc.orig, "pgcode", None) != "42501":
        return None
    first = (str(exc.orig).strip().splitlines() or ["permission denied"])[0]
    return (
        f"the database refused this command: {first}. The role in MARKETING_DATABASE_URL lacks that right; "
        "deploy/provision.sh grants what the application needs, and deploy/migrate.sh applies schema changes."
    )


def settings() -> Settings:
    return load_settings()


def engine() -> sa.Engine:
    return get_engine(settings().resolved_database_url)


@contextmanager
def ready_conn() -> Iterator[sa.Connection]:
    """A transaction on the application database, after checking its schema is current."""
    eng = engine()
    ensure_schema_current(eng)
    with eng.begin() as conn:
        yield conn


def emit_rows(rows: list[dict[str, Any]], columns: list[str], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(rows, default=str, indent=2))
        return
    if not rows:
        click.echo("(none)")
        return
    widths = {c: max(len(c), *(len(cell_text(r.get(c))) for r in rows)) for c in columns}
    click.echo("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        click.echo("  ".join(cell_text(r.get(c)).ljust(widths[c]) for c in columns))


def cell_text(value: Any) -> str:
    """One table cell: ``-`` for NULL, ISO times to the second, JSON for the rest, cut at 60 characters.

    Text from the database is anyone's (a campaign name, a receiver's answer, a model's output): its control
    and bidi characters are written visibly, before the cut, so ESC, OSC 52 or U+202E cannot drive the terminal.
    """
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return value.isoformat(timespec="seconds")
    text = visible_controls(value if isinstance(value, str) else json.dumps(value, default=str))
    return text if len(text) <= 60 else text[:57] + "..."


# Row ids are 64-bit integers on both databases; a larger number is refused by Click, not by a driver.
ROW_ID = click.IntRange(1, 2**63 - 1)


class FiniteFloat(click.ParamType):
    """A float within (minimum, maximum]: ``nan``, ``inf`` and ``1e308`` are refused with one line."""

    name = "number"

    def __init__(self, minimum: float, maximum: float) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or not self.minimum < number <= self.maximum:
            self.fail(
                f"{value!r} must be a finite number above {self.minimum:g} and at most {self.maximum:g}", param, ctx
            )
        return number


json_option: Callable[[Callable[..., Any]], Callable[..., Any]] = click.option(
    "--json", "as_json", is_flag=True, help="Print JSON instead of a table."
)
