"""The hashed lock files agree with pyproject.toml, and every install path installs from them.

requirements/runtime.txt (the dependencies and the [image] extra: what the container image installs) and
requirements/dev.txt (the same versions plus the [dev] extra: what CI, the README's commands and a developer
install) are written by requirements/lock.sh. An install six months from now takes exactly these files,
each checked against its sha256 (``--require-hashes``), then the project itself with ``--no-deps``. Each check
returns its problems; the tests run it on the real files and on an edited copy, to show that it can fail.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_LOCK = ROOT / "requirements" / "runtime.txt"
DEV_LOCK = ROOT / "requirements" / "dev.txt"
REGENERATE = "bash requirements/lock.sh"
# The locks are for the image's and CI's interpreter: CPython 3.11 on linux x86_64.
TARGET = {
    "python_version": "3.11",
    "python_full_version": "3.11.0",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}
# The README's install, from the lock with hashes, then the project without resolving anything.
INSTALL = "pip install --require-hashes -r requirements/dev.txt && pip install --no-deps --no-build-isolation -e ."
_PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")
_HASH = re.compile(r"--hash=sha256:[0-9a-f]{64}")


def locked(text: str) -> tuple[dict[str, str], list[str]]:
    """``(name -> version, problems)`` of a lock file's text: each entry pinned with == and hashed."""
    versions: dict[str, str] = {}
    problems: list[str] = []
    # An entry is a requirement line with its backslash-continued --hash lines; comments are pip-compile's notes.
    entries = re.split(r"\n(?=\S)", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    for entry in filter(str.strip, entries):
        pin = _PIN.match(entry)
        if pin is None:
            # An option line (--index-url, --find-links, -e, a path or URL) installs from somewhere a fresh
            # machine may not have, or without a hash.
            problems.append(f"not a pinned, hashed requirement: {entry.splitlines()[0]!r}")
            continue
        name = canonicalize_name(pin["name"])
        versions[name] = pin["version"]
        if not _HASH.search(entry):
            problems.append(f"{name}=={pin['version']} has no sha256 hash")
    return versions, problems


def dependencies(pyproject: dict, *extras: str) -> list[Requirement]:
    """pyproject's dependencies and those of ``extras`` that apply on the lock's target."""
    project = pyproject["project"]
    declared = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        declared += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in declared if r.marker is None or r.marker.evaluate({**TARGET, "extra": ""})]


def disagreements(requirements: list[Requirement], versions: dict[str, str], lock: str) -> list[str]:
    """Each requirement the lock leaves out, or holds at a version the requirement's specifier refuses."""
    problems = []
    for requirement in requirements:
        version = versions.get(canonicalize_name(requirement.name))
        if version is None:
            problems.append(f"{lock}: {requirement} is not locked")
        elif not requirement.specifier.contains(version, prereleases=True):
            problems.append(f"{lock}: {requirement.name}=={version}, pyproject.toml says {requirement}")
    return problems


def lock_problems(pyproject: dict, runtime_text: str, dev_text: str) -> list[str]:
    """Ways the two lock files disagree with pyproject.toml or with each other."""
    runtime, problems = locked(runtime_text)
    dev, dev_problems = locked(dev_text)
    problems = [f"requirements/runtime.txt: {p}" for p in problems]
    problems += [f"requirements/dev.txt: {p}" for p in dev_problems]
    problems += disagreements(dependencies(pyproject, "image"), runtime, "requirements/runtime.txt")
    problems += disagreements(dependencies(pyproject, "image", "dev"), dev, "requirements/dev.txt")
    # The tests run the versions the image ships.
    problems += [
        f"requirements/dev.txt: {name}=={dev.get(name)}, requirements/runtime.txt has {version}"
        for name, version in runtime.items()
        if dev.get(name) != version
    ]
    project = canonicalize_name(pyproject["project"]["name"])
    problems += [
        f"{lock}: locks the project itself" for lock, v in (("runtime", runtime), ("dev", dev)) if project in v
    ]
    return problems


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_locks_agree_with_pyproject(pyproject: dict) -> None:
    problems = lock_problems(pyproject, RUNTIME_LOCK.read_text(), DEV_LOCK.read_text())
    assert problems == [], f"regenerate the locks with `{REGENERATE}`:\n" + "\n".join(problems)


def test_the_dagster_set_is_locked_as_pyproject_pins_it(pyproject: dict) -> None:
    pins = {
        canonicalize_name(r.name): str(r.specifier)
        for r in dependencies(pyproject, "image", "dev")
        if canonicalize_name(r.name).startswith("dagster")
    }
    assert {"dagster", "dagster-postgres", "dagster-k8s", "dagster-docker"} <= set(pins)
    for lock in (RUNTIME_LOCK, DEV_LOCK):
        versions, _ = locked(lock.read_text())
        for name, specifier in pins.items():
            assert specifier == f"=={versions.get(name)}", f"{lock.name}: {name}, pyproject.toml pins {specifier}"


@pytest.mark.parametrize(
    ("edited", "pattern", "replacement", "expected"),
    [
        # A dependency pyproject gained and the locks did not.
        ("pyproject", r'"click>=8.1",', '"click>=8.1", "pyyaml-include>=2",', "pyyaml-include>=2 is not locked"),
        # A pin moved in the lock only.
        (
            "runtime",
            r"\ndagster==1\.13\.27 ",
            "\ndagster==1.13.26 ",
            "dagster==1.13.26, pyproject.toml says dagster==1.13.27",
        ),
        # An entry without its hashes.
        ("dev", r"(\ncryptography==\S+) \\\n(    --hash=\S+( \\)?\n)+", r"\1\n", "has no sha256 hash"),
        # This machine's local index recorded in the lock.
        ("runtime", r"\A", "--extra-index-url file:///opt/pypi/simple\n", "--extra-index-url file:///opt/pypi/simple"),
        # The tests on another version than the image ships.
        ("dev", r"\npandas==", "\npandas==0.0.1+", "requirements/runtime.txt has"),
    ],
    ids=["dependency-not-locked", "pin-moved", "no-hash", "local-index", "dev-differs"],
)
def test_the_lock_check_can_fail(edited: str, pattern: str, replacement: str, expected: str) -> None:
    texts = {
        "pyproject": (ROOT / "pyproject.toml").read_text(encoding="utf-8"),
        "runtime": RUNTIME_LOCK.read_text(),
        "dev": DEV_LOCK.read_text(),
    }
    texts[edited], count = re.subn(pattern, replacement, texts[edited], count=1)
    assert count == 1, f"the edit no longer applies to {edited}"
    problems = lock_problems(tomllib.loads(texts["pyproject"]), texts["runtime"], texts["dev"])
    assert any(expected in problem for problem in problems), problems


def test_ci_runs_the_readmes_test_command_which_installs_from_the_lock() -> None:
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("pip install") and line.endswith("&& pytest")]
    assert commands == [f"{INSTALL} && pytest"], commands
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert ci[-1] == commands[0], "the last command of .ci/run is the README's install-and-test command, exactly"
    assert f"{INSTALL} && marketing-pipelines demo" in readme.splitlines(), (
        "the install-and-run command installs the same"
    )
