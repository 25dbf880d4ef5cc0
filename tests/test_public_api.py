"""The public API is the list docs/api.md opens with: ``batchfit.__all__`` equals it, name for name
and in order, every name in it imports from ``batchfit``, and every name the page sends to its own
module imports from there (and is not also public)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

import batchfit

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def section(heading: str) -> str:
    """The text under ``## heading`` in docs/api.md, up to the next ``## ``."""
    text = API_PAGE.read_text()
    start = text.index(f"\n## {heading}\n") + len(heading) + 5
    end = text.find("\n## ", start)
    return text[start : end if end != -1 else len(text)]


def public_names() -> list[str]:
    """The names the bullets of "The public names" list, in order; what a bullet says in
    parentheses (``Sampling`` (``noise_scale``'s)) names no public name."""
    bullets = [line for line in section("The public names").splitlines() if line.startswith(("- ", "  "))]
    text = re.sub(r"\([^)]*\)", "", " ".join(bullets))
    return re.findall(r"`(\w+)`", text)


def from_their_modules() -> dict[str, set[str]]:
    """Module -> the names "Imported from their modules" says to import from it."""
    found: dict[str, set[str]] = {}
    for module, names in re.findall(
        r"`from (batchfit[\w.]*) import ([\w, ]+)`", section("Imported from their modules")
    ):
        found.setdefault(module, set()).update(name.strip() for name in names.split(","))
    return found


def test_the_public_names_are_the_list_docs_api_md_opens_with() -> None:
    listed = public_names()
    assert len(listed) == len(set(listed)), "a name is listed twice"
    assert batchfit.__all__ == listed


def test_every_public_name_imports_from_batchfit() -> None:
    star: dict[str, object] = {}
    exec("from batchfit import *", star)
    assert set(star) - {"__builtins__"} == set(batchfit.__all__)
    for name in batchfit.__all__:
        assert getattr(batchfit, name) is star[name]


@pytest.mark.parametrize("module", sorted(from_their_modules()))
def test_a_name_sent_to_its_module_imports_from_there_and_is_not_public(module: str) -> None:
    names = from_their_modules()[module]
    imported = importlib.import_module(module)
    assert {name for name in names if not hasattr(imported, name)} == set()
    assert names & set(batchfit.__all__) == set()
