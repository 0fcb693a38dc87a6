"""Every public read query of the console has a caller: a selector nobody calls is dead code
that still has to be kept right through every schema change."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import console.selectors

ROOT = Path(console.selectors.__file__).parent.parent
SELECTORS = Path(console.selectors.__file__)


def _callers() -> set[str]:
    """Names imported from console.selectors or read as `selectors.x` anywhere in the console
    (and the benchmarks), and names selectors.py itself calls."""
    used: set[str] = set()
    for path in [*(ROOT / "console").rglob("*.py"), *(ROOT / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "console.selectors":
                used |= {alias.name for alias in node.names}
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "selectors"
            ):
                used.add(node.attr)
            elif (
                path == SELECTORS and isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            ):
                used.add(node.func.id)
    return used


def test_every_console_selector_has_a_caller():
    callers = _callers()
    own = console.selectors.__name__
    unused = [
        name
        for name, value in vars(console.selectors).items()
        if inspect.isfunction(value)
        and value.__module__ == own
        and not name.startswith("_")
        and name not in callers
    ]
    assert unused == []
