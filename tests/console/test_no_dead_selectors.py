"""Every public read query of the console has a caller: a selector nobody calls is dead code
that still has to be kept right through every schema change."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path

import console.selectors

PACKAGE = Path(console.selectors.__file__).parent
ROOT = PACKAGE.parent.parent


def _page_modules() -> list:
    return [
        importlib.import_module(f"console.selectors.{info.name}")
        for info in pkgutil.iter_modules([str(PACKAGE)])
    ]


def _callers() -> set[str]:
    """Names imported from a `console.selectors` page module or read as `selectors.x` anywhere
    in the console (and the benchmarks), and names the page modules themselves call."""
    used: set[str] = set()
    for path in [*(ROOT / "console").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "console.selectors"
            ):
                used |= {alias.name for alias in node.names}
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "selectors"
            ):
                used.add(node.attr)
            elif (
                path.parent == PACKAGE
                and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
            ):
                used.add(node.func.id)
    return used


def test_the_selectors_are_split_by_page():
    assert len(_page_modules()) >= 7


def test_every_console_selector_has_a_caller():
    callers = _callers()
    unused = [
        f"{module.__name__}.{name}"
        for module in _page_modules()
        for name, value in vars(module).items()
        if inspect.isfunction(value)
        and value.__module__ == module.__name__
        and not name.startswith("_")
        and name not in callers
    ]
    assert unused == []
