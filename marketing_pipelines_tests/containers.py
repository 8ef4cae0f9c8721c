"""The Docker engine as the container tests use it: the image built once per session, compose found, skips."""

from __future__ import annotations

import functools
import shutil
import subprocess

from marketing_pipelines_tests.machine import require_or_skip
from marketing_pipelines_tests.processes import REPO_ROOT

TAG = "marketing-pipelines:test"
NO_ENGINE = "no Docker engine answers (Debian: apt-get install docker.io debootstrap, then start dockerd)"
# The legacy builder where BuildKit is not installed (Debian's docker.io): the same Dockerfile.
BUILD_ENV = {"DOCKER_BUILDKIT": "0", "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}


def docker(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *argv], capture_output=True, text=True, timeout=timeout, check=False)


def require_engine() -> None:
    if shutil.which("docker") is None or docker("info", timeout=20).returncode != 0:
        require_or_skip(NO_ENGINE)


def compose_command() -> list[str]:
    """`docker compose` (the plugin) or `docker-compose` (Debian's package), whichever this machine has."""
    require_engine()
    if docker("compose", "version", timeout=20).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    require_or_skip("no Docker Compose (Debian: apt-get install docker-compose; or Docker's compose plugin)")


@functools.cache
def _build() -> tuple[str, str]:
    """(tag, "") once built, or ("", why it failed): one build per session, for every test that needs it."""
    if docker("image", "inspect", "python:3.11-slim").returncode != 0 and shutil.which("debootstrap") is None:
        return "", "skip: python:3.11-slim cannot be pulled here and debootstrap is missing to build the stand-in"
    # Also where the base exists (it returns at once then): build-base.sh copies pip's CA bundle for the build
    # stage (deploy/container/build-ca.crt, git-ignored), which a fresh checkout does not have.
    base = subprocess.run(
        [str(REPO_ROOT / "deploy" / "container" / "build-base.sh")], capture_output=True, text=True, timeout=900
    )
    if base.returncode != 0:
        return "", base.stderr[-3000:]
    built = subprocess.run(
        ["docker", "build", "-q", "-f", "deploy/container/Dockerfile", "-t", TAG, "."],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=1200,
        env=BUILD_ENV,
    )
    return (TAG, "") if built.returncode == 0 else ("", built.stderr[-3000:])


def built_image() -> str:
    """The shipped Dockerfile built as it is (with build-base.sh's stand-in base where none can be pulled)."""
    require_engine()
    tag, failure = _build()
    if failure.startswith("skip: "):
        require_or_skip(failure.removeprefix("skip: "))
    assert tag, failure
    return tag
