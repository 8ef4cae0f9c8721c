"""The container image and the Helm values agree with the project they deploy.

deploy/helm/values.yaml cannot be installed where these tests run (there is no Kubernetes), and the
image is built only where a Docker engine answers (test_container_image.py), so these checks, which
need neither, keep both files from going stale everywhere. The tests check five things. Every
variable the files set is one the code reads. The image installs pyproject's Dagster set. The
instance numbers equal deploy/dagster.yaml's. The module is pyproject's. The base image's Python is
one that pyproject admits. Each check is a function that returns its problems. The tests run it on
the real files, and also on an edited copy, to show that the check can fail.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import re
import shlex
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from pydantic import SecretStr

from marketing_pipelines.agents.providers.registry import PROVIDERS
from marketing_pipelines.settings import Settings, env_name, is_secret

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
VALUES = ROOT / "deploy" / "helm" / "values.yaml"
INSTANCE = ROOT / "deploy" / "dagster.yaml"
PYPROJECT = ROOT / "pyproject.toml"
LOCK = ROOT / "requirements" / "runtime.txt"  # what the image installs, hashed (requirements/lock.sh)

# Variables that Dagster or Python read themselves, which the files may set. Dagster's CLI reads
# DAGSTER_CLI_<COMMAND>_<OPTION> for any option (Click's auto_envvar_prefix, dagster/_cli/__init__.py).
RUNTIME_VARIABLES = {
    "DAGSTER_HOME",
    "DAGSTER_CLI_API_GRPC_FIXED_SERVER_ID",
    "PATH",  # the image's: its command wrappers, then its virtual environment
    "PIP_PYTHON",  # pip's --python: the base's pip looks at the image's virtual environment
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
}
# Dagster's default when run_monitoring leaves it out (DagsterInstance.run_monitoring_max_resume_run_attempts).
DEFAULT_MAX_RESUME_RUN_ATTEMPTS = 0


# ---- what the project knows -------------------------------------------------------------------


def setting_variables() -> set[str]:
    """The env var of every `Settings` field: the only MARKETING_* variables the code reads."""
    return {env_name(field) for field in Settings.model_fields}


def provider_variables() -> set[str]:
    """The model providers' variables, from the registry that reads them (the importers' are settings)."""
    fields = ("api_key", "model", "base_url")
    return {name for spec in PROVIDERS for field in fields if (name := spec.variable(field))}


def secret_variables() -> set[str]:
    """Variables whose values are credentials: they belong in a Secret, never in a ConfigMap or an image."""
    secret_fields = {name for name, info in Settings.model_fields.items() if SecretStr in _types(info.annotation)}
    # The URLs carry credentials too: a database password, an incoming webhook's token.
    secret_fields |= {"database_url", "alert_webhook_url"}
    api_keys = {spec.api_key_env for spec in PROVIDERS if spec.api_key_env}
    return {env_name(field) for field in secret_fields} | api_keys


def _types(annotation: Any) -> set[Any]:
    return {annotation, *getattr(annotation, "__args__", ())}


def instance_env_references(instance: Any) -> set[str]:
    """The variables deploy/dagster.yaml reads (`{env: NAME}`), e.g. DAGSTER_PG_HOST."""
    if isinstance(instance, Mapping):
        if set(instance) == {"env"}:
            return {instance["env"]}
        return set().union(*(instance_env_references(value) for value in instance.values()))
    if isinstance(instance, list):
        return set().union(*(instance_env_references(value) for value in instance))
    return set()


def dagster_pins() -> dict[str, str]:
    """pyproject's `dagster*==X` pins, by package name."""
    dependencies = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["dependencies"]
    pins = {}
    for line in dependencies:
        requirement = Requirement(line)
        if requirement.name.startswith("dagster"):
            [spec] = requirement.specifier
            assert spec.operator == "==", f"pyproject.toml: {line!r} should pin with =="
            pins[requirement.name] = spec.version
    return pins


# ---- reading the two files --------------------------------------------------------------------


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, with continuation lines joined and comments dropped."""
    instructions, current = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, arguments = current.strip().partition(" ")
        instructions.append((keyword.upper(), arguments.strip()))
        current = ""
    return instructions


def dockerfile_env(text: str) -> dict[str, str]:
    """The variables ENV sets (`ENV A=1 B=2` and the legacy `ENV A 1`)."""
    variables = {}
    for keyword, arguments in dockerfile_instructions(text):
        if keyword != "ENV":
            continue
        tokens = shlex.split(arguments)
        if tokens and "=" not in tokens[0]:
            variables[tokens[0]] = " ".join(tokens[1:])
        else:
            variables.update(token.split("=", 1) for token in tokens)
    return variables


def pip_commands(text: str) -> Iterator[list[str]]:
    """The arguments after `pip install` / `pip wheel` in every RUN, one list per pip command."""
    for keyword, arguments in dockerfile_instructions(text):
        if keyword != "RUN":
            continue
        # The shell's own split into commands: `&&`, `;` and pipes outside quotes (a quoted `sh -c '...; ...'`
        # stays one argument).
        lexer = shlex.shlex(arguments, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        commands: list[list[str]] = [[]]
        for token in lexer:
            if token and set(token) <= set(";&|"):
                commands.append([])
            else:
                commands[-1].append(token)
        for tokens in commands:
            if len(tokens) >= 2 and tokens[0] in ("pip", "pip3") and tokens[1] in ("install", "wheel"):
                yield tokens[2:]


def base_images(text: str) -> list[str]:
    return [arguments.split()[0] for keyword, arguments in dockerfile_instructions(text) if keyword == "FROM"]


def the_deployment(values: Mapping[str, Any]) -> dict[str, Any]:
    [deployment] = values["dagster-user-deployments"]["deployments"]
    return deployment


def values_env(values: Mapping[str, Any], text: str) -> list[tuple[str, str]]:
    """(variable, where it is set) for every variable values.yaml sets or tells the operator to put in a Secret."""
    found: list[tuple[str, str]] = []

    def add(env: Any, where: str) -> None:
        names = env if isinstance(env, Mapping) else [item["name"] for item in env or []]
        found.extend((name, where) for name in names)

    for index, deployment in enumerate(values["dagster-user-deployments"]["deployments"]):
        add(deployment.get("env"), f"dagster-user-deployments.deployments[{index}].env")
    for section in ("dagsterDaemon", "dagsterWebserver"):
        add(values.get(section, {}).get("env"), f"{section}.env")
    launcher = values.get("runLauncher", {}).get("config", {}).get("k8sRunLauncher", {})
    found.extend(
        (item.split("=", 1)[0], "runLauncher.config.k8sRunLauncher.envVars") for item in launcher.get("envVars", [])
    )
    found.extend((name, "the kubectl create secret command") for name in secret_literals(text))
    return found


def secret_literals(text: str) -> list[str]:
    """The variables the header's `kubectl create secret ... --from-literal=NAME=...` (or `--from-file=NAME=...`)
    lines put in a Secret."""
    return re.findall(r"--from-(?:literal|file)=([A-Z][A-Z0-9_]*)=", text)


def plain_env(values: Mapping[str, Any], dockerfile_text: str) -> list[tuple[str, str]]:
    """Variables set in clear text: the deployments' env (a ConfigMap) and the image's ENV."""
    return [(name, where) for name, where in values_env(values, "") if where.endswith(".env")] + [
        (name, "deploy/container/Dockerfile ENV") for name in dockerfile_env(dockerfile_text)
    ]


def snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


def camel(key: str) -> str:
    first, *rest = key.split("_")
    return first + "".join(part.title() for part in rest)


# ---- the checks: each returns its problems ----------------------------------------------------


def unknown_variables(names: list[tuple[str, str]], instance_variables: set[str]) -> list[str]:
    """Variables that neither Settings, deploy/dagster.yaml, the providers and importers, nor Dagster read."""
    settings, providers = setting_variables(), provider_variables()
    problems = []
    for name, where in names:
        if name.startswith("MARKETING_"):
            if name not in settings:
                problems.append(f"{where}: {name} is not a field of marketing_pipelines.settings.Settings")
        elif name.startswith("DAGSTER_PG_"):
            if name not in instance_variables:
                problems.append(f"{where}: {name} is not one deploy/dagster.yaml reads")
        elif name not in settings | providers | RUNTIME_VARIABLES:  # a service's own variable may be a setting
            problems.append(f"{where}: {name} is read by no provider, importer, Dagster or Python")
    return problems


def lock_pins(lock_text: str) -> dict[str, str]:
    """``name==version`` of every package a hashed lock file pins, by normalised name."""
    return {
        match["name"].lower().replace("_", "-"): match["version"]
        for match in re.finditer(r"^(?P<name>[A-Za-z0-9][\w.-]*)==(?P<version>[^\s\\;]+)", lock_text, re.M)
    }


def pin_problems(dockerfile_text: str, pins: Mapping[str, str], lock_text: str) -> list[str]:
    """Ways the image could install a Dagster set other than pyproject's, or anything but the hashed lock."""
    where = "deploy/container/Dockerfile"
    problems = []
    commands = list(pip_commands(dockerfile_text))
    copied = [arguments.split() for keyword, arguments in dockerfile_instructions(dockerfile_text) if keyword == "COPY"]
    if not any("pyproject.toml" in sources for sources in copied):
        problems.append(f"{where}: pyproject.toml is not copied, so its pins cannot apply")
    # The dependencies: the lock's files and no others (`--require-hashes` refuses anything unhashed).
    lock_name = LOCK.relative_to(ROOT).as_posix()
    locked = [
        arguments
        for arguments in commands
        if any(a == "-r" and b.split("/")[-1] == LOCK.name for a, b in itertools.pairwise(arguments))
    ]
    if not any(lock_name in sources for sources in copied) or not locked:
        problems.append(f"{where}: does not install {lock_name}")
    elif not all("--require-hashes" in arguments for arguments in locked):
        problems.append(f"{where}: installs {lock_name} without --require-hashes")
    # The project: its own code only, its dependencies being the lock's.
    project = [arguments for arguments in commands if "." in arguments]
    if not project:
        problems.append(f"{where}: no `pip install .` or `pip wheel .` installs the project")
    elif not all("--no-deps" in arguments for arguments in project):
        problems.append(f"{where}: installs the project with its dependencies, beside the lock's")
    library_version = pins["dagster-postgres"]
    # A package pyproject pins takes that pin, and both launchers' libraries the library line's release (dagster-k8s
    # 0.29.27 pairs with dagster 1.13.27, as dagster-postgres does); what they bring in is on one of the two lines.
    releases = {pins["dagster"], library_version}
    for name, version in sorted(lock_pins(lock_text).items()):
        if not name.startswith("dagster"):
            continue
        wanted = pins.get(name) or (library_version if name in ("dagster-k8s", "dagster-docker") else None)
        if wanted is not None and version != wanted:
            problems.append(f"{lock_name}: pins {name}=={version}, pyproject.toml's set needs {name}=={wanted}")
        elif version not in releases:
            problems.append(f"{lock_name}: pins {name}=={version}, off the release lines {sorted(releases)}")
    missing = sorted({*pins, "dagster-k8s", "dagster-docker"} - set(lock_pins(lock_text)))
    problems += [f"{lock_name}: does not pin {name}, which the image needs" for name in missing]
    for arguments in commands:
        for token in arguments:
            if token.startswith(("-", "/", ".")) or token.endswith((".whl", ".txt")):
                continue
            try:
                requirement = Requirement(token)
            except InvalidRequirement:
                continue
            if not requirement.name.startswith("dagster"):
                continue
            wanted = pins.get(requirement.name, library_version)
            if str(requirement.specifier) != f"=={wanted}":
                problems.append(f"{where}: installs {token!r}, pyproject.toml's set needs {requirement.name}=={wanted}")
    # Even a comment naming another Dagster release would mislead the reader of the file.
    known_versions = set(pins.values())
    for version in re.findall(r"(?<![\w.])\d+\.\d+\.\d+(?![\w.])", dockerfile_text):
        if version not in known_versions:
            problems.append(f"{where}: names version {version}, not one of pyproject's Dagster pins")
    return problems


NOT_SET = "(not set)"


def differences(helm: Any, wanted: Any, helm_path: str, dagster_path: str, camel_keys: bool) -> list[str]:
    """Each leaf where values.yaml (camelCase keys, or dagster.yaml's own keys) differs from dagster.yaml."""
    if isinstance(helm, Mapping) and isinstance(wanted, Mapping):
        keys = sorted(set(wanted) | {snake(key) if camel_keys else key for key in helm})
        problems = []
        for key in keys:
            helm_key = camel(key) if camel_keys else key
            problems += differences(
                helm.get(helm_key, NOT_SET),
                wanted.get(key, NOT_SET),
                f"{helm_path}.{helm_key}",
                f"{dagster_path}.{key}",
                camel_keys,
            )
        return problems
    if helm == wanted:
        return []
    return [f"deploy/helm/values.yaml {helm_path} = {helm!r}, deploy/dagster.yaml {dagster_path} = {wanted!r}"]


def instance_problems(values: Mapping[str, Any], instance: Mapping[str, Any]) -> list[str]:
    """Each key where values.yaml's instance settings differ from deploy/dagster.yaml's."""
    daemon = values.get("dagsterDaemon", {})
    coordinator = daemon.get("runCoordinator", {})
    concurrency = dict(values.get("concurrency", {}))
    retention = dict(values.get("retention", {}))
    monitoring = {"max_resume_run_attempts": DEFAULT_MAX_RESUME_RUN_ATTEMPTS, **instance["run_monitoring"]}
    # (values.yaml path, its value, dagster.yaml path, its value, whether values.yaml spells keys in camelCase)
    pairs = [
        ("dagsterDaemon.runCoordinator.enabled", coordinator.get("enabled"), "run_coordinator (present)", True, False),
        (
            "dagsterDaemon.runCoordinator.type",
            coordinator.get("type"),
            "run_coordinator",
            "CustomRunCoordinator",
            False,
        ),
        (
            "dagsterDaemon.runCoordinator.config.customRunCoordinator",
            coordinator.get("config", {}).get("customRunCoordinator", {}),
            "run_coordinator",
            instance["run_coordinator"],
            False,
        ),
        ("dagsterDaemon.sensors", daemon.get("sensors", {}), "sensors", instance["sensors"], True),
        ("dagsterDaemon.runMonitoring", daemon.get("runMonitoring", {}), "run_monitoring", monitoring, True),
        ("concurrency.enabled", concurrency.pop("enabled", False), "concurrency (present)", True, False),
        ("concurrency", concurrency, "concurrency", instance["concurrency"], True),
        ("telemetry", values.get("telemetry", {}), "telemetry", instance["telemetry"], True),
        # The chart writes its retention into the instance only when enabled.
        ("retention.enabled", retention.pop("enabled", False), "retention (present)", "retention" in instance, False),
        ("retention", retention, "retention", instance.get("retention", {}), True),
    ]
    return [
        problem
        for helm_path, helm, dagster_path, wanted, camel_keys in pairs
        for problem in differences(helm, wanted, helm_path, dagster_path, camel_keys)
    ]


def python_problems(dockerfile_text: str, requires_python: str) -> list[str]:
    """Base images whose Python pyproject's requires-python does not admit (or that name no version)."""
    problems = []
    for image in base_images(dockerfile_text):
        match = re.fullmatch(r"python:(\d+\.\d+)(?:[.-][\w.-]*)?", image)
        if match is None:
            problems.append(f"deploy/container/Dockerfile: FROM {image} names no python:X.Y image")
        elif match.group(1) not in SpecifierSet(requires_python):
            problems.append(
                f"deploy/container/Dockerfile: FROM {image}, pyproject requires-python is {requires_python}"
            )
    return problems


# ---- the tests ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dockerfile_text() -> str:
    return DOCKERFILE.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def values_text() -> str:
    return VALUES.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def values(values_text: str) -> dict[str, Any]:
    return yaml.safe_load(values_text)


@pytest.fixture(scope="module")
def instance() -> dict[str, Any]:
    return yaml.safe_load(INSTANCE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def pyproject() -> dict[str, Any]:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))


def all_variables(values: Mapping[str, Any], values_text: str, dockerfile_text: str) -> list[tuple[str, str]]:
    image = [(name, "deploy/container/Dockerfile ENV") for name in dockerfile_env(dockerfile_text)]
    return [(name, f"deploy/helm/values.yaml {where}") for name, where in values_env(values, values_text)] + image


def test_every_variable_the_files_set_is_one_the_project_reads(
    values: dict[str, Any], values_text: str, dockerfile_text: str, instance: dict[str, Any]
) -> None:
    names = all_variables(values, values_text, dockerfile_text)
    assert {"MARKETING_DATABASE_URL", "DAGSTER_HOME"} <= {name for name, _ in names}  # the parsers found them
    assert unknown_variables(names, instance_env_references(instance)) == []


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # A MARKETING_ name that is no Settings field (a typo of MARKETING_DATABASE_URL).
        ("MARKETING_DATABASE_URI", "is not a field of marketing_pipelines.settings.Settings"),
        # A Dagster storage variable deploy/dagster.yaml does not read.
        ("DAGSTER_PG_HOSTNAME", "is not one deploy/dagster.yaml reads"),
        # A provider variable nothing reads.
        ("ANTHROPIC_KEY", "is read by no provider, importer, Dagster or Python"),
    ],
)
def test_an_unknown_variable_is_named_with_where_it_is_set(name: str, expected: str, instance: dict[str, Any]) -> None:
    [problem] = unknown_variables([(name, "deploy/helm/values.yaml env")], instance_env_references(instance))
    assert problem == f"deploy/helm/values.yaml env: {name} {expected}"


def test_secrets_are_in_the_secret_and_never_in_clear_text(
    values: dict[str, Any], values_text: str, dockerfile_text: str
) -> None:
    in_clear = [f"{where}: {name}" for name, where in plain_env(values, dockerfile_text) if name in secret_variables()]
    assert in_clear == [], "credentials belong in the Secret marketing-pipelines-secrets"
    assert {"MARKETING_DATABASE_URL", "MARKETING_SECRETS_KEY"} <= set(secret_literals(values_text)), (
        "deploy/helm/values.yaml: the kubectl create secret command should name both"
    )
    assert "kubectl create secret generic marketing-pipelines-secrets" in values_text, "deploy/helm/values.yaml header"
    secret = [{"name": "marketing-pipelines-secrets"}]
    assert the_deployment(values)["envSecrets"] == secret, (
        "deploy/helm/values.yaml dagster-user-deployments.deployments[0].envSecrets"
    )
    assert values["runLauncher"]["config"]["k8sRunLauncher"]["envSecrets"] == secret, (
        "deploy/helm/values.yaml runLauncher.config.k8sRunLauncher.envSecrets"
    )


@pytest.fixture(scope="module")
def lock_text() -> str:
    return LOCK.read_text(encoding="utf-8")


def test_the_image_installs_pyprojects_dagster_set(dockerfile_text: str, lock_text: str) -> None:
    pins = dagster_pins()
    assert {"dagster", "dagster-postgres", "dagster-webserver", "dagster-graphql", "dagster-dg-cli"} <= set(pins)
    assert pin_problems(dockerfile_text, pins, lock_text) == []
    # Both launchers' libraries are in the lock, on the library line.
    assert {"dagster-k8s", "dagster-docker"} <= set(lock_pins(lock_text))


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # The lock installed without its hashes.
        ("--require-hashes -r runtime.txt", "-r runtime.txt", "installs requirements/runtime.txt without --require"),
        # The lock not installed at all: pip would resolve the dependencies afresh.
        ("--require-hashes -r runtime.txt", "", "does not install requirements/runtime.txt"),
        # The project installed with its dependencies, which pip would resolve beside the lock's.
        ("--no-deps --no-build-isolation .", "--no-build-isolation .", "installs the project with its dependencies"),
        # A Dagster library named beside the lock, unpinned.
        ("--no-build-isolation .", "--no-build-isolation . dagster-k8s", "installs 'dagster-k8s'"),
        # The project itself no longer installed, so pyproject's pins would not apply.
        ("--no-build-isolation .", "--no-build-isolation marketing-pipelines", "no `pip install .`"),
    ],
)
def test_a_different_install_in_the_image_is_caught(
    dockerfile_text: str, lock_text: str, old: str, new: str, expected: str
) -> None:
    assert old in dockerfile_text
    problems = pin_problems(dockerfile_text.replace(old, new), dagster_pins(), lock_text)
    assert any(expected in problem for problem in problems), problems


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        # A core package locked at another release than pyproject's.
        ("\ndagster==1.13.27 ", "\ndagster==1.13.28 ", "pins dagster==1.13.28, pyproject.toml's set needs dagster=="),
        # dagster-k8s from another release than dagster-postgres.
        ("\ndagster-k8s==0.29.27 ", "\ndagster-k8s==0.29.26 ", "pins dagster-k8s==0.29.26, pyproject.toml's set needs"),
        # The Docker launcher's library left out of the lock.
        ("\ndagster-docker==0.29.27 ", "\n ", "does not pin dagster-docker"),
    ],
)  # fmt: skip
def test_a_different_dagster_set_in_the_lock_is_caught(
    dockerfile_text: str, lock_text: str, old: str, new: str, expected: str
) -> None:
    assert old in lock_text
    problems = pin_problems(dockerfile_text, dagster_pins(), lock_text.replace(old, new))
    assert any(expected in problem for problem in problems), problems


def test_the_instance_settings_equal_deploy_dagster_yaml(values: dict[str, Any], instance: dict[str, Any]) -> None:
    assert instance_problems(values, instance) == []


def test_a_changed_instance_number_is_named_by_its_key(values: dict[str, Any], instance: dict[str, Any]) -> None:
    changed = yaml.safe_load(yaml.safe_dump(values))
    changed["dagsterDaemon"]["runMonitoring"]["pollIntervalSeconds"] = 120
    changed["dagsterDaemon"]["runCoordinator"]["config"]["customRunCoordinator"]["config"]["dequeue_num_workers"] = 8
    del changed["concurrency"]["runs"]["maxConcurrentRuns"]
    assert instance_problems(changed, instance) == [
        "deploy/helm/values.yaml dagsterDaemon.runCoordinator.config.customRunCoordinator.config.dequeue_num_workers"
        " = 8, deploy/dagster.yaml run_coordinator.config.dequeue_num_workers = 2",
        "deploy/helm/values.yaml dagsterDaemon.runMonitoring.pollIntervalSeconds = 120,"
        " deploy/dagster.yaml run_monitoring.poll_interval_seconds = 5",
        "deploy/helm/values.yaml concurrency.runs.maxConcurrentRuns = '(not set)',"
        " deploy/dagster.yaml concurrency.runs.max_concurrent_runs = 8",
    ]


def test_the_code_location_is_pyprojects(
    values: dict[str, Any], dockerfile_text: str, pyproject: dict[str, Any]
) -> None:
    location = pyproject["tool"]["dagster"]
    deployment = the_deployment(values)
    args = deployment["dagsterApiGrpcArgs"]
    assert args == ["-m", location["module_name"]], (
        "deploy/helm/values.yaml dagster-user-deployments.deployments[0].dagsterApiGrpcArgs, pyproject [tool.dagster]"
    )
    # The chart names the Service and the location after the deployment; Kubernetes names allow no "_".
    assert deployment["name"] == location["code_location_name"].replace("_", "-"), (
        "deploy/helm/values.yaml dagster-user-deployments.deployments[0].name, pyproject code_location_name"
    )
    [command] = [arguments for keyword, arguments in dockerfile_instructions(dockerfile_text) if keyword == "CMD"]
    assert yaml.safe_load(command) == [
        "dagster",
        "api",
        "grpc",
        "-m",
        location["module_name"],
        "-h",
        "0.0.0.0",
        "-p",
        str(deployment["port"]),
    ], "deploy/container/Dockerfile CMD serves the module on the chart's port"


def test_the_chart_runs_several_replicas_with_the_k8s_launcher_on_external_postgres(
    values: dict[str, Any], instance: dict[str, Any]
) -> None:
    deployment = the_deployment(values)
    assert deployment["replicaCount"] >= 2, (
        "deploy/helm/values.yaml dagster-user-deployments.deployments[0].replicaCount"
    )
    # Replicas behind one Service must report one server id, and a new release must bring a new one.
    assert deployment["env"]["DAGSTER_CLI_API_GRPC_FIXED_SERVER_ID"] == str(deployment["image"]["tag"]), (
        "deploy/helm/values.yaml deployments[0].env.DAGSTER_CLI_API_GRPC_FIXED_SERVER_ID should equal image.tag"
    )
    assert deployment["includeConfigInLaunchedRuns"] == {"enabled": True}, (
        "deploy/helm/values.yaml dagster-user-deployments.deployments[0].includeConfigInLaunchedRuns"
    )
    assert values["runLauncher"]["type"] == "K8sRunLauncher", "deploy/helm/values.yaml runLauncher.type"
    postgresql = values["postgresql"]
    assert postgresql["enabled"] is False, "deploy/helm/values.yaml postgresql.enabled: Dagster's storage is external"
    scheme = instance["storage"]["postgres"]["postgres_db"]["scheme"]
    assert postgresql["postgresqlScheme"] == scheme, (
        "deploy/helm/values.yaml postgresql.postgresqlScheme, deploy/dagster.yaml storage.postgres.postgres_db.scheme"
    )
    assert values["generatePostgresqlPasswordSecret"] is False, (
        "deploy/helm/values.yaml generatePostgresqlPasswordSecret"
    )


def test_the_base_image_runs_a_python_pyproject_admits(dockerfile_text: str, pyproject: dict[str, Any]) -> None:
    requires_python = pyproject["project"]["requires-python"]
    assert base_images(dockerfile_text), "deploy/container/Dockerfile has no FROM"
    assert python_problems(dockerfile_text, requires_python) == []
    # The same check refuses a Python below the floor.
    assert python_problems("FROM python:3.10-slim\n", requires_python) == [
        f"deploy/container/Dockerfile: FROM python:3.10-slim, pyproject requires-python is {requires_python}"
    ]


def test_the_image_runs_as_a_non_root_user(dockerfile_text: str, values: dict[str, Any]) -> None:
    users = [arguments for keyword, arguments in dockerfile_instructions(dockerfile_text) if keyword == "USER"]
    assert users and users[-1] not in ("0", "root"), "deploy/container/Dockerfile USER"
    # A numeric uid lets the pod's runAsNonRoot be checked against the image.
    assert users[-1].isdigit(), "deploy/container/Dockerfile USER should be a numeric uid"
    assert the_deployment(values)["podSecurityContext"]["runAsNonRoot"] is True, (
        "deploy/helm/values.yaml dagster-user-deployments.deployments[0].podSecurityContext.runAsNonRoot"
    )


# --- deploy/size.py: the instance sized to its machine ---------------------------------------------


@pytest.fixture(scope="module")
def size_py() -> Iterator[Any]:
    spec = importlib.util.spec_from_file_location("deploy_size", ROOT / "deploy" / "size.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_shipped_instance_is_size_py_for_two_cores(size_py: Any) -> None:
    assert size_py.render(size_py.sizing(2)) == INSTANCE.read_text(encoding="utf-8")


def test_size_py_counts_the_sensors_the_project_defines(size_py: Any) -> None:
    from marketing_pipelines.definitions import defs

    # measurement_automation_sensor (declarative automation) is evaluated by the asset daemon, not on the sensor
    # daemon's threads that SENSORS sizes.
    evaluated_by_the_sensor_daemon = [
        s for s in defs().get_repository_def().sensor_defs if not isinstance(s, dg.AutomationConditionSensorDefinition)
    ]
    assert len(evaluated_by_the_sensor_daemon) == size_py.SENSORS


@pytest.mark.parametrize(
    ("cores", "max_connections", "expected"),
    [
        (1, None, (4, 2, 2)),
        (2, None, (8, 2, 4)),
        (8, None, (32, 8, 10)),
        (32, None, (128, 32, 10)),
        (8, 1000, (32, 8, 10)),
        # PostgreSQL's default 100 connections hold 7 run workers of 11 (a fifth kept for everything else).
        (32, 100, (7, 32, 10)),
        (2, 100, (7, 2, 4)),
    ],
)
def test_the_numbers_follow_the_cores_and_postgresql(
    size_py: Any, cores: int, max_connections: int | None, expected: tuple[int, int, int]
) -> None:
    size = size_py.sizing(cores, max_connections)
    assert (size.max_concurrent_runs, size.dequeue_num_workers, size.sensor_workers) == expected
    needed = size_py.connections_needed(size.max_concurrent_runs)
    assert max_connections is None or needed <= max_connections
    # What the table says a size needs is exactly what keeps it uncapped.
    assert size_py.sizing(cores, needed).max_concurrent_runs == size.max_concurrent_runs
    assert size_py.sizing(cores, needed - 1).max_concurrent_runs < size.max_concurrent_runs


def test_every_sizing_is_an_instance_dagster_accepts(size_py: Any, tmp_path: Path) -> None:
    from dagster._core.instance.config import dagster_instance_config

    for cores in (1, 2, 8, 32):
        (tmp_path / "dagster.yaml").write_text(size_py.render(size_py.sizing(cores)), encoding="utf-8")
        config, _ = dagster_instance_config(str(tmp_path))
        assert config["concurrency"]["runs"]["max_concurrent_runs"] == 4 * cores
        assert config["run_coordinator"]["config"]["dequeue_num_workers"] == max(2, cores)
        assert config["sensors"]["num_workers"] == min(2 * cores, 10)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--cores", "0"], "size.py: cores must be at least 1, got 0"),
        (["--cores", "4", "--pg-max-connections", "5"], "size.py: PostgreSQL max_connections must be at least 20"),
    ],
)
def test_size_py_refuses_a_nonsense_machine_in_one_line(
    size_py: Any, argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        size_py.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(expected) and err.count("\n") == 1


def test_a_moved_setting_stops_size_py_instead_of_printing_the_old_number(size_py: Any) -> None:
    template = INSTANCE.read_text(encoding="utf-8").replace("    max_concurrent_runs: 8\n", "    max_runs: 8\n")
    with pytest.raises(ValueError, match="expected one line matching"):
        size_py.render(size_py.sizing(8), template)


# ---- the Docker stack (deploy/docker/) ---------------------------------------------------------------

DOCKER_INSTANCE = ROOT / "deploy" / "docker" / "dagster.yaml"
DOCKER_SETTINGS = ROOT / "deploy" / "docker" / "settings.env"
COMPOSE = ROOT / "deploy" / "docker" / "compose.yaml"
# The storage's variables that are no secret; DAGSTER_PG_PASSWORD comes as a file, as every secret does.
STORAGE_VARIABLES = {"DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_USER", "DAGSTER_PG_DB"}


def run_container_variables() -> set[str]:
    """What a run container needs by name: every setting that is no secret, and the storage's address."""
    return {env_name(field) for field in Settings.model_fields if not is_secret(field)} | STORAGE_VARIABLES


def docker_instance_problems(docker_instance: Mapping[str, Any], instance: Mapping[str, Any]) -> list[str]:
    """How deploy/docker/dagster.yaml strays from deploy/dagster.yaml plus a DockerRunLauncher with names only."""
    where = "deploy/docker/dagster.yaml"
    launcher = docker_instance.get("run_launcher") or {}
    problems = []
    if (launcher.get("module"), launcher.get("class")) != ("dagster_docker", "DockerRunLauncher"):
        problems.append(f"{where} run_launcher is not dagster_docker.DockerRunLauncher")
    named = list((launcher.get("config") or {}).get("env_vars") or [])
    problems += [f"{where} env_vars gives {name.split('=')[0]} a value: name it only" for name in named if "=" in name]
    problems += [f"{where} env_vars names the secret {name}: it comes as a file" for name in named if name in secrets()]
    problems += [f"{where} env_vars lacks {name}" for name in sorted(run_container_variables() - set(named))]
    problems += [
        f"{where} env_vars names {name}, which the code does not read"
        for name in named
        if "=" not in name and name not in run_container_variables() | secrets()
    ]
    # The launcher and the compute logs are the stack's own (compute_log_problems checks the latter).
    rest = {key: value for key, value in docker_instance.items() if key not in ("run_launcher", "compute_logs")}
    expected = yaml.safe_load(yaml.safe_dump(dict(instance)))
    expected["run_monitoring"]["max_resume_run_attempts"] = 0
    problems += [
        f"{where} {key} differs from deploy/dagster.yaml's"
        for key in sorted(set(rest) | set(expected))
        if rest.get(key) != expected.get(key)
    ]
    return problems


COMPUTE_LOG_MANAGERS = {
    ("dagster.core.storage.local_compute_log_manager", "LocalComputeLogManager"),
    ("dagster._core.storage.local_compute_log_manager", "LocalComputeLogManager"),
}
# The stack's processes that read or write the compute logs: the webserver shows them, the daemon's instance
# names them, a code server's instance too.
LOG_READERS = ("webserver", "daemon", "code_server_1", "code_server_2")


def compute_log_problems(docker_instance: Mapping[str, Any], compose: Mapping[str, Any]) -> list[str]:
    """Ways a run's stdout and stderr could end with its container, or be out of the webserver's reach."""
    where = "deploy/docker/dagster.yaml"
    manager = docker_instance.get("compute_logs") or {}
    if (manager.get("module"), manager.get("class")) not in COMPUTE_LOG_MANAGERS:
        return [f"{where} compute_logs is not Dagster's LocalComputeLogManager"]
    base_dir = (manager.get("config") or {}).get("base_dir")
    kwargs = docker_instance["run_launcher"]["config"].get("container_kwargs") or {}
    mounted = {volume.split(":")[1]: volume.split(":") for volume in kwargs.get("volumes") or []}
    if base_dir not in mounted or mounted[base_dir][-1] == "ro":
        return [f"{where} run containers do not mount a volume at compute_logs.base_dir {base_dir} to write"]
    volume = mounted[base_dir][0]
    keys = [key for key, spec in (compose.get("volumes") or {}).items() if (spec or {}).get("name") == volume]
    if not keys:
        return [f"deploy/docker/compose.yaml has no volume named {volume} (the run containers' compute logs)"]
    return [
        f"deploy/docker/compose.yaml {service} does not mount {volume} at {base_dir}"
        for service in LOG_READERS
        if f"{keys[0]}:{base_dir}" not in compose["services"][service].get("volumes", [])
    ]


def secrets() -> set[str]:
    """Every variable shown by its name only (settings.is_secret), and the storage's password."""
    return {env_name(field) for field in Settings.model_fields if is_secret(field)} | {"DAGSTER_PG_PASSWORD"}


def _env_vars(docker_instance: dict[str, Any]) -> list[str]:
    return docker_instance["run_launcher"]["config"]["env_vars"]


@pytest.fixture(scope="module")
def docker_instance() -> dict[str, Any]:
    return yaml.safe_load(DOCKER_INSTANCE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))


def test_the_runs_compute_logs_outlive_their_containers(
    docker_instance: dict[str, Any], compose: dict[str, Any]
) -> None:
    assert compute_log_problems(docker_instance, compose) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # Dagster's default: the logs in DAGSTER_HOME, inside each run's container.
        (lambda i, c: i.pop("compute_logs"), "compute_logs is not Dagster's LocalComputeLogManager"),
        # A folder the run containers do not mount: the logs go with the container.
        (lambda i, c: i["compute_logs"]["config"].update(base_dir="/tmp/logs"), "run containers do not mount"),
        # The webserver without the volume: "View stdout/stderr" is empty.
        (lambda i, c: c["services"]["webserver"]["volumes"].pop(3), "webserver does not mount marketing-compute-logs"),
        # The stack's volume under another name than the run containers'.
        (lambda i, c: c["volumes"]["compute-logs"].update(name="logs"), "has no volume named marketing-compute-logs"),
    ],
)  # fmt: skip
def test_compute_logs_out_of_the_webservers_reach_are_caught(
    docker_instance: dict[str, Any], compose: dict[str, Any], edit: Any, expected: str
) -> None:
    changed_instance, changed_compose = yaml.safe_load(yaml.safe_dump(docker_instance)), copy.deepcopy(compose)
    edit(changed_instance, changed_compose)
    assert any(expected in problem for problem in compute_log_problems(changed_instance, changed_compose))


def test_the_docker_instance_is_the_shipped_one_with_a_launcher_given_names_only(
    docker_instance: dict[str, Any], instance: dict[str, Any]
) -> None:
    assert docker_instance_problems(docker_instance, instance) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: _env_vars(c).append("ANTHROPIC_API_KEY"), "names the secret"),
        (lambda c: _env_vars(c).append("DAGSTER_PG_PASSWORD=x"), "gives DAGSTER_PG_PASSWORD a value"),
        (lambda c: _env_vars(c).remove("MARKETING_EXECUTIONS_PER_RUN"), "lacks MARKETING_EXECUTIONS_PER_RUN"),
        (lambda c: _env_vars(c).append("MARKETING_BATCH"), "MARKETING_BATCH, which the code does not"),
        (lambda c: c["concurrency"]["runs"].update(max_concurrent_runs=9), "concurrency differs"),
    ],
)  # fmt: skip
def test_a_stray_docker_instance_is_caught(
    docker_instance: dict[str, Any], instance: dict[str, Any], edit: Any, expected: str
) -> None:
    changed = yaml.safe_load(yaml.safe_dump(docker_instance))
    edit(changed)
    assert any(expected in problem for problem in docker_instance_problems(changed, instance))


def test_the_stack_settings_file_names_every_setting_a_run_needs_and_no_secret() -> None:
    # The DockerRunLauncher stops a launch when a variable its env_vars names is not set in the daemon.
    lines = [line for line in DOCKER_SETTINGS.read_text(encoding="utf-8").splitlines() if not line.startswith("#")]
    given = [line.split("=")[0] for line in lines if line.strip()]
    assert sorted(given) == sorted(run_container_variables()), set(given) ^ run_container_variables()


# ---- Dagster's tick retention, in every shipped instance ----------------------------------------------

# Every dagster.yaml the project ships: `dagster dev`'s, the several machines' (size.py prints it), the Docker stack's.
SHIPPED_INSTANCES = {
    "dagster.yaml": ROOT / "dagster.yaml",
    "deploy/dagster.yaml": INSTANCE,
    "deploy/docker/dagster.yaml": DOCKER_INSTANCE,
}


def retention_problems(where: str, instance_text: str, folder: Path) -> list[str]:
    """Each kind of tick an instance lets Dagster keep forever, read as the daemon reads the file's `retention`."""
    from dagster._core.definitions.run_request import InstigatorType
    from dagster._core.instance.config import (
        dagster_instance_config,
        get_default_tick_retention_settings,
        get_tick_retention_settings,
    )

    (folder / "dagster.yaml").write_text(instance_text, encoding="utf-8")
    config, _ = dagster_instance_config(str(folder))  # also refuses a block Dagster's schema does not accept
    retention = config.get("retention") or {}
    problems = []
    for kind, key in ((InstigatorType.SENSOR, "sensor"), (InstigatorType.SCHEDULE, "schedule")):
        days = get_tick_retention_settings(retention.get(key), get_default_tick_retention_settings(kind))
        problems += [f"{where}: {key} ticks {s.value} are kept forever" for s, d in days.items() if d <= 0]
    return problems


@pytest.mark.parametrize("where", SHIPPED_INSTANCES)
def test_every_shipped_instance_purges_every_kind_of_tick(where: str, tmp_path: Path) -> None:
    text = SHIPPED_INSTANCES[where].read_text(encoding="utf-8")
    assert retention_problems(where, text, tmp_path) == []
    # One block, the same in each (the Docker one is held to deploy/dagster.yaml key by key above).
    assert yaml.safe_load(text)["retention"] == yaml.safe_load(INSTANCE.read_text(encoding="utf-8"))["retention"]


def test_every_sizing_keeps_the_retention(size_py: Any, tmp_path: Path) -> None:
    for cores in (1, 8, 32):
        assert retention_problems(f"size.py --cores {cores}", size_py.render(size_py.sizing(cores)), tmp_path) == []


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        # No block: Dagster's defaults keep all but a sensor's skipped ticks forever.
        (
            lambda text: text[: text.index("\n# Dagster's own history")] + "\n",
            [f"x: sensor ticks {s} are kept forever" for s in ("STARTED", "SUCCESS", "FAILURE")]
            + [f"x: schedule ticks {s} are kept forever" for s in ("STARTED", "SKIPPED", "SUCCESS", "FAILURE")],
        ),
        # -1 is Dagster's "keep".
        (
            lambda text: text.replace("      skipped: 1\n", "      skipped: -1\n"),
            ["x: sensor ticks SKIPPED are kept forever"],
        ),
    ],
)  # fmt: skip
def test_an_instance_that_keeps_ticks_is_caught(edit: Any, expected: list[str], tmp_path: Path) -> None:
    assert retention_problems("x", edit(INSTANCE.read_text(encoding="utf-8")), tmp_path) == expected


def test_a_changed_retention_in_the_helm_values_is_named(values: dict[str, Any], instance: dict[str, Any]) -> None:
    changed = yaml.safe_load(yaml.safe_dump(values))
    changed["retention"]["sensor"]["purgeAfterDays"]["skipped"] = 7
    assert instance_problems(changed, instance) == [
        "deploy/helm/values.yaml retention.sensor.purgeAfterDays.skipped = 7,"
        " deploy/dagster.yaml retention.sensor.purge_after_days.skipped = 1"
    ]
    changed["retention"]["enabled"] = False
    assert "deploy/helm/values.yaml retention.enabled = False, deploy/dagster.yaml retention (present) = True" in (
        instance_problems(changed, instance)
    )
