"""One word, one meaning: no two module-level classes or type aliases in the package share a name,
so a name read in one module means what it means in any other (``Event`` is the progress event,
never also an allocator's request)."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "batchfit"

#: The calls whose result, bound to a name, is a type.
TYPE_FACTORIES = {"TypeVar", "NewType", "NamedTuple", "TypedDict", "ParamSpec"}


def _is_type_expression(value: ast.expr) -> bool:
    """Whether a module-level assignment's value reads as a type: ``tuple[int, int]``,
    ``Literal["a", "b"]``, ``int | None``, ``TypeVar("T")``; not ``2**20`` nor a call of a function."""
    if isinstance(value, ast.Subscript):
        return isinstance(value.value, ast.Name | ast.Attribute)
    if isinstance(value, ast.BinOp):
        return isinstance(value.op, ast.BitOr)
    if isinstance(value, ast.Call):
        called = value.func
        name = called.id if isinstance(called, ast.Name) else getattr(called, "attr", "")
        return name in TYPE_FACTORIES
    return False


def _is_type_name(name: str) -> bool:
    """CamelCase (``Segments``, ``_Check``), as a type is named; not a constant (``MAX_TRIALS``)."""
    bare = name.lstrip("_")
    return bare[:1].isupper() and not bare.isupper()


def declared_types(tree: ast.Module) -> list[str]:
    """The module-level classes and type aliases a module declares (``X = tuple[...]``,
    ``X: TypeAlias = ...``, ``type X = ...``)."""
    names = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            names.append(node.name)
        elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12)
            names.append(node.name.id)  # type: ignore[attr-defined]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if ast.unparse(node.annotation).endswith("TypeAlias"):
                names.append(node.target.id)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and _is_type_name(target.id) and _is_type_expression(node.value):
                names.append(target.id)
    return names


def declarations(package: Path) -> dict[str, list[str]]:
    """Each type name declared in ``package``, with the modules (paths under it) that declare it."""
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        for name in declared_types(ast.parse(path.read_text(), filename=str(path))):
            where[name].append(path.relative_to(package).as_posix())
    return where


def test_no_two_classes_or_type_aliases_in_the_package_share_a_name() -> None:
    shared = {name: modules for name, modules in declarations(PACKAGE).items() if len(modules) > 1}
    listed = "; ".join(f"{name} in {', '.join(modules)}" for name, modules in sorted(shared.items()))
    assert not shared, (
        f"{len(shared)} type name(s) declared in more than one module: {listed}. One name means one "
        f"thing across batchfit; rename one of each pair to say what it is (as AllocatorEvent beside "
        f"the progress Event)."
    )


@pytest.mark.parametrize(
    ("source", "declared"),
    [
        ("class Event:\n    pass\n", ["Event"]),
        ("AllocatorEvent = tuple[int, int]\n", ["AllocatorEvent"]),
        ('Mode = Literal["train", "eval"]\n', ["Mode"]),
        ("BlockState = bool | None\n", ["BlockState"]),
        ("Losses: TypeAlias = list[int]\n", ["Losses"]),
        ('Item = TypeVar("Item")\n', ["Item"]),
        ("MiB = 2**20\nMAX_TRIALS = 4\nEXAMPLES = {}\nlimit = tuple[int]\n", []),
        ("def helper():\n    class Inner:\n        pass\n", []),
    ],
)
def test_the_walk_reads_classes_and_type_aliases_but_not_constants(source: str, declared: list[str]) -> None:
    assert declared_types(ast.parse(source)) == declared


def test_the_walk_finds_the_package_s_own_types() -> None:
    found = declarations(PACKAGE)
    assert found["Event"] == ["progress.py"]
    assert found["AllocatorEvent"] == ["policy/allocator/allocation_record.py"]
    assert found["SafeBand"] == ["policy/search/safe_band.py"]
