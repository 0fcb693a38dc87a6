"""Where test helpers live: in tests/support (or a helper module beside its tests), never in
another test module — importing one couples two files' tests and hides a helper where nobody
looks for it. And tests reach the domain through its public services, as production does."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
IMPORTS_A_TEST_MODULE = re.compile(
    r"^\s*(from\s+(tests\.[\w.]*\.)?test_\w+\s+import|import\s+(tests\.[\w.]*\.)?test_\w+)", re.M
)
# Importing or calling a transition's private `_..._locked` half (which skips its lock and checks).
PRIVATE_TRANSITIONS = re.compile(
    r"^\s*from runs\.services[\w.]* import .*\b_\w+_locked\b|\b_\w+_locked\("
)


def _python_files() -> list[Path]:
    files = sorted(path for path in TESTS.rglob("*.py") if "node_modules" not in path.parts)
    assert len(files) > 100, "the walk found too few test files"
    return files


def test_no_test_module_imports_another() -> None:
    importing = [
        f"{path.relative_to(TESTS)}: {match.group(0).strip()}"
        for path in _python_files()
        for match in IMPORTS_A_TEST_MODULE.finditer(path.read_text())
    ]
    assert importing == [], "move the helper to tests/support:\n" + "\n".join(importing)


def test_no_test_calls_a_private_transition() -> None:
    this = Path(__file__).resolve()
    calling = [
        f"{path.relative_to(TESTS)}:{number}"
        for path in _python_files()
        if path != this
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if PRIVATE_TRANSITIONS.search(line)
    ]
    assert calling == [], "use a public service or tests.support.scenarios:\n" + "\n".join(calling)
