"""The agent package's own modules import one another one way only."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import safestop_agent

PACKAGE = Path(safestop_agent.__file__).parent


def _local_imports(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.module == "safestop_agent":
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("safestop_agent."):
            names.add((node.module or "").split(".")[1])
    return names


def _modules() -> dict[str, ast.Module]:
    return {
        path.stem: ast.parse(path.read_text(), filename=str(path))
        for path in sorted(PACKAGE.glob("*.py"))
        if path.stem != "__init__"
    }


def test_no_module_imports_one_that_imports_it_back() -> None:
    modules = _modules()
    # Every import counts, including the ones only type checkers follow.
    graph = {name: _local_imports(tree) & modules.keys() for name, tree in modules.items()}
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as error:  # pragma: no cover - the failure message is the point
        raise AssertionError(f"import cycle in safestop_agent: {error.args[1]}") from None
    assert order.index("wire") < order.index("worker") < order.index("client")


def test_no_package_import_hides_inside_a_function() -> None:
    for name, tree in _modules().items():
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                hidden = _local_imports(ast.Module(body=function.body, type_ignores=[]))
                assert not hidden, f"{name}.{function.name} imports {hidden} inside a function"
