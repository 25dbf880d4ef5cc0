"""The shape of the code, measured: for ``src/batchfit`` and ``bench`` apart, the modules and their
lines, the modules over 300 lines, the functions over 60, the signatures over 8 parameters, each with
its worst; then the comments that cite past runs, and the README's length.

    python bench/structure.py [--root .]

The limits are the house style's (docs: a function over about 60 lines, a signature over about 8
parameters, a module over 300 lines), so a change's before and after can be compared. A signature
counts every function's parameters but ``self`` and ``cls``, ``__init__``'s included.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

#: The house style's limits: lines of a module, lines of a function, parameters of a signature.
MODULE_LINES, FUNCTION_LINES, PARAMETERS = 300, 60, 8
#: The trees measured, from the repository's root, each with the folders left out of it.
TREES = {"src": ("src/batchfit", ()), "bench": ("bench", ("data", "results"))}

#: A comment or docstring that cites a past run: a GPU's name, a date, a count of trials or runs
#: measured once ("took 13 trials", "1 run in 4", "in 5 of 6").
PAST_RUN = re.compile(
    r"\b(H100|H200|A100)\b|\b20\d\d-\d\d-\d\d\b|\btook \d|\btrials each\b"
    r"|\b1 (run|exit) in \d|\bin \d+ of \d+\b"
)

Function = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Shape:
    """One tree's figures: (size, where) for every module, function and signature."""

    modules: list[tuple[int, str]] = field(default_factory=list)
    functions: list[tuple[int, str]] = field(default_factory=list)
    signatures: list[tuple[int, str]] = field(default_factory=list)

    def over(self) -> dict[str, list[tuple[int, str]]]:
        """The modules, functions and signatures over the limits, largest first."""
        return {
            f"modules over {MODULE_LINES} lines": _above(self.modules, MODULE_LINES),
            f"functions over {FUNCTION_LINES} lines": _above(self.functions, FUNCTION_LINES),
            f"signatures over {PARAMETERS} parameters": _above(self.signatures, PARAMETERS),
        }


def _above(sizes: list[tuple[int, str]], limit: int) -> list[tuple[int, str]]:
    return sorted((entry for entry in sizes if entry[0] > limit), reverse=True)


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Function]]:
    """Every function in ``tree`` with its qualified name (``Class.method``, ``outer.inner``)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def parameters(node: Function) -> int:
    arguments = node.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    count = len([argument for argument in named if argument.arg not in ("self", "cls")])
    return count + (arguments.vararg is not None) + (arguments.kwarg is not None)


def sources(root: Path, tree: str) -> Iterator[tuple[str, str]]:
    """Each Python file of a tree (``TREES``) as (its path from the tree, its text)."""
    folder, skipped = TREES[tree]
    base = root / folder
    for path in sorted(base.rglob("*.py")):
        name = path.relative_to(base)
        if name.parts[0] not in skipped:
            yield str(name), path.read_text()


def measure(root: Path, tree: str) -> Shape:
    shape = Shape()
    for name, source in sources(root, tree):
        shape.modules.append((len(source.splitlines()), name))
        for qualified, node in functions(ast.parse(source)):
            shape.functions.append((node.end_lineno - node.lineno + 1, f"{name}:{qualified}"))  # type: ignore[operator]
            shape.signatures.append((parameters(node), f"{name}:{qualified}"))
    return shape


def report(tree: str, shape: Shape) -> str:
    """A tree's figures: its modules and lines, then each limit's count with its worst entries."""
    lines = sum(size for size, _ in shape.modules)
    said = [f"{tree}: {len(shape.modules)} modules, {lines} lines"]
    for what, entries in shape.over().items():
        said.append(f"  {what}: {len(entries)}")
        said += [f"    {size:4d}  {where}" for size, where in entries[:5]]
    for what, sizes in (("longest function", shape.functions), ("widest signature", shape.signatures)):
        size, where = max(sizes)
        said.append(f"  {what}: {size}  {where}")
    return "\n".join(said)


def past_runs(source: str) -> list[str]:
    """Comments and docstrings that cite a past run."""
    found = [
        token.string
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT and PAST_RUN.search(token.string)
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node)
            if docstring and PAST_RUN.search(docstring):
                found.append(docstring.splitlines()[0])
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    for tree in TREES:
        print(report(tree, measure(args.root, tree)))
    cited = [(name, text) for name, source in sources(args.root, "src") for text in past_runs(source)]
    print(f"comments and docstrings in src citing past runs: {len(cited)}")
    print("".join(f"  {where}: {text.strip()[:90]}\n" for where, text in cited), end="")
    readme = args.root / "README.md"
    print(f"README lines: {len(readme.read_text().splitlines())}")


if __name__ == "__main__":
    main()
