"""Every example in ``--help`` runs as written: each command's ``Example:`` lines (or ``Examples:``), as Click
shows them, run through bash with ``-euo pipefail`` in a fresh folder on the embedded SQLite default, with no
MARKETING_* variable but what the example or its setup exports.

An example may assume its setup: the rows or files it names, made by the lines in ``SETUP`` (by default a
migrated database holding the campaign ``spring-launch``). An example that cannot run here is in ``NOT_RUN``
with why and the test that covers it.
"""

from __future__ import annotations

import inspect
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from marketing_pipelines.cli import main
from marketing_pipelines_tests.test_doc_recipes import newcomer_environment

# A help text's example block: Click's "\b" (keep the lines as written), a heading ending in "Example:" or
# "Examples:" (the root's reads "Example, from nothing to a finished run:"), then indented command lines.
EXAMPLES = re.compile(r"^\x08\n\s*Examples?\b[^\n]*:\n(?P<body>(?:[ \t]+\S[^\n]*\n?)+)", re.M)

BASE = """\
marketing-pipelines db upgrade
marketing-pipelines campaigns add spring-launch --name 'Spring launch' --owner ana
"""
KEY = "export MARKETING_SECRETS_KEY=$(marketing-pipelines webhooks new-key)\n"
AGENT_RUN = (
    "marketing-pipelines users add ana\n"
    "marketing-pipelines users grant ana campaign:read\n"
    "marketing-pipelines agents request --agent campaign_brief --campaign spring-launch --as ana "
    """--input '{"stage": "launch"}'\n"""
)
EXECUTION = "marketing-pipelines executions schedule --campaign spring-launch --stage launch --action log --due now\n"

# What an example needs made before it, beyond BASE: the rows it names, a key, a file it reads.
SETUP: dict[str, str] = {
    "": "",  # the root's example is the demo, which makes its own database
    "demo": "",
    "campaigns add": "marketing-pipelines db upgrade\n",  # the example adds spring-launch itself
    "agents cancel": BASE + AGENT_RUN,
    "agents show": BASE + AGENT_RUN,
    "agents retry": BASE + AGENT_RUN + "marketing-pipelines agents cancel 1\n",
    "agents request": BASE + "marketing-pipelines users add ana\nmarketing-pipelines users grant ana campaign:read\n",
    "executions cancel": BASE + EXECUTION,
    "executions show": BASE + EXECUTION,
    "executions retry": BASE + EXECUTION + "marketing-pipelines executions cancel 1\n",
    "executions schedule": BASE
    + """echo '{"campaign": "spring-launch", "stage": "launch", "action": "log", "due": "now"}' > launch.jsonl\n""",
    "events load": BASE
    + """echo '{"event_id": "e-1", "campaign_id": "spring-launch", "stage": "awareness", "event_type": "page_view", """
    + """"occurred_at": "2026-11-02T10:00:00+00:00"}' > events-2026-11.jsonl\n"""
    + "printf 'event_id,campaign_id,stage,event_type,occurred_at\\n"
    + "c-1,spring-launch,awareness,page_view,2026-11-03T10:00:00+00:00\\n' > export.csv\n",
    "users grant": BASE + "marketing-pipelines users add ana\n",
    "users revoke": BASE + "marketing-pipelines users add ana\nmarketing-pipelines users grant ana execution:write\n",
    "users deactivate": BASE + "marketing-pipelines users add ben\n",
    "webhooks add": BASE + KEY,
    "webhooks rotate": BASE + KEY + "marketing-pipelines webhooks add crm --url https://crm.example.com/hooks\n",
    "webhooks remove": BASE + KEY + "marketing-pipelines webhooks add crm --url https://crm.example.com/hooks\n",
    "webhooks reseal": BASE
    + "export OLD_KEY=$(marketing-pipelines webhooks new-key) NEW_KEY=$(marketing-pipelines webhooks new-key)\n"
    + "MARKETING_SECRETS_KEY=$OLD_KEY marketing-pipelines webhooks add crm --url https://crm.example.com/hooks\n",
}

NOT_RUN: dict[str, str] = {
    "ui": "serves until stopped: test_cli_startup.py::test_ui_starts_without_warnings starts it",
}


def commands(group: click.Group = main, path: tuple[str, ...] = ()) -> Iterator[tuple[str, click.Command]]:
    """``("executions schedule", command)`` for the root and every command under it, groups included."""
    ctx = click.Context(group, info_name="marketing-pipelines")
    if not path:
        yield "", group
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name
        yield " ".join((*path, name)), command
        if isinstance(command, click.Group):
            yield from commands(command, (*path, name))


def examples(command: click.Command) -> list[str]:
    """The command lines of its examples, dedented, as bash reads them (a trailing ``\\`` continues a line)."""
    return [
        "\n".join(line.strip() for line in match.group("body").splitlines())
        for match in EXAMPLES.finditer(inspect.cleandoc(command.help or ""))
    ]


WITH_EXAMPLES = {name: examples(command) for name, command in commands() if examples(command)}


def test_the_examples_are_found_and_every_exception_names_a_command_with_one() -> None:
    assert len(WITH_EXAMPLES) >= 30, sorted(WITH_EXAMPLES)
    assert set(SETUP) | set(NOT_RUN) <= set(WITH_EXAMPLES)


@pytest.mark.parametrize("name", sorted(set(WITH_EXAMPLES) - set(NOT_RUN)))
def test_every_help_example_runs_as_written(name: str, tmp_path: Path) -> None:
    # A help's examples run in turn in one shell, as a reader would type them (the second may use the first's).
    shown = "\n".join(WITH_EXAMPLES[name])
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", SETUP.get(name, BASE) + shown + "\n"],
        cwd=tmp_path,
        env=newcomer_environment(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"marketing-pipelines {name} --help:\n{shown}\n{done.stdout}\n{done.stderr}"
