"""The shape of the code, measured: the longest functions, the largest signatures, the module
sizes, the comments that cite past runs, and the README's length.

    python bench/structure.py [--root .]

Prints the figures the house style sets limits on (a function over about 60 lines, a signature
over about 8 parameters, a module over 300 lines) so a change's before and after can be compared.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import tokenize
from pathlib import Path

#: A comment or docstring that cites a past run: a GPU's name, a date, a count of trials or runs
#: measured once ("took 13 trials", "1 run in 4", "in 5 of 6").
PAST_RUN = re.compile(
    r"\b(H100|H200|A100)\b|\b20\d\d-\d\d-\d\d\b|\btook \d|\btrials each\b|\b1 (run|exit) in \d|\bin \d+ of \d+\b"
)


def functions(tree: ast.AST) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [node for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    arguments = node.args
    named = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
    count = len([argument for argument in named if argument.arg not in ("self", "cls")])
    return count + (arguments.vararg is not None) + (arguments.kwarg is not None)


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
    package = args.root / "src" / "batchfit"
    lengths, signatures, sizes, cited = [], [], [], []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        name = str(path.relative_to(package))
        sizes.append((len(source.splitlines()), name))
        cited += [(name, text) for text in past_runs(source)]
        for node in functions(ast.parse(source)):
            lengths.append((node.end_lineno - node.lineno + 1, f"{name}:{node.name}"))  # type: ignore[operator]
            if not node.name.startswith("_"):
                signatures.append((parameters(node), f"{name}:{node.name}"))
    lengths.sort(reverse=True)
    signatures.sort(reverse=True)
    sizes.sort(reverse=True)
    print(f"functions over 60 lines: {sum(n > 60 for n, _ in lengths)}; longest:")
    print("".join(f"  {n:4d}  {where}\n" for n, where in lengths[:5]), end="")
    print(f"public signatures over 8 parameters: {sum(n > 8 for n, _ in signatures)}; largest:")
    print("".join(f"  {n:4d}  {where}\n" for n, where in signatures[:5]), end="")
    print(f"modules over 300 lines: {sum(n > 300 for n, _ in sizes)} of {len(sizes)}; largest:")
    print("".join(f"  {n:4d}  {where}\n" for n, where in sizes[:5]), end="")
    print(f"comments and docstrings citing past runs: {len(cited)}")
    print("".join(f"  {where}: {text.strip()[:90]}\n" for where, text in cited), end="")
    readme = args.root / "README.md"
    print(f"README lines: {len(readme.read_text().splitlines())}")


if __name__ == "__main__":
    main()
