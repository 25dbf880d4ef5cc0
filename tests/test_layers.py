"""The architecture, checked: the policies are free of torch and of the layers above them, the
command line reaches only the public API, and no two modules import each other (directly or
round a circle)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from test_public_api import from_their_modules

import batchfit

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "batchfit"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in PACKAGE.rglob("*.py")}


def imports(name: str, top_level_only: bool) -> set[str]:
    """The modules ``name`` imports (at its top level only, or anywhere, lazily too)."""
    tree = ast.parse(MODULES[name].read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            # ``from batchfit.cli import flags`` imports the submodule batchfit.cli.flags (the
            # package is initialised on the way, as for any submodule).
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & set(MODULES)
            found |= submodules or {node.module}
    return found


def reachable(name: str) -> set[str]:
    """Every module ``name`` imports, following batchfit's own modules (lazy imports included)."""
    seen, todo = set(), [name]
    while todo:
        for imported in imports(todo.pop(), top_level_only=False):
            if imported not in seen:
                seen.add(imported)
                if imported in MODULES:
                    todo.append(imported)
    return seen


POLICIES = sorted(name for name in MODULES if name.startswith("batchfit.policy"))


@pytest.mark.parametrize("name", POLICIES)
def test_a_policy_imports_no_torch_and_no_layer_above_it(name: str) -> None:
    below = reachable(name)
    assert not {imported for imported in below if imported.split(".")[0] == "torch"}
    allowed = ("batchfit.policy", "batchfit.checks", "batchfit.errors", "batchfit.units", "batchfit.result")
    assert {imported for imported in below if imported.startswith("batchfit")} <= {
        imported for imported in below if imported.startswith(allowed)
    }


def test_the_runtime_does_not_reach_up_to_the_verbs_or_the_cli() -> None:
    for name in MODULES:
        if name.startswith("batchfit.runtime"):
            above = {
                m
                for m in reachable(name)
                if m.startswith("batchfit")
                and not m.startswith(
                    (
                        "batchfit.runtime",
                        "batchfit.policy",
                        "batchfit.checks",
                        "batchfit.errors",
                        "batchfit.units",
                        "batchfit.result",
                    )
                )
            }
            assert not above, (name, above)


def test_no_import_circles() -> None:
    graph = {name: {m for m in imports(name, top_level_only=False) if m in MODULES} for name in MODULES}
    circles = []
    for start in graph:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start and not (start == "batchfit" or (len(path) == 1 and nxt == node)):
                    circles.append([*path, nxt])
                elif nxt not in path and nxt != "batchfit":
                    stack.append((nxt, [*path, nxt]))
    assert circles == []


def imported_names(name: str) -> set[tuple[str, str]]:
    """(module, name) for each ``from module import name`` in module ``name``, lazy ones too."""
    tree = ast.parse(MODULES[name].read_text())
    return {
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


@pytest.mark.parametrize("name", sorted(name for name in MODULES if name.startswith("batchfit.cli")))
def test_the_cli_reaches_only_the_public_api(name: str) -> None:
    # What the command line may import of batchfit: the package's public names, the report, its own
    # modules, and a name docs/api.md sends to its module (imported from there).
    inside = {
        imported
        for imported in imports(name, top_level_only=False)
        if imported.split(".")[0] == "batchfit" and not imported.startswith("batchfit.cli")
    }
    homes = from_their_modules()
    allowed = {"batchfit", "batchfit.report", *homes}
    assert inside <= allowed, inside - allowed
    names = {
        (module, imported)
        for module, imported in imported_names(name)
        if module == "batchfit" or module in homes
    }
    assert {
        (module, imported)
        for module, imported in names
        if imported not in (batchfit.__all__ if module == "batchfit" else homes[module])
    } == set()


def test_the_core_never_imports_an_integration_or_the_trainers_they_adapt() -> None:
    # The adapters are imported from their own modules, each needing its extra: a user without
    # Lightning or transformers imports and runs everything else. No core module imports one
    # (lazily neither), so none reaches one through another.
    trainers = ("lightning", "pytorch_lightning", "transformers", "accelerate")
    core = [name for name in MODULES if not name.startswith("batchfit.integrations")]
    found = {
        name: sorted(
            imported
            for imported in imports(name, top_level_only=False)
            if imported.startswith("batchfit.integrations") or imported.split(".")[0] in trainers
        )
        for name in core
    }
    assert {name: modules for name, modules in found.items() if modules} == {}


def test_the_options_are_pure_data_importing_no_algorithm_and_no_torch() -> None:
    # Loaded alone (the package's __init__, which imports every verb, left out): what options.py
    # itself brings in when it runs, its annotations' names (torch, NoiseScale) unimported.
    code = (
        "import importlib, sys, types\n"
        f"package = types.ModuleType('batchfit'); package.__path__ = [{str(PACKAGE)!r}]\n"
        "sys.modules['batchfit'] = package\n"
        "importlib.import_module('batchfit.options')\n"
        "print(*sorted(m for m in sys.modules if m.split('.')[0] in ('batchfit', 'torch')))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(ran.stdout.split()) == {
        "batchfit",
        "batchfit.checks",
        "batchfit.errors",
        "batchfit.options",
        "batchfit.units",
    }
