"""The architecture, checked: the policies are free of torch and of the layers above them, the
command line reaches only the public API, and no two modules import each other (directly or
round a circle)."""

from __future__ import annotations

import ast
import inspect
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


def room_of(module: str) -> str:
    """The room a module lives in: ``policy.<room>`` below the policies, else its top-level name."""
    parts = module.split(".")
    if len(parts) > 2 and parts[1] == "policy":
        return f"policy.{parts[2]}"
    return parts[1] if len(parts) > 1 else ""


def rooms_imported(prefix: str) -> dict[str, set[str]]:
    """For each room under ``prefix``, the other rooms its modules import (lazily too)."""
    found: dict[str, set[str]] = {}
    for name in MODULES:
        room = room_of(name)
        if name.count(".") >= 2 and room.startswith(prefix):
            found.setdefault(room, set()).update(
                room_of(imported)
                for imported in imports(name, top_level_only=False)
                if imported.startswith("batchfit.") and room_of(imported) != room
            )
    return found


def test_each_policy_room_imports_only_the_rooms_its_package_names() -> None:
    # policy/__init__.py says, room by room, which other rooms each reads: "- ``plan``: ... (noise,
    # explore)." The imports hold to it, so the rooms stack without a circle.
    said = {
        f"policy.{line.split('``')[1]}": {
            f"policy.{room}" for room in line.rsplit("(", 1)[1].split(")")[0].split(", ") if room != "none"
        }
        for line in (batchfit.policy.__doc__ or "").replace("\n  ", " ").splitlines()
        if line.startswith("- ``")
    }
    assert set(said) == {room for room in rooms_imported("policy.")}
    shared = {"checks", "errors", "units", "result"}
    assert {room: found - shared for room, found in rooms_imported("policy.").items()} == said


#: The verbs' rooms each verb room may read (the shared modules, the policies and the runtime aside):
#: the checklist runs the other verbs, compare and explore find their sizes, a search may start from
#: a saved prediction.
VERB_ROOMS = {
    "advice": {"comparison", "data_check", "exploration", "search"},
    "analysis": {"search"},
    "comparison": {"exploration", "search"},
    "data_check": set(),
    "exploration": {"search"},
    "fit_check": {"search"},
    "noise": set(),
    "prediction": set(),
    "search": {"prediction"},
    "training_loop": set(),
}


def test_each_verb_room_reads_only_the_verb_rooms_it_builds_on() -> None:
    below = {"policy", "runtime", "checks", "errors", "units", "result", "options", "where", "progress"}
    found = {
        room: {other for other in imported if other.split(".")[0] not in below}
        for room, imported in rooms_imported("").items()
        if room in VERB_ROOMS
    }
    assert found == VERB_ROOMS


def test_a_room_opens_with_what_it_owns_and_defines_nothing_itself() -> None:
    # A room's __init__ is its docstring alone: it re-exports nothing, so a verb (``batchfit.advise``,
    # the function) never hides the module of its name, and every name has one home.
    rooms = [PACKAGE / room.replace(".", "/") / "__init__.py" for room in rooms_imported("")]
    rooms = [path for path in rooms if path.parent.name in VERB_ROOMS or path.parent.parent.name == "policy"]
    assert len(rooms) == len(VERB_ROOMS) + 6
    for path in rooms:
        body = ast.parse(path.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), path
        assert isinstance(body[0].value, ast.Constant) and len(body[0].value.value) > 60, path
    top_level = {path.stem if path.is_file() else path.name for path in PACKAGE.iterdir()}
    assert set(batchfit.__all__) & top_level == set()


def test_each_verb_lives_in_the_module_of_its_name() -> None:
    # cap_memory, load_workload and load_config are helpers of the verbs, not verbs.
    helpers = {"cap_memory", "load_workload", "load_config"}
    functions = [getattr(batchfit, name) for name in batchfit.__all__ if name not in helpers]
    functions = [verb for verb in functions if inspect.isfunction(verb)]
    assert len(functions) == 11
    assert {
        verb.__name__: verb.__module__.rsplit(".", 1)[1]
        for verb in functions
        if verb.__name__ != verb.__module__.rsplit(".", 1)[1]
    } == {}
