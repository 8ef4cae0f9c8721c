"""The command line run in-process for tests: ``invoke`` runs ``marketing-pipelines`` with a given MARKETING_*
environment through Click's CliRunner, ``run`` with none, and ``cli_for`` binds a database URL (and any other
variables) into a ``Cli`` callable that tests call with the command's arguments.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

from click.testing import CliRunner, Result

from marketing_pipelines.cli import main

Cli = Callable[..., Result]


def invoke(env: Mapping[str, str], *args: str) -> Result:
    """The command as a user runs it, with ``env`` as its MARKETING_* environment (Click's own isolation)."""
    return CliRunner(env=dict(env)).invoke(main, list(args), catch_exceptions=False)


def run(*args: str) -> Result:
    return invoke({}, *args)


def cli_for(url: str, **env: str) -> Cli:
    return functools.partial(invoke, {"MARKETING_DATABASE_URL": url, **env})
