"""What the command groups share: one-line errors, settings and database access, table output, option types."""

from __future__ import annotations

import importlib
import io
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

    from marketing_pipelines.egress import EgressPolicy
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


class _Utf8Arguments(click.Command):
    """Text arguments must be valid UTF-8 (``refuse_undecodable``), checked once they are parsed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        refuse_undecodable(ctx)
        return rest


class CheckedCommand(_Utf8Arguments):
    """A command whose text arguments must be valid UTF-8; every group's default."""


class FriendlyGroup(_Utf8Arguments, click.Group):
    """Turns the project's known errors into one clear ``Error: ...`` line and exit code 1, and usage errors
    (a missing option, a bad value, an unknown command) into one line and exit code 2; its own text arguments
    and its commands' must be valid UTF-8."""

    command_class = CheckedCommand

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        # The root's own options are parsed here, outside any group's invoke.
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise one_line_usage(exc) from None
        except InvalidInput as exc:
            raise click.ClickException(visible(str(exc))) from None
        except Exception as exc:
            if known_error(exc):
                raise click.ClickException(visible(str(exc))) from None
            if (refused := permission_refused(exc)) is not None:
                raise click.ClickException(visible(refused)) from None
            if (failed := database_failed(exc)) is not None:
                raise click.ClickException(visible(failed)) from None
            raise


def one_line_usage(exc: click.UsageError) -> click.UsageError:
    """``exc`` as one line naming the command's help; Click shows its usage, a hint and the error on four.

    Without a context Click prints ``Error: <message>`` alone, with the usual exit code 2. A command
    group called without a command (``NoArgsIsHelpError``) still shows its help, and an error already
    made one line stays as it is.
    """
    if isinstance(exc, click.exceptions.NoArgsIsHelpError) or exc.ctx is None:
        return exc
    message = exc.format_message().strip().rstrip(".")
    return click.UsageError(f"{shown_value(message)}; see '{exc.ctx.command_path} --help'")


def refuse_undecodable(ctx: click.Context) -> None:
    """Refuse, naming the option, a text argument that is not valid UTF-8.

    Python reads such bytes of the command line as lone surrogates (U+DC80-U+DCFF), which no database
    stores and no UTF-8 terminal prints: refused here, before anything is looked up or written.
    """
    from marketing_pipelines.strict_json import holds_lone_surrogate

    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        for text in value if isinstance(value, tuple | list) else (value,):
            if isinstance(text, str) and holds_lone_surrogate(text):
                raise click.BadParameter(f"'{shown_value(text)}' is not valid UTF-8 text", ctx=ctx, param=param)


def shown_value(text: str) -> str:
    """``text`` on one line as a terminal may show it (``redact.visible_cell``), each byte of the command line
    that was not UTF-8 written ``\\xNN`` (Python reads it as a lone surrogate, which no terminal prints)."""
    from marketing_pipelines.redact import visible_cell
    from marketing_pipelines.strict_json import escaped_surrogates, holds_lone_surrogate

    if holds_lone_surrogate(text):
        try:
            text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate that stands for no byte (not from a command line)
            text = escaped_surrogates(text)
    return visible_cell(text)


def visible(text: str) -> str:
    """``redact.visible_controls``: imported when text is shown (redaction compiles its patterns on import)."""
    from marketing_pipelines.redact import visible_controls
    from marketing_pipelines.strict_json import escaped_surrogates

    return visible_controls(escaped_surrogates(text))


def escape_unencodable_output() -> None:
    """Let stdout write what it cannot encode as ``\\udNNN`` instead of raising, as stderr already does.

    Text a database held before it was refused at the edge (a lone surrogate stored by SQLite) must
    not stop a command that only shows it.
    """
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")


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

    def main(self, *args: Any, **kwargs: Any) -> Any:
        escape_unencodable_output()
        return super().main(*args, **kwargs)

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


def database_failed(exc: Exception) -> str | None:
    """One line for a statement that failed in the database or its connection mid-command, else None.

    A PostgreSQL restart or a dropped connection during a command ends its transaction, which the
    server rolls back: nothing of it was written. The driver's first line names what happened (its
    other lines, and SQLAlchemy's, repeat the statement and its parameters).
    """
    sa_exc = sys.modules.get("sqlalchemy.exc")  # not loaded: no statement ran
    if sa_exc is None or not isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError):
        return None
    from marketing_pipelines.redact import redact_text

    first = (str(exc.orig).strip().splitlines() or [type(exc.orig).__name__])[0]
    return (
        f"the database failed during this command: {redact_text(first)}. What it had not committed was rolled "
        "back; run it again once the database answers (MARKETING_DATABASE_URL)."
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


def cli_webhook_policy() -> EgressPolicy:
    """Where a webhook scheduled (or registered) here may go: what the runs that will send it allow.

    That is MARKETING_WEBHOOK_ALLOW_NETWORKS; unset, on the embedded database (MARKETING_DATABASE_URL
    unset too) it is the local instance's: ``marketing-pipelines ui`` and the demo let their webhooks
    reach the demo's receiver (127.0.0.2/32, ``local_dagster.local_environment``), so an execution for
    it is accepted here too, and nothing more.
    """
    from marketing_pipelines.egress import EgressPolicy, parse_networks
    from marketing_pipelines.local_dagster import DEMO_RECEIVER_ADDRESS

    current = settings()
    if current.webhook_allow_networks or current.database_url is not None:
        return EgressPolicy(parse_networks(current.webhook_allow_networks))
    return EgressPolicy(parse_networks([f"{DEMO_RECEIVER_ADDRESS}/32"]))


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
