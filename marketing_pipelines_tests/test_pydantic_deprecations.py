"""No deprecated pydantic API on the settings path, and resource fields derived from settings as before.

pydantic deprecates some API at run time (a DeprecationWarning when called) and some only for type checkers
(``FieldInfo.merge_field_infos`` since 2.12: ``@deprecated(..., category=None)``, no warning at run time,
removal announced). The first is caught by loading the definitions with DeprecationWarning as an error;
the second by reading the package's source for pydantic names that carry ``__deprecated__``.
"""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pydantic_settings import NoDecode

import marketing_pipelines.definitions  # noqa: F401  (every resource class defined)
from marketing_pipelines.settings import _SETTING, Settings, env_name, settings_of
from marketing_pipelines_tests.processes import REPO_ROOT, child_env

PACKAGE = REPO_ROOT / "marketing_pipelines"
# Dagster's own pydantic compatibility layer reads `__fields__` when it builds a resource: Dagster's to fix,
# and ignored only where it is raised.
DAGSTER_FIELDS = (
    "ignore:The `__fields__` attribute is deprecated:DeprecationWarning:"
    "dagster_shared.dagster_model.pydantic_compat_layer"
)


def pydantic_names(tree: ast.Module) -> dict[str, Any]:
    """Each name a module binds by importing from pydantic or pydantic_settings -> the object it is."""
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.split(".")[0] in ("pydantic", "pydantic_settings")
        ):
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name)
    return names


def deprecated_uses(source: str) -> Iterator[str]:
    """``name.attr`` chains rooted at a pydantic import, or such names alone, that pydantic marks deprecated."""
    tree = ast.parse(source)
    names = pydantic_names(tree)
    for node in ast.walk(tree):
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.insert(0, node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in names:
            continue
        target = names[node.id]
        for i, attribute in enumerate([None, *chain]):
            if attribute is not None:
                target = getattr(target, attribute, None)
            if getattr(target, "__deprecated__", None) is not None:
                yield ".".join([node.id, *chain[:i]])
                break


def test_the_definitions_load_with_deprecation_warnings_as_errors(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-W", "error::DeprecationWarning", "-W", DAGSTER_FIELDS),
            *("-c", "import marketing_pipelines.definitions as d; d.defs()"),
        ],
        cwd=tmp_path,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]


def test_the_package_uses_no_pydantic_api_marked_deprecated() -> None:
    found = {
        f"{path.relative_to(REPO_ROOT)}: {use}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for use in deprecated_uses(path.read_text(encoding="utf-8"))
    }
    assert found == set()


def test_the_check_finds_a_deprecation_only_type_checkers_see() -> None:
    # merge_field_infos warns nothing at run time: only its __deprecated__ marks it.
    old = "from pydantic.fields import FieldInfo\nfield = FieldInfo.merge_field_infos(info, default=1)\n"
    assert list(deprecated_uses(old)) == ["FieldInfo.merge_field_infos"]


def _setting_fields() -> Iterator[tuple[str, str, str]]:
    """(resource class, field, setting) of every resource field declared with ``setting_field``."""

    def walk(cls: type) -> Iterator[type]:
        for sub in cls.__subclasses__():
            yield sub
            yield from walk(sub)

    for cls in walk(dg.ConfigurableResource):
        if cls.__module__.startswith("marketing_pipelines."):
            for field, setting in settings_of(cls).items():
                yield f"{cls.__module__}.{cls.__qualname__}", field, setting


@pytest.mark.parametrize(("resource", "field", "setting"), sorted(set(_setting_fields())))
def test_a_resource_field_is_its_setting_under_its_own_name(resource: str, field: str, setting: str) -> None:
    module, _, name = resource.rpartition(".")
    info = getattr(importlib.import_module(module), name).model_fields[field]
    source = Settings.model_fields[setting]
    default = list(source.default) if isinstance(source.default, tuple) else source.default
    assert (info.default, info.json_schema_extra) == (default, {_SETTING: setting})
    assert info.description is not None and info.description.startswith(
        f"{source.description} Env var: {env_name(setting)}"
    )
    # The bounds as the setting's, compared by repr (the object pattern= makes has no ==); NoDecode only says
    # how the environment variable is parsed.
    assert [repr(m) for m in info.metadata if m is not NoDecode] == [
        repr(m) for m in source.metadata if m is not NoDecode
    ]
    assert {info.alias, info.validation_alias, info.serialization_alias, info.alias_priority} == {None}
