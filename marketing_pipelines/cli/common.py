"""What the command groups share: one-line errors, settings and database access, table output, option types."""

from __future__ import annotations

import importlib
import json
import math
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from marketing_pipelines.errors import InvalidInput

if TYPE_CHECKING:
    import sqlalchemy as sa

    from marketing_pipelines.settings import Settings

# Only click and the standard library load with this module: `--help` (cli/__init__.py) imports it, and
# SQLAlchemy (0.13 s), pydantic with the settings (0.09 s) and the schema are imported by the functions
# below when a command reaches the database. A known error is then matched by the module that defines it:
# a module not loaded raised nothing (``known_error``).
KNOWN_ERRORS: dict[str, tuple[str, ...]] = {
    "marketing_pipelines.errors": ("InvalidInput",),
    "marketing_pipelines.db.schema_version": ("SchemaNotReady",),
    "marketing_pipelines.db.engine": ("DatabaseUnavailable",),
    "marketing_pipelines.settings": ("SettingsError",),
    "marketing_pipelines.sealing": ("SealingError",),
    # Its message may quote a receiver's answer, redacted by ``http``.
    "marketing_pipelines.http": ("ServiceError",),
}


def known_error(exc: Exception) -> bool:
    """Whether ``exc`` is one of the project's errors a user can act on from its one line (KNOWN_ERRORS)."""
    return any(
        isinstance(exc, getattr(module, name))
        for module_name, names in KNOWN_ERRORS.items()
        if (module := sys.modules.get(module_name)) is not None
        for name in names
    )


class FriendlyGroup(click.Group):
    """Turns the project's known errors into one clear ``Error: ...`` line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except InvalidInput as exc:
            raise click.ClickException(visible(str(exc))) from None
        except Exception as exc:
            if known_error(exc):
                raise click.ClickException(visible(str(exc))) from None
            if (refused := permission_refused(exc)) is not None:
                raise click.ClickException(visible(refused)) from None
            raise


def visible(text: str) -> str:
    """``redact.visible_controls``: imported when text is shown (redaction compiles its patterns on import)."""
    from marketing_pipelines.redact import visible_controls

    return visible_controls(text)


class LazyGroup(FriendlyGroup):
    """A group whose commands are imported when one is invoked, not when the CLI starts or lists them.

    ``lazy_commands`` maps each command's name to ``"module:attribute"``: ``executions list`` then loads
    the executions module alone, not every group and what each of them imports. ``summaries`` holds
    each one's first help line, which ``--help`` lists without importing any of them
    (test_cli_startup.py holds them equal to the commands' own).
    """

    def __init__(
        self, *args: Any, lazy_commands: Mapping[str, str], summaries: Mapping[str, str], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands)
        self.summaries = dict(summaries)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands and cmd_name not in self.commands:
            module, attribute = self.lazy_commands[cmd_name].split(":")
            self.add_command(getattr(importlib.import_module(module), attribute), cmd_name)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Click's listing of the commands and their short help, from ``summaries`` for those not loaded."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            if name not in self.commands and name in self.summaries:
                rows.append((name, click.utils.make_default_short_help(self.summaries[name], limit)))
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def permission_refused(exc: Exception) -> str | None:
    """One line for a statement PostgreSQL refused for lack of a privilege (SQLSTATE 42501), else None.

    Deployed, the CLI connects as the application role, which reads and writes rows only
    (deploy/provision.sh); a command that needs more is a setup problem to name, not a crash to trace.
    PostgreSQL's own first line names the object and never a value.
    """
    sa_exc = sys.modules.get("sqlalchemy.exc")  # not loaded: no statement ran
    if sa_exc is None or not isinstance(exc, sa_exc.DBAPIError) or getattr(exc.orig, "pgcode", None) != "42501":
        return None
    first = (str(exc.orig).strip().splitlines() or ["permission denied"])[0]
    return (
        f"the database refused this command: {first}. The role in MARKETING_DATABASE_URL lacks that right; "
        "deploy/provision.sh grants what the application needs, and deploy/migrate.sh applies schema changes."
    )


def settings() -> Settings:
    """The settings, read once per command (it asks several times; each read walks every variable).

    Kept in the command's context, not the process: tests run many commands in one process, each with
    its own environment.
    """
    from marketing_pipelines.settings import load_settings

    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return load_settings()
    if "marketing_pipelines.settings" not in ctx.meta:
        ctx.meta["marketing_pipelines.settings"] = load_settings()
    return ctx.meta["marketing_pipelines.settings"]


def engine() -> sa.Engine:
    from marketing_pipelines.db.engine import get_engine

    return get_engine(settings().resolved_database_url)


@contextmanager
def ready_conn() -> Iterator[sa.Connection]:
    """A transaction on the application database, after checking its schema is current."""
    from marketing_pipelines.db.schema_version import ensure_schema_current

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

    Text from the database is anyone's (a campaign name, a receiver's answer, a model's output): its control,
    bidi and invisible characters are written visibly (``redact.visible_cell``: tab and newline as ``\\t`` and
    ``\\n``), before the cut, so ESC, OSC 52 or U+202E cannot drive the terminal and no value adds a row.
    """
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return value.isoformat(timespec="seconds")
    from marketing_pipelines.redact import visible_cell

    text = visible_cell(value if isinstance(value, str) else json.dumps(value, default=str))
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
