"""The image's entry point (deploy/container/with-secrets): secret files become variables, and bad ones stop it.

Run with the host's /bin/sh (the image's is Debian's dash as well), so these run without a Docker engine;
test_docker_stack.py runs it inside the image.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from marketing_pipelines_tests.processes import REPO_ROOT

ENTRY_POINT = REPO_ROOT / "deploy" / "container" / "with-secrets"


def _run(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", str(ENTRY_POINT), "env"],
        env={"PATH": "/usr/bin:/bin", "SECRETS_DIR": str(folder), **env},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_each_file_becomes_the_variable_of_its_name(tmp_path: Path) -> None:
    (tmp_path / "MARKETING_SECRETS_KEY").write_text("k1,k2\n")  # an editor's trailing newline is dropped
    (tmp_path / "DAGSTER_PG_PASSWORD").write_text("")  # set, and empty: Dagster then asks libpq
    (tmp_path / "WITH_SPACE").write_text("a b $HOME `x`")  # taken as it is, never evaluated
    done = _run(tmp_path)
    assert done.returncode == 0, done.stderr
    variables = dict(line.split("=", 1) for line in done.stdout.splitlines())
    assert variables["MARKETING_SECRETS_KEY"] == "k1,k2"
    assert variables["DAGSTER_PG_PASSWORD"] == ""
    assert variables["WITH_SPACE"] == "a b $HOME `x`"


def test_without_the_folder_the_command_runs_as_given(tmp_path: Path) -> None:
    done = _run(tmp_path / "absent", ALREADY="set")
    assert done.returncode == 0 and "ALREADY=set" in done.stdout.splitlines()


def test_a_file_not_named_like_a_variable_stops_it_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "api-key").write_text("x")
    done = _run(tmp_path)
    assert done.returncode == 64 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"with-secrets: {tmp_path}/api-key is not named like an environment variable (letters, digits, _); rename it"
    ]


def test_a_variable_given_both_ways_stops_it_without_showing_either_value(tmp_path: Path) -> None:
    (tmp_path / "ANTHROPIC_API_KEY").write_text("from-file")
    done = _run(tmp_path, ANTHROPIC_API_KEY="from-env")
    assert done.returncode == 64 and done.stdout == ""
    assert (
        done.stderr.strip() == f"with-secrets: ANTHROPIC_API_KEY is set in the environment and in {tmp_path}; keep one"
    )
