"""The image's entry point (deploy/container/with-secrets): secret files become variables, and bad ones stop it.

Run with the host's /bin/sh (the image's is Debian's dash as well), so these run without a Docker engine;
test_docker_stack.py runs it inside the image.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from marketing_pipelines.settings import Settings, env_name, is_secret
from marketing_pipelines_tests.processes import REPO_ROOT

ENTRY_POINT = REPO_ROOT / "deploy" / "container" / "with-secrets"
SECRETS = sorted({env_name(field) for field in Settings.model_fields if is_secret(field)} | {"DAGSTER_PG_PASSWORD"})


def _run(folder: Path, **env: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["/bin/sh", str(ENTRY_POINT), "env", "-0"],
        env={"PATH": "/usr/bin:/bin", "SECRETS_DIR": str(folder), **env},
        capture_output=True,
        timeout=30,
    )


def _variables(done: subprocess.CompletedProcess[bytes]) -> dict[str, bytes]:
    assert done.returncode == 0, done.stderr
    return dict(entry.split(b"=", 1) for entry in done.stdout.split(b"\0") if entry)  # type: ignore[misc]


def _refusal(done: subprocess.CompletedProcess[bytes]) -> str:
    """The one line the entry point stopped with; nothing ran."""
    assert done.returncode == 64 and done.stdout == b"", done
    lines = done.stderr.decode().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_each_secret_file_becomes_the_variable_of_its_name_exactly_as_written(tmp_path: Path) -> None:
    (tmp_path / "MARKETING_SECRETS_KEY").write_bytes(b"k1,k2\n")  # an editor's trailing newline is dropped
    (tmp_path / "OPENAI_API_KEY").write_bytes(b"sk-1\r\n")  # and a Windows editor's CRLF
    (tmp_path / "DAGSTER_PG_PASSWORD").write_bytes(b"")  # set, and empty: Dagster then asks libpq
    (tmp_path / "GITHUB_TOKEN").write_bytes(b" a b $HOME `x` \\n")  # taken as it is, never evaluated
    (tmp_path / "PLAUSIBLE_API_KEY").write_bytes("ключ\xff".encode("utf-8", "surrogateescape"))
    variables = _variables(_run(tmp_path))
    assert variables[b"MARKETING_SECRETS_KEY"] == b"k1,k2"
    assert variables[b"OPENAI_API_KEY"] == b"sk-1"
    assert variables[b"DAGSTER_PG_PASSWORD"] == b""
    assert variables[b"GITHUB_TOKEN"] == b" a b $HOME `x` \\n"
    assert variables[b"PLAUSIBLE_API_KEY"] == "ключ\xff".encode("utf-8", "surrogateescape")


def test_the_names_taken_are_the_projects_secrets(tmp_path: Path) -> None:
    listed = re.search(r'^secrets="([^"]*)"$', ENTRY_POINT.read_text(), re.MULTILINE)
    assert listed is not None and sorted(listed[1].split()) == SECRETS
    for name in SECRETS:
        (tmp_path / name).write_text(f"value of {name}")
    variables = _variables(_run(tmp_path))
    assert {name: variables[name.encode()].decode() for name in SECRETS} == {n: f"value of {n}" for n in SECRETS}


def test_without_the_folder_the_command_runs_as_given(tmp_path: Path) -> None:
    assert _variables(_run(tmp_path / "absent", ALREADY="set"))[b"ALREADY"] == b"set"


@pytest.mark.parametrize(
    "name",
    [
        "LD_PRELOAD",  # the dynamic loader would load the file's library into the command
        "PYTHONPATH",  # Python would import the file's modules first
        "BASH_ENV",  # a bash the command starts would source the file's script
        "MARKETING_SENSOR_BATCH_SIZE",  # a setting that is no secret: settings.env gives it
        "api-key",  # not even named like a variable
    ],
)
def test_a_file_that_is_not_a_secret_stops_it_in_one_line(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("x")
    line = _refusal(_run(tmp_path))
    assert line.startswith(f"with-secrets: {tmp_path}/{name} is not one of the secrets this image reads (")
    assert line.endswith("); settings that are no secret go in settings.env")


def test_a_file_name_is_shown_with_its_control_characters_escaped(tmp_path: Path) -> None:
    (tmp_path / "X\x1b[2J\\").write_text("x")
    line = _refusal(_run(tmp_path))
    assert "\x1b" not in line and line.startswith(f"with-secrets: {tmp_path}/X\\x1b[2J\\x5c is not one of")


@pytest.mark.parametrize("given", ["from-env", ""])
def test_a_variable_given_both_ways_stops_it_without_showing_either_value(tmp_path: Path, given: str) -> None:
    (tmp_path / "ANTHROPIC_API_KEY").write_text("from-file")
    # Set but empty is set too: the file must not quietly take its place.
    line = _refusal(_run(tmp_path, ANTHROPIC_API_KEY=given))
    assert line == f"with-secrets: ANTHROPIC_API_KEY is set in the environment and in {tmp_path}; keep one"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"sk-\x001", "holds a NUL byte, which no environment variable can hold"),
        (b"sk-1\r", "holds a line break or carriage return within its value; write it on one line"),
        (b"sk-1\n\n", "holds a line break or carriage return within its value; write it on one line"),
        (b"sk-1\nsk-2\n", "holds a line break or carriage return within its value; write it on one line"),
    ],
)
def test_a_value_that_cannot_be_taken_exactly_stops_it(tmp_path: Path, content: bytes, why: str) -> None:
    (tmp_path / "OPENAI_API_KEY").write_bytes(content)
    assert _refusal(_run(tmp_path)) == f"with-secrets: {tmp_path}/OPENAI_API_KEY {why}"


def test_links_are_followed_only_inside_the_folder(tmp_path: Path) -> None:
    folder, outside = tmp_path / "secrets", tmp_path / "elsewhere"
    folder.mkdir()
    outside.write_text("not a secret of ours")
    # Kubernetes' layout: NAME -> ..data/NAME, ..data -> the current version's folder.
    (folder / "..2026_12_07").mkdir()
    (folder / "..2026_12_07" / "GITHUB_TOKEN").write_text("ghp-1\n")
    (folder / "..data").symlink_to("..2026_12_07")
    (folder / "GITHUB_TOKEN").symlink_to("..data/GITHUB_TOKEN")
    assert _variables(_run(folder))[b"GITHUB_TOKEN"] == b"ghp-1"

    (folder / "OPENAI_API_KEY").symlink_to(outside)
    line = _refusal(_run(folder))
    assert line == (
        f"with-secrets: {folder}/OPENAI_API_KEY is a link out of {folder}; a secret's link must stay inside the folder"
    )
    os.remove(folder / "OPENAI_API_KEY")
    (folder / "OPENAI_API_KEY").symlink_to("/proc/self/environ")
    assert "is a link out of" in _refusal(_run(folder))
