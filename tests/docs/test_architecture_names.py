"""docs/ARCHITECTURE.md names files, modules and functions in backticks; every one must exist, so
the page cannot drift from the code (a renamed helper or a moved file fails here, not in a
newcomer's head).

What a backticked name must resolve to:
- a path (`runs/hooks.py`, `tests/faults/`): a file or folder relative to the repository, or,
  inside a row of the parts table (`| `console/` | ... |`), relative to that part's folder or
  one of its sub-folders (`views/`, `_base.py`);
- a path with an attribute (`views/common.act`): that module file defines the name;
- a dotted name (`runs.services.locked_run`, `handoff.apps.HandoffConfig.ready`): importable
  as module + attributes; or `module.attr` for a product module known by its last name
  (`_stop_sql.lock_run`); or `Class.attr` for a class a product module defines
  (`DomainError.for_run`); or a ledger action / frame type, which is a string literal in the
  product code (`stop.signal`, `run.updated`);
- a URL path (`/metrics`, `/api/`): one the project's URLconf answers;
- a library's name the page shortens (`transaction.on_commit`): `LIBRARY_NAMES` says which;
- a bare identifier (`stop_locked`, `stale_epoch`, `SAFESTOP_DRAIN_DEADLINE_SECONDS`): a word of
  the product code (a definition, a status value, an error code, a setting).
Anything else in backticks (SQL, commands, templates such as `run_<id>`) is prose, not checked.
"""

from __future__ import annotations

import ast
import functools
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
# The product: what the names in the page must be found in.
PACKAGES = (
    "console",
    "accounts",
    "api",
    "runs",
    "handoff",
    "notifications",
    "policies",
    "gateway",
    "safestop_agent",
)
SOURCE_DIRS = (*PACKAGES, "static", "templates", "deploy")
SOURCE_SUFFIXES = {".py", ".js", ".html", ".conf", ".css"}
FILE_SUFFIXES = (".py", ".js", ".md", ".conf", ".toml", ".html", ".css", ".json", ".yml")
# Backticked words that name something other than code, and are not found in it as such.
# The MCP protocol's own method names, which the gateway answers or sends (the SDK spells them).
# And the first word of a log line the page quotes (the format string carries more after it).
NOT_CODE: frozenset[str] = frozenset(
    {"initialize", "tools/call", "notifications/cancelled", "sso.refused"}
)
# Short names of the libraries' own API the page uses, and what they stand for (checked too).
LIBRARY_NAMES = {"transaction.on_commit": "django.db.transaction.on_commit"}

SPAN = re.compile(r"`([^`\n]+)`")
CODE_LIKE = re.compile(r"^[\w./-]+$")
DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
PART_ROW = re.compile(r"^\|\s*`([\w/]+/)`")


def _names() -> list[tuple[int, str, str | None]]:
    """(line number, name, the parts-table folder it is relative to, if any)."""
    found = []
    for number, line in enumerate(DOC.read_text().splitlines(), start=1):
        row = PART_ROW.match(line)
        base = row.group(1) if row else None
        for name in SPAN.findall(line):
            if CODE_LIKE.match(name) and not name.isdigit():
                found.append((number, name, base))
    return found


def _source_files() -> list[Path]:
    return [
        path
        for folder in SOURCE_DIRS
        for path in (ROOT / folder).rglob("*")
        if path.suffix in SOURCE_SUFFIXES and path.is_file() and "node_modules" not in path.parts
    ]


@functools.cache
def _source_text() -> str:
    return "\n".join(path.read_text(errors="replace") for path in _source_files())


@functools.cache
def _words() -> frozenset[str]:
    return frozenset(re.findall(r"\w+", _source_text()))


@functools.cache
def _string_literals() -> frozenset[str]:
    return frozenset(re.findall(r"""["']([\w.]+)["']""", _source_text()))


@functools.cache
def _modules() -> dict[str, list[str]]:
    """A product module's last name → its dotted names."""
    by_name: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            dotted = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            by_name.setdefault(dotted.rsplit(".", 1)[-1], []).append(dotted)
    return by_name


@functools.cache
def _top_level_definitions() -> dict[str, list[str]]:
    """A class or function a product module defines at its top level → those modules."""
    defined: dict[str, list[str]] = {}
    for modules in _modules().values():
        for module in modules:
            path = ROOT / Path(*module.split("."))
            path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
            tree = ast.parse(path.read_text())
            for node in tree.body:
                if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                    defined.setdefault(node.name, []).append(module)
    return defined


def _has_attributes(obj: object, attributes: list[str]) -> bool:
    for attribute in attributes:
        if not hasattr(obj, attribute):
            return False
        obj = getattr(obj, attribute)
    return True


def _import(module: str) -> object | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _dotted_exists(name: str) -> bool:
    parts = name.split(".")
    # 1. module + attributes, the longest importable module first
    for cut in range(len(parts), 0, -1):
        module = _import(".".join(parts[:cut])) if parts[0] in PACKAGES else None
        if module is not None:
            return _has_attributes(module, parts[cut:])
    # 2. a product module known by its last name (`_stop_sql.lock_run`)
    for dotted in _modules().get(parts[0], []):
        module = _import(dotted)
        if module is not None and _has_attributes(module, parts[1:]):
            return True
    # 3. a class or function of a product module (`DomainError.for_run`)
    for dotted in _top_level_definitions().get(parts[0], []):
        module = _import(dotted)
        if module is not None and _has_attributes(module, parts):
            return True
    # 4. a ledger action or frame type: a string the code writes
    return name in _string_literals()


def _defines(tree: ast.Module, attributes: list[str]) -> bool:
    """The module defines attributes[0] at its top level (and, for a class, the rest inside)."""
    body: list[ast.stmt] = tree.body
    for attribute in attributes:
        found = next((node for node in body if getattr(node, "name", None) == attribute), None)
        if found is None:
            return False
        body = found.body if isinstance(found, ast.ClassDef) else []
    return True


def _path_exists(name: str, base: str | None) -> bool:
    """A file or folder, or `file.attr[.attr]` (a module file that defines them)."""
    stem, attributes = name, []
    folder, _, last = name.rstrip("/").rpartition("/")
    if not name.endswith("/") and not name.endswith(FILE_SUFFIXES) and "." in last:
        module, *attributes = last.split(".")
        stem = f"{folder}/{module}.py" if folder else f"{module}.py"
    candidates = [ROOT / stem]
    if base is not None:
        candidates += [ROOT / base / stem, *(ROOT / base).rglob(stem.rstrip("/"))]
    for candidate in candidates:
        if not candidate.exists() or (name.endswith("/") and not candidate.is_dir()):
            continue
        if not attributes or _defines(ast.parse(candidate.read_text()), attributes):
            return True
    return False


def _url_exists(path: str) -> bool:
    from django.urls import Resolver404, resolve

    try:
        resolve(path)
    except Resolver404:
        return False
    return True


def _exists(name: str, base: str | None) -> bool:
    if name in NOT_CODE:
        return True
    if name in LIBRARY_NAMES:
        module, attribute = LIBRARY_NAMES[name].rsplit(".", 1)
        return hasattr(_import(module), attribute)
    if name.startswith("/"):
        return _url_exists(name)
    if "/" in name or name.endswith(FILE_SUFFIXES):
        return _path_exists(name, base)
    if DOTTED.match(name):
        return _dotted_exists(name)
    if IDENTIFIER.match(name):
        return name in _words()
    return True  # not a name (`0004`, `-`): prose


def test_the_page_names_things_in_backticks() -> None:
    names = _names()
    assert len(names) > 150, "the parser found too few names: has the page's format changed?"


@pytest.mark.parametrize(
    ("line", "name", "base"), _names(), ids=[f"{line}:{name}" for line, name, _ in _names()]
)
def test_every_name_architecture_md_gives_exists(line: int, name: str, base: str | None) -> None:
    assert _exists(name, base), f"docs/ARCHITECTURE.md line {line}: `{name}` names nothing"


@pytest.mark.parametrize(
    "name",
    [
        "runs/services/_lock_nothing.py",
        "views/common.no_such_view",
        "demo/scenarios.Context.no_such_method",
        "runs.services.no_such_service",
        "_stop_sql.no_such_step",
        "DomainError.no_such_constructor",
        "stop.no_such_frame",
        "_no_such_helper_anywhere",
        "tests/no_such_folder/",
        "/no-such-page/",
    ],
)
def test_a_name_that_is_not_in_the_code_is_caught(name: str) -> None:
    assert not _exists(name, "console/")
